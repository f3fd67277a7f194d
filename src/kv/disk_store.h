#pragma once
// The disk tier's storage: one file per span in a cache directory, surviving
// restarts. Every file is a span record (kv/span_record.h): its key, its
// namespace, its tokens and its tags (keyed with the deployment's key when it has one, so files planted
// by whoever else can write to the directory are refused); files are written to a temporary name, fsynced
// and renamed, so a crash leaves either the old state or the new one. A file that is forged, corrupt,
// truncated, foreign, of another shape or holds other tokens is dropped, counted by reason and reported as
// a miss — never served. The store keeps to a byte budget
// (oldest use first out) and removes leftovers of interrupted writes when it opens.
//
// Write-behind (write_behind()): put() takes the span and returns at once; a
// thread of the store's seals and writes it, so the caller (the index, under
// its lock) never waits on a disk. Until its file is written a span is held
// in memory, up to a byte limit (a put beyond it waits for room); reading a
// key still being written waits for its write. The store's bookkeeping
// (files, budget) changes only in its callers' calls, which the index makes
// under its lock: the writer thread touches the queue and the files only.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "kv/kv_span.h"
#include "kv/span_record.h"
#include "util/file_io.h"

namespace depcache {

class DiskSpanStore {
 public:
  // Creates the directory if needed; indexes the span files in it. key:
  // the deployment's MAC key (null: unkeyed checksums).
  DiskSpanStore(std::filesystem::path dir, size_t byte_budget, std::shared_ptr<const MacKey> key = nullptr);
  // Waits for the writes queued (write-behind).
  ~DiskSpanStore();
  DiskSpanStore(const DiskSpanStore&) = delete;
  DiskSpanStore& operator=(const DiskSpanStore&) = delete;
  // From now on put() writes behind, holding at most max_pending_bytes of
  // spans not yet written.
  void write_behind(size_t max_pending_bytes);
  // Waits until every queued write is done (a clean shutdown, a test).
  void flush();
  // Writes behind that failed (disk full, not writable): their spans are
  // not on disk, and a later get of the key is a miss (a direct put reports
  // its failure instead).
  int64_t n_write_failures() const;
  // The shape every span must have (the running model's); files of another
  // are refused from then on.
  void set_shape(const SpanShape& shape) { seal_.shape = shape; }
  const RecordSeal& seal() const { return seal_; }

  // Stores `span` for `tokens` under `key` (replacing what was there), then
  // evicts the least recently used files beyond the budget. `tokens` is the
  // whole sequence in namespace ns; the span holds all but its first
  // `prefix`. Returns false when the span alone exceeds the budget or the
  // write fails (disk full): nothing is stored then.
  // Writing behind, it returns true unless the span alone exceeds the
  // budget; a failed write then shows in n_write_failures().
  bool put(uint64_t key, uint64_t ns, std::span<const int32_t> tokens, int64_t prefix, KvSpan span);
  bool put(uint64_t key, std::span<const int32_t> tokens, KvSpan span) {
    return put(key, 0, tokens, 0, std::move(span));
  }
  // The span stored under `key` if its file is sound and holds exactly this
  // sequence; otherwise nullopt (a bad or foreign file is deleted).
  std::optional<KvSpan> get(uint64_t key, uint64_t ns, std::span<const int32_t> tokens, int64_t prefix);
  std::optional<KvSpan> get(uint64_t key, std::span<const int32_t> tokens) { return get(key, 0, tokens, 0); }

  // A span file opened to be read one layer at a time (Cache-Craft's
  // layer-wise preload): its head (header, tokens, positions, layer
  // checksums) was checked when opened. It owns the open file, so its layers
  // can be read on another thread while the store goes on, even after the
  // store has deleted the file.
  class LayerReader {
   public:
    int n_layer() const { return head_.span.n_layer(); }
    uint64_t key() const { return head_.header.key; }
    size_t layer_bytes() const { return head_.header.layer_bytes(); }
    // Reads layer il into span(); false when it cannot be read or does not
    // match its tag (the layer's K/V in span() is then not to be used).
    bool read_layer(int il);
    // The span: positions set; layer il's K/V once read_layer(il) is true.
    KvSpan& span() { return head_.span; }
    const KvSpan& span() const { return head_.span; }

   private:
    friend class DiskSpanStore;
    LayerReader(Fd fd, SpanRecordHead head, std::shared_ptr<const MacKey> key)
        : fd_(std::move(fd)), head_(std::move(head)), key_(std::move(key)) {}
    Fd fd_;
    SpanRecordHead head_;
    std::shared_ptr<const MacKey> key_;  // head_.mac's, kept alive with the reader
  };
  // The file of `key` opened for reading layer by layer, when its head is
  // sound and holds exactly this sequence; otherwise nullopt (a bad or
  // foreign file is deleted, as by get). Counts as a use of the file.
  std::optional<LayerReader> open_layers(uint64_t key, uint64_t ns, std::span<const int32_t> tokens,
                                         int64_t prefix);
  // Deletes a file found bad after it was opened (a layer that did not
  // match its tag), counted in n_dropped() and n_rejected(why).
  void drop(uint64_t key, RecordStatus why = RecordStatus::Mac);

  // What each file says it holds, from heads only (K/V is not read or
  // checked until get). Files whose head is unreadable, fails its tag or is
  // of another shape are deleted (and counted).
  struct StoredSpan {
    uint64_t key = 0, ns = 0;
    std::vector<int32_t> tokens;
    int64_t prefix = 0;
  };
  std::vector<StoredSpan> scan();
  // Bytes a file for this span would take (for callers keeping room).
  size_t file_bytes(int64_t n_tokens, const KvSpan& span) const {
    return span_record_bytes(n_tokens, span, key_ != nullptr);
  }
  bool contains(uint64_t key) const { return files_.count(key) > 0; }
  size_t file_bytes_of(uint64_t key) const {
    const auto it = files_.find(key);
    return it == files_.end() ? 0 : it->second.bytes;
  }
  void remove(uint64_t key);
  // Deletes every span file whose key is not in `live` (spans the index no
  // longer knows). Returns how many went.
  size_t remove_orphans(const std::unordered_set<uint64_t>& live);

  size_t bytes() const { return bytes_; }
  size_t n_files() const { return files_.size(); }
  size_t budget() const { return budget_; }
  int64_t n_dropped() const { return n_dropped_; }  // bad files found and deleted
  // Files refused, by reason (reject_index(RecordStatus)).
  int64_t n_rejected(int reason) const { return n_rejected_[reason]; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  struct Entry {
    size_t bytes = 0;
    std::list<uint64_t>::iterator lru;  // position in lru_ (front = oldest)
  };
  std::filesystem::path path_of(uint64_t key) const;
  void forget(uint64_t key, bool delete_file);
  void touch(uint64_t key);
  // Write-behind: a span waiting to be written, or being written.
  struct Write {
    uint64_t key = 0, ns = 0;
    std::vector<int32_t> tokens;
    int64_t prefix = 0;
    KvSpan span;
    bool cancelled = false;  // forgotten meanwhile: its file, once written, is deleted
  };
  // Seals the record (its tags) and writes it atomically; false when the
  // write failed. Touches no bookkeeping, so the writer thread can call it.
  bool write_record(uint64_t key, uint64_t ns, std::span<const int32_t> tokens, int64_t prefix,
                    const KvSpan& span) const;
  void write_loop();
  // Waits until `key` has no write queued or under way; false when its
  // write failed (its entry is then forgotten).
  bool settle(uint64_t key);

  mutable std::mutex write_mu_;  // guards writes_, pending_bytes_, failed_, stop_
  std::condition_variable write_cv_, written_cv_;
  std::deque<std::shared_ptr<Write>> writes_;                     // queued, oldest first
  std::shared_ptr<Write> writing_;                                // under way
  std::unordered_map<uint64_t, std::shared_ptr<Write>> pending_;  // by key: queued or under way
  size_t max_pending_bytes_ = 0;
  size_t pending_bytes_ = 0;
  // Keys whose write failed: their entries stay (the index still counts
  // them on disk) until read, which finds nothing.
  std::unordered_set<uint64_t> failed_;
  int64_t n_write_failures_ = 0;
  bool stop_ = false;
  std::thread writer_;

  std::filesystem::path dir_;
  size_t budget_;
  size_t bytes_ = 0;
  int64_t n_dropped_ = 0;
  int64_t n_rejected_[kRejectReasons] = {};
  std::shared_ptr<const MacKey> key_;
  RecordSeal seal_;
  std::unordered_map<uint64_t, Entry> files_;
  std::list<uint64_t> lru_;
};

}  // namespace depcache

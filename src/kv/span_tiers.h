#pragma once
// Where cached spans live, and what each tier holds: the hot tier (the
// memory the engine computes from, the role GPU memory plays in the papers),
// the host tier (memory under its own budget) and the disk tier (a
// DiskSpanStore, surviving restarts). It counts bytes against each tier's
// budget and carries out the moves between tiers with their I/O: promotion
// to the hot tier (a real copy from the host tier, a read from disk),
// demotion to host or disk (a write), removal. It knows spans, not the
// tree: the radix index decides which span moves when (its policy ranks the
// candidates), this class performs the move. Not locked: the index holds
// its lock around every call.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "kv/disk_store.h"
#include "kv/kv_span.h"
#include "kv/layer_loader.h"
#include "kv/policy.h"

namespace depcache {

// A node's span and where it is. A virtual slot (the simulator's) has a
// size and no K/V; in every tier it counts bytes_per_token per token. A real
// slot on disk holds no span in memory and counts its file's size.
struct SpanSlot {
  KvSpan span;
  int64_t n_tokens = 0;
  size_t bytes_per_token = 0;  // in memory
  Tier tier = Tier::Hot;
  uint64_t disk_key = 0;  // on disk: the file's key
  size_t disk_bytes = 0;  // on disk: the file's size
  // Swap-out-once (RAGCache): a hot slot's copy in the host tier, kept since
  // it was first swapped out, so evicting it again copies nothing. It
  // counts memory_bytes() in the host tier. (A virtual slot has the flag only.)
  KvSpan host_copy;
  bool has_host_copy = false;

  bool is_virtual() const { return span.n_tokens() == 0 && bytes_per_token > 0; }
  size_t memory_bytes() const { return static_cast<size_t>(n_tokens) * bytes_per_token; }
  // Bytes it counts in its tier.
  size_t tier_bytes() const { return disk_bytes + memory_bytes(); }
  // Splits off tokens [0, at) as a slot of their own (same tier); this one
  // keeps [at, n). Bytes are unchanged: tokens move, none are added.
  SpanSlot take_front(int64_t at);
};

class SpanTiers {
 public:
  static constexpr int kTiers = 4;  // Tier values; Remote holds no slots

  explicit SpanTiers(size_t hot_budget) { budget_[0] = hot_budget; }
  void attach_host(size_t budget, bool swap_out_once = false) {
    host_ = budget > 0;
    swap_out_once_ = host_ && swap_out_once;
    budget_[static_cast<int>(Tier::Host)] = budget;
  }
  bool swap_out_once() const { return swap_out_once_; }
  void attach_disk(DiskSpanStore& store) {
    disk_ = &store;
    budget_[static_cast<int>(Tier::Disk)] = store.budget();
  }
  DiskSpanStore* disk() const { return disk_; }

  size_t bytes(Tier t) const { return bytes_[static_cast<int>(t)]; }
  size_t budget(Tier t) const { return budget_[static_cast<int>(t)]; }
  void set_budget(Tier t, size_t b) { budget_[static_cast<int>(t)] = b; }
  bool over_budget(Tier t) const { return bytes(t) > budget(t); }
  // Where a span demoted from t goes; nullopt: out of the index.
  std::optional<Tier> below(Tier t) const;

  // Counts a new slot in its tier; uncounts one leaving (its disk file deleted).
  void add(const SpanSlot& s) { bytes_[static_cast<int>(s.tier)] += s.tier_bytes(); }
  void remove(SpanSlot& s);
  // Moves a slot to tier t, applying `change` to it in between, so its
  // bytes leave the old tier as they were and enter the new one as they are.
  void set_tier(SpanSlot& s, Tier t, const std::function<void(SpanSlot&)>& change = {});

  // Moves a hot slot to the host tier: a copy (host memory is another
  // device in the papers' setting), unless it kept its host copy. Returns
  // the bytes copied.
  size_t swap_out(SpanSlot& s);
  // Frees a hot slot's host copy (the slot stays hot).
  void drop_host_copy(SpanSlot& s);

  // Brings a slot to the hot tier. From the host tier under swap-out-once
  // the host copy stays. path: the sequence up to the slot's end,
  // starting `start` tokens before it (how its disk record is checked).
  // False when its disk file is missing or corrupt (the caller drops it).
  // *promoted_bytes: the bytes copied or read.
  bool promote(SpanSlot& s, uint64_t ns, std::span<const int32_t> path, int64_t start,
               int64_t* promoted_bytes);

  // A disk slot's file opened (its head read and checked), for its layers
  // to be read by whoever holds the reader, without the index's lock; then
  // adopt(). Nullopt when the slot is not a real one on disk, or its file is
  // missing or its head bad (the caller drops the slot).
  std::optional<DiskSpanStore::LayerReader> open_disk(const SpanSlot& s, uint64_t ns,
                                                      std::span<const int32_t> path, int64_t start);
  // Layer-wise preload: starts reading a disk slot's file layer by layer,
  // its first preload(layers in the file) before returning; the slot stays on disk
  // until adopt(). Null when the file is missing or its head is bad (the
  // caller drops the slot).
  std::shared_ptr<LayerLoader> start_layered(const SpanSlot& s, uint64_t ns, std::span<const int32_t> path,
                                             int64_t start, const std::function<int(int n_layer)>& preload);
  // The span a layered load read becomes the slot's (hot tier, file
  // removed). False, nothing changed, when the slot is no longer on disk
  // under that file or the span does not fit it.
  bool adopt(SpanSlot& s, uint64_t disk_key, KvSpan span, int64_t* promoted_bytes);

  // The size of the slot's disk file, once written.
  size_t disk_file_bytes(const SpanSlot& s, int64_t path_tokens) const {
    return disk_ ? disk_->file_bytes(path_tokens, s.span) : span_record_bytes(path_tokens, s.span, false);
  }
  // Writes a real slot to disk and moves it there (its span leaves memory;
  // the store may write it behind); false when the store would not take it
  // (full, not writable): the slot's span is then gone and the caller drops
  // it. A virtual slot just changes tier.
  bool write_to_disk(SpanSlot& s, uint64_t ns, std::span<const int32_t> path, int64_t start);

 private:
  size_t budget_[kTiers] = {};
  size_t bytes_[kTiers] = {};
  bool host_ = false;
  bool swap_out_once_ = false;
  DiskSpanStore* disk_ = nullptr;
};

}  // namespace depcache

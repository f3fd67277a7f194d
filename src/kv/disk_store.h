#pragma once
// The disk tier's storage: one file per span in a cache directory, surviving
// restarts. Every file carries its key, its tokens and a checksum of its
// contents; files are written to a temporary name, fsynced and renamed, so a
// crash leaves either the old state or the new one. A file that is corrupt,
// truncated, foreign or holds other tokens is dropped and reported as a
// miss — never served. The store keeps to a byte budget (oldest use first
// out) and removes leftovers of interrupted writes when it opens.
#include <cstdint>
#include <filesystem>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "kv/kv_span.h"

namespace depcache {

class DiskSpanStore {
 public:
  // Creates the directory if needed; indexes the span files in it.
  DiskSpanStore(std::filesystem::path dir, size_t byte_budget);

  // Stores `span` for `tokens` under `key` (replacing what was there), then
  // evicts the least recently used files beyond the budget. Returns false
  // when the span alone exceeds the budget (nothing is written).
  bool put(uint64_t key, std::span<const int32_t> tokens, const KvSpan& span);
  // The span stored under `key` if its file is sound and holds exactly
  // `tokens`; otherwise nullopt (a bad file is deleted).
  std::optional<KvSpan> get(uint64_t key, std::span<const int32_t> tokens);
  bool contains(uint64_t key) const { return files_.count(key) > 0; }
  void remove(uint64_t key);
  // Deletes every span file whose key is not in `live` (spans the index no
  // longer knows). Returns how many went.
  size_t remove_orphans(const std::unordered_set<uint64_t>& live);

  size_t bytes() const { return bytes_; }
  size_t n_files() const { return files_.size(); }
  size_t budget() const { return budget_; }
  int64_t n_dropped() const { return n_dropped_; }  // bad files found and deleted
  const std::filesystem::path& dir() const { return dir_; }

 private:
  struct Entry {
    size_t bytes = 0;
    std::list<uint64_t>::iterator lru;  // position in lru_ (front = oldest)
  };
  std::filesystem::path path_of(uint64_t key) const;
  void forget(uint64_t key, bool delete_file);
  void touch(uint64_t key);

  std::filesystem::path dir_;
  size_t budget_;
  size_t bytes_ = 0;
  int64_t n_dropped_ = 0;
  std::unordered_map<uint64_t, Entry> files_;
  std::list<uint64_t> lru_;
};

}  // namespace depcache

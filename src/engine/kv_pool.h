#pragma once
// One KV assembly shared by every running sequence. Each sequence holds one
// contiguous block of rows (its prompt and the tokens it may still
// generate), handed out first-fit from a list of free extents, so its
// visibility is its own assembly's shifted by the block's first row. A block
// is a RowBlock, returned to the pool when it is destroyed; a request whose
// block does not fit waits (allocate says so), it is never an error.
#include <cstdint>
#include <map>
#include <optional>

#include "engine/kv_cache.h"

namespace depcache {

class KvPool;

class RowBlock {
 public:
  RowBlock() = default;
  RowBlock(RowBlock&& o) noexcept { *this = std::move(o); }
  RowBlock& operator=(RowBlock&& o) noexcept;
  ~RowBlock() { reset(); }
  void reset();  // back to the pool
  int64_t row0() const { return row0_; }
  int64_t n_rows() const { return n_; }
  explicit operator bool() const { return pool_ != nullptr; }

 private:
  friend class KvPool;
  RowBlock(KvPool* pool, int64_t row0, int64_t n) : pool_(pool), row0_(row0), n_(n) {}
  KvPool* pool_ = nullptr;
  int64_t row0_ = 0, n_ = 0;
};

class KvPool {
 public:
  KvPool(const ModelConfig& config, int64_t n_rows, DType type);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // A free block of n rows, or nullopt when no free extent is that long.
  std::optional<RowBlock> allocate(int64_t n);
  KvCache& kv() { return kv_; }
  const KvCache& kv() const { return kv_; }
  int64_t n_rows() const { return kv_.n_ctx(); }
  int64_t n_free() const { return n_free_; }
  int64_t largest_free() const;
  // Free extents sorted, disjoint, merged with their neighbours; free + held
  // rows = all rows. Throws Error(Internal) otherwise (for tests).
  void check_invariants() const;

 private:
  friend class RowBlock;
  void release(int64_t row0, int64_t n);

  KvCache kv_;
  std::map<int64_t, int64_t> free_;  // first row -> rows
  int64_t n_free_ = 0;
};

}  // namespace depcache

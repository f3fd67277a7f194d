#pragma once
// One KV assembly shared by every running sequence. Each sequence holds one
// contiguous block of rows, so its visibility is its own assembly's shifted
// by the block's first row. A block is a RowBlock, returned to the pool when
// it is destroyed. Blocks start at the prompt plus a few rows to decode into
// and grow as the sequence generates: in place when the rows after them are
// free, otherwise the pool moves rows (the block itself, or every block
// towards row 0 when only scattered rows are free). Moving is a copy:
// keys carry their RoPE rotation with them, and a block's first row is read
// again at every step. When fewer rows are free than a request needs, it
// waits (allocate and grow say so); the engine decides whom to preempt.
#include <cstdint>
#include <map>
#include <optional>

#include "exec/kv_assembly.h"

namespace depcache {

class KvPool;

class RowBlock {
 public:
  RowBlock() = default;
  RowBlock(RowBlock&& o) noexcept { *this = std::move(o); }
  RowBlock& operator=(RowBlock&& o) noexcept;
  ~RowBlock() { reset(); }
  void reset();  // back to the pool
  int64_t row0() const;
  int64_t n_rows() const;
  explicit operator bool() const { return pool_ != nullptr; }

 private:
  friend class KvPool;
  RowBlock(KvPool* pool, int64_t id) : pool_(pool), id_(id) {}
  KvPool* pool_ = nullptr;
  int64_t id_ = 0;
};

class KvPool {
 public:
  KvPool(const ModelConfig& config, int64_t n_rows, DType type);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // A block of n rows, or nullopt when fewer than n rows are free. Scattered
  // free rows are gathered by compaction first.
  std::optional<RowBlock> allocate(int64_t n);
  // Makes `block` n rows long (never shorter), its rows' contents kept;
  // false (and nothing changed) when fewer than n - block.n_rows() rows are free.
  bool grow(RowBlock& block, int64_t n);
  KvAssembly& kv() { return kv_; }
  const KvAssembly& kv() const { return kv_; }
  int64_t n_rows() const { return kv_.n_ctx(); }
  int64_t n_free() const { return n_free_; }
  int64_t largest_free() const;
  int64_t n_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t moved_rows() const { return moved_rows_; }  // copied by grow and compaction so far
  // Free extents sorted, disjoint, merged with their neighbours; blocks
  // disjoint from them and each other; free + held rows = all rows. Throws
  // Error(Internal) otherwise (for tests).
  void check_invariants() const;

 private:
  friend class RowBlock;
  struct Extent {
    int64_t row0 = 0, n = 0;
  };
  void release(int64_t id);
  void free_rows(int64_t row0, int64_t n);
  std::optional<int64_t> take_free(int64_t n);                // first fit
  KvSpan extract(const Extent& block) const;                  // its rows, with their positions
  void place(const KvSpan& rows, Extent& block, int64_t to);  // them, at row `to`
  void move(Extent& block, int64_t to);
  // Moves every block towards row 0 in order (`last`, if any, after all the
  // others), leaving the free rows as one extent at the end.
  void compact(int64_t last = -1);

  KvAssembly kv_;
  std::map<int64_t, int64_t> free_;   // first row -> rows
  std::map<int64_t, Extent> blocks_;  // block id -> rows
  int64_t next_id_ = 1;
  int64_t n_free_ = 0;
  int64_t moved_rows_ = 0;
};

}  // namespace depcache

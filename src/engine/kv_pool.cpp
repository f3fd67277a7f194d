#include "engine/kv_pool.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "util/error.h"

namespace depcache {

RowBlock& RowBlock::operator=(RowBlock&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = o.pool_, id_ = o.id_;
    o.pool_ = nullptr;
  }
  return *this;
}

void RowBlock::reset() {
  if (pool_) pool_->release(id_);
  pool_ = nullptr;
}

int64_t RowBlock::row0() const { return pool_ ? pool_->blocks_.at(id_).row0 : 0; }
int64_t RowBlock::n_rows() const { return pool_ ? pool_->blocks_.at(id_).n : 0; }

KvPool::KvPool(const ModelConfig& config, int64_t n_rows, DType type) : kv_(config, n_rows, type) {
  free_.emplace(0, n_rows);
  n_free_ = n_rows;
  kv_.set_n_past(n_rows);  // rows are addressed directly; n_past is not a sequence's length here
}

std::optional<int64_t> KvPool::take_free(int64_t n) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const int64_t row0 = it->first, left = it->second - n;
    free_.erase(it);
    if (left > 0) free_.emplace(row0 + n, left);
    n_free_ -= n;
    return row0;
  }
  return std::nullopt;
}

std::optional<RowBlock> KvPool::allocate(int64_t n) {
  if (n <= 0) fail(ErrorKind::Internal, "KV pool: a block of {} rows", n);
  if (n > n_free_) return std::nullopt;
  std::optional<int64_t> row0 = take_free(n);
  if (!row0) {
    compact();
    row0 = take_free(n);
  }
  const int64_t id = next_id_++;
  blocks_.emplace(id, Extent{*row0, n});
  return RowBlock(this, id);
}

bool KvPool::grow(RowBlock& block, int64_t n) {
  if (block.pool_ != this) fail(ErrorKind::Internal, "KV pool: growing a block of another pool");
  Extent& b = blocks_.at(block.id_);
  const int64_t extra = n - b.n;
  if (extra <= 0) return true;
  if (extra > n_free_) return false;
  auto next = free_.find(b.row0 + b.n);
  if (next == free_.end() || next->second < extra) {
    // Elsewhere: a free extent of the whole new length, else the end of the
    // compacted pool (the block moved last, so every free row follows it).
    if (const std::optional<int64_t> to = take_free(n)) {
      const int64_t from = b.row0, old = b.n;
      move(b, *to);
      b.n = n;
      free_rows(from, old);
      return true;
    }
    compact(block.id_);
    next = free_.find(b.row0 + b.n);
  }
  // In place: into the free extent right after the block.
  const int64_t row0 = next->first, left = next->second - extra;
  free_.erase(next);
  if (left > 0) free_.emplace(row0 + extra, left);
  n_free_ -= extra;
  b.n = n;
  return true;
}

KvSpan KvPool::extract(const Extent& block) const {
  std::vector<int64_t> rows(block.n);
  std::iota(rows.begin(), rows.end(), block.row0);
  return kv_.extract(rows);
}

void KvPool::move(Extent& block, int64_t to) {
  if (block.row0 != to) place(extract(block), block, to);
}

void KvPool::place(const KvSpan& rows, Extent& block, int64_t to) {
  // Same positions: place copies the keys as they are, no rotation.
  kv_.place(rows, 0, block.n, to, rows.positions());
  block.row0 = to;
  moved_rows_ += block.n;
}

void KvPool::compact(int64_t last) {
  std::vector<Extent*> order;
  for (auto& [id, b] : blocks_)
    if (id != last) order.push_back(&b);
  std::sort(order.begin(), order.end(), [](const Extent* a, const Extent* b) { return a->row0 < b->row0; });
  if (last >= 0) order.push_back(&blocks_.at(last));
  // `last` may sit below blocks that slide over it: keep its rows aside.
  const KvSpan kept = last >= 0 ? extract(blocks_.at(last)) : KvSpan();
  int64_t end = 0;
  for (Extent* b : order) {
    if (last >= 0 && b == order.back())
      place(kept, *b, end);
    else
      move(*b, end);  // downwards only, one block at a time
    end += b->n;
  }
  free_.clear();
  if (n_free_ > 0) free_.emplace(end, n_free_);
}

void KvPool::release(int64_t id) {
  const auto it = blocks_.find(id);
  if (it == blocks_.end()) fail(ErrorKind::Internal, "KV pool: block {} released twice", id);
  free_rows(it->second.row0, it->second.n);
  blocks_.erase(it);
}

void KvPool::free_rows(int64_t row0, int64_t n) {
  auto [it, fresh] = free_.emplace(row0, n);
  if (!fresh) fail(ErrorKind::Internal, "KV pool: rows {} released twice", row0);
  n_free_ += n;
  if (const auto next = std::next(it); next != free_.end() && row0 + n == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    const auto prev = std::prev(it);
    if (prev->first + prev->second == row0) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

int64_t KvPool::largest_free() const {
  int64_t m = 0;
  for (const auto& [row0, n] : free_) m = std::max(m, n);
  return m;
}

void KvPool::check_invariants() const {
  std::vector<std::pair<int64_t, int64_t>> extents;  // (row0, n), free and held
  int64_t free_total = 0;
  for (const auto& [row0, n] : free_) {
    extents.emplace_back(row0, n);
    free_total += n;
  }
  for (const auto& [row0, n] : free_)
    if (const auto next = free_.upper_bound(row0); next != free_.end() && row0 + n == next->first)
      fail(ErrorKind::Internal, "KV pool: free extents at {} and {} not merged", row0, next->first);
  if (free_total != n_free_)
    fail(ErrorKind::Internal, "KV pool: {} rows free, {} counted", free_total, n_free_);
  int64_t held = 0;
  for (const auto& [id, b] : blocks_) {
    extents.emplace_back(b.row0, b.n);
    held += b.n;
  }
  std::sort(extents.begin(), extents.end());
  int64_t end = 0;
  for (const auto& [row0, n] : extents) {
    if (n <= 0 || row0 < end || row0 + n > n_rows())
      fail(ErrorKind::Internal, "KV pool: extent {}+{} overlaps another or leaves the pool", row0, n);
    end = row0 + n;
  }
  if (free_total + held != n_rows())
    fail(ErrorKind::Internal, "KV pool: {} free + {} held rows, not {}", free_total, held, n_rows());
}

}  // namespace depcache

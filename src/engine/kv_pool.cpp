#include "engine/kv_pool.h"

#include "util/error.h"

namespace depcache {

RowBlock& RowBlock::operator=(RowBlock&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = o.pool_, row0_ = o.row0_, n_ = o.n_;
    o.pool_ = nullptr;
  }
  return *this;
}

void RowBlock::reset() {
  if (pool_) pool_->release(row0_, n_);
  pool_ = nullptr;
}

KvPool::KvPool(const ModelConfig& config, int64_t n_rows, DType type) : kv_(config, n_rows, type) {
  free_.emplace(0, n_rows);
  n_free_ = n_rows;
  kv_.set_n_past(n_rows);  // rows are addressed directly; n_past is not a sequence's length here
}

std::optional<RowBlock> KvPool::allocate(int64_t n) {
  if (n <= 0) fail(ErrorKind::Internal, "KV pool: a block of {} rows", n);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const int64_t row0 = it->first, left = it->second - n;
    free_.erase(it);
    if (left > 0) free_.emplace(row0 + n, left);
    n_free_ -= n;
    return RowBlock(this, row0, n);
  }
  return std::nullopt;
}

void KvPool::release(int64_t row0, int64_t n) {
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
  int64_t total = 0, end = -1;
  for (const auto& [row0, n] : free_) {
    if (n <= 0 || row0 < 0 || row0 + n > n_rows())
      fail(ErrorKind::Internal, "KV pool: free extent {}+{} out of range", row0, n);
    if (row0 <= end) fail(ErrorKind::Internal, "KV pool: free extents overlap or touch at row {}", row0);
    end = row0 + n;
    total += n;
  }
  if (total != n_free_) fail(ErrorKind::Internal, "KV pool: {} rows free, {} counted", total, n_free_);
}

}  // namespace depcache

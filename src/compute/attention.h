#pragma once
// Scaled dot-product attention of query rows against a KV store, where each
// query sees a list of KV row ranges. Computed with an online softmax over
// key blocks: no score matrix or n×n mask is materialised, and the work is
// proportional to the number of visible (query, key) pairs.
#include <cstdint>
#include <span>
#include <vector>

#include "compute/dtype.h"

namespace depcache {

class ThreadPool;

// One layer's stored K/V rows (compute/kv_format.h): F32, F16 or Q8_0, read
// in place by the kernels (a Q8_0 head slice is widened block by block).
struct KvLayerView {
  const void* k = nullptr;  // (n_rows, n_head_kv*head_dim)
  const void* v = nullptr;  // same layout as k
  DType type = DType::F32;
  size_t row_bytes = 0;  // bytes between consecutive rows
};

// Half-open range of KV rows.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const RowRange&) const = default;
};

// Queries [first, first + count) of a batch sharing one visibility list:
// query first + i sees every row of `context` and, causally inside its own
// run, rows [causal_begin, self_row + i + 1), where self_row is the KV row of
// the group's first query (the group's queries sit in consecutive rows).
struct QueryGroup {
  int64_t first = 0;
  int64_t count = 0;
  std::vector<RowRange> context;  // sorted, disjoint, all ending at or before causal_begin
  int64_t causal_begin = 0;
  int64_t self_row = 0;
};

// Visibility of every query of a batch, as groups covering [0, n_queries).
class Visibility {
 public:
  Visibility() = default;
  explicit Visibility(std::vector<QueryGroup> groups);  // validates; throws Error(Internal)

  const std::vector<QueryGroup>& groups() const { return groups_; }
  int64_t n_queries() const { return static_cast<int64_t>(group_of_.size()); }
  const QueryGroup& group_of(int64_t query) const { return groups_[group_of_[query]]; }
  // The ranges query `query` sees (context, then its causal run).
  std::vector<RowRange> visible(int64_t query) const;
  int64_t n_visible(int64_t query) const;       // rows it sees
  int64_t n_pairs() const { return n_pairs_; }  // visible (query, key) pairs
  int64_t max_row() const { return max_row_; }  // one past the largest row seen

 private:
  std::vector<QueryGroup> groups_;
  std::vector<int32_t> group_of_;
  std::vector<int64_t> context_rows_;  // per group
  int64_t n_pairs_ = 0;
  int64_t max_row_ = 0;
};

// q: (n_q, n_head*head_dim); row r is batch query ids[r] (or r when ids is
// empty). out: same shape. GQA: query head h reads KV head h / (n_head / n_head_kv).
// softcap > 0 bounds each scaled score s as softcap * tanh(s / softcap) (Gemma 2).
void attention(const float* q, int64_t n_q, std::span<const int64_t> ids, const Visibility& vis,
               const KvLayerView& kv, int n_head, int n_head_kv, int head_dim, float* out, ThreadPool& pool,
               float softcap = 0);

// One layer's keys as attention_mass reads them: each KV head's first
// n_rows keys in fp32, in blocks of 16 keys stored by dimension (a block's
// last keys past n_rows zero), so that one vector load holds a dimension of
// consecutive keys and a block is one run of memory. Made once per layer
// for every query scored.
struct MassKeys {
  int64_t n_rows = 0;
  int n_head_kv = 0, head_dim = 0;
  std::vector<float> t;  // [kv head][block][dim][16]
};
void mass_keys(const KvLayerView& kv, int64_t n_rows, int n_head_kv, int head_dim, MassKeys& out);

// Softmax attention mass of one query row onto each of `targets`, averaged
// over heads, given the ranges it sees (ascending, below keys.n_rows).
// Targets must be disjoint; mass outside every target is not reported (the
// values sum to at most 1). A NaN score makes every mass NaN.
std::vector<double> attention_mass(const float* q_row, std::span<const RowRange> visible,
                                   std::span<const RowRange> targets, const MassKeys& keys, int n_head,
                                   float softcap = 0);
// The same, making the keys it needs.
std::vector<double> attention_mass(const float* q_row, std::span<const RowRange> visible,
                                   std::span<const RowRange> targets, const KvLayerView& kv, int n_head,
                                   int n_head_kv, int head_dim, float softcap = 0);

}  // namespace depcache

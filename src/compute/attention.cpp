#include "compute/attention.h"

#include <algorithm>
#include <cmath>

#include "compute/vec.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

constexpr int64_t kKeyBlock = 64;
constexpr int64_t kQueryBlock = 8;

// Running state of an online softmax for one query head.
struct SoftmaxState {
  float m = -INFINITY;  // largest score so far
  float l = 0;          // sum of exp(score - m)
};

template <typename T>
void attend_range(const float* q, const T* k, const T* v, int64_t stride, int64_t begin, int64_t end,
                  int head_dim, float scale, float* out, float* scores, SoftmaxState& s) {
  for (int64_t j0 = begin; j0 < end; j0 += kKeyBlock) {
    const int64_t nb = std::min(kKeyBlock, end - j0);
    float bm = -INFINITY;
    for (int64_t j = 0; j < nb; ++j) {
      scores[j] = vec::dot(k + (j0 + j) * stride, q, head_dim) * scale;
      bm = std::fmax(bm, scores[j]);
    }
    const float m_new = std::fmax(s.m, bm);
    const float corr = std::exp(s.m - m_new);  // 0 on the first block (m = -inf)
    s.l *= corr;
    vec::scale(out, corr, head_dim);
    for (int64_t j = 0; j < nb; ++j) {
      const float p = std::exp(scores[j] - m_new);
      s.l += p;
      vec::axpy(out, p, v + (j0 + j) * stride, head_dim);
    }
    s.m = m_new;
  }
}

template <typename T>
void attend_query(const float* q, const KvLayerView& kv, int64_t kv_off, const QueryGroup& g, int64_t i,
                  int head_dim, float scale, float* out, float* scores) {
  const T* k = static_cast<const T*>(kv.k) + kv_off;
  const T* v = static_cast<const T*>(kv.v) + kv_off;
  SoftmaxState s;
  std::fill(out, out + head_dim, 0.0f);
  for (const RowRange& r : g.context)
    attend_range(q, k, v, kv.row_stride, r.begin, r.end, head_dim, scale, out, scores, s);
  attend_range(q, k, v, kv.row_stride, g.causal_begin, g.self_row + i + 1, head_dim, scale, out, scores, s);
  if (s.l > 0) vec::scale(out, 1.0f / s.l, head_dim);
}

}  // namespace

Visibility::Visibility(std::vector<QueryGroup> groups) : groups_(std::move(groups)) {
  int64_t next = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const QueryGroup& g = groups_[gi];
    if (g.first != next || g.count <= 0)
      fail(ErrorKind::Internal, "visibility group {} covers queries [{}, {}) after query {}", gi, g.first,
           g.first + g.count, next);
    if (g.causal_begin < 0 || g.causal_begin > g.self_row)
      fail(ErrorKind::Internal,
           "visibility group {}: causal run starts at row {} after its first query row {}", gi,
           g.causal_begin, g.self_row);
    int64_t context_rows = 0, prev_end = 0;
    for (const RowRange& r : g.context) {
      if (r.begin < prev_end || r.end < r.begin || r.end > g.causal_begin)
        fail(ErrorKind::Internal,
             "visibility group {}: context range [{}, {}) is unsorted, overlapping or not "
             "before the causal run at {}",
             gi, r.begin, r.end, g.causal_begin);
      context_rows += r.size();
      prev_end = r.end;
    }
    // Query i sees context_rows + (self_row - causal_begin) + i + 1 rows.
    const int64_t own = g.self_row - g.causal_begin;
    n_pairs_ += g.count * (context_rows + own) + g.count * (g.count + 1) / 2;
    max_row_ = std::max(max_row_, g.self_row + g.count);
    context_rows_.push_back(context_rows);
    next += g.count;
    group_of_.insert(group_of_.end(), g.count, static_cast<int32_t>(gi));
  }
}

std::vector<RowRange> Visibility::visible(int64_t query) const {
  const QueryGroup& g = group_of(query);
  std::vector<RowRange> out = g.context;
  out.push_back({g.causal_begin, g.self_row + (query - g.first) + 1});
  return out;
}

int64_t Visibility::n_visible(int64_t query) const {
  const int32_t gi = group_of_[query];
  const QueryGroup& g = groups_[gi];
  return context_rows_[gi] + (g.self_row - g.causal_begin) + (query - g.first) + 1;
}

void attention(const float* q, int64_t n_q, std::span<const int64_t> ids, const Visibility& vis,
               const KvLayerView& kv, int n_head, int n_head_kv, int head_dim, float* out, ThreadPool& pool) {
  if (!ids.empty() && static_cast<int64_t>(ids.size()) != n_q)
    fail(ErrorKind::Internal, "attention: {} query ids for {} query rows", ids.size(), n_q);
  const int group = n_head / n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t n_qblocks = (n_q + kQueryBlock - 1) / kQueryBlock;
  const int64_t q_stride = int64_t{n_head} * head_dim;
  pool.parallel_for(n_head * n_qblocks, [&](int64_t task, int) {
    const int h = static_cast<int>(task % n_head);
    const int64_t r0 = (task / n_head) * kQueryBlock;
    const int64_t r1 = std::min(n_q, r0 + kQueryBlock);
    const int64_t kv_off = int64_t{h / group} * head_dim;
    float scores[kKeyBlock];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t id = ids.empty() ? r : ids[r];
      const QueryGroup& g = vis.group_of(id);
      const float* qr = q + r * q_stride + int64_t{h} * head_dim;
      float* o = out + r * q_stride + int64_t{h} * head_dim;
      if (kv.f16)
        attend_query<uint16_t>(qr, kv, kv_off, g, id - g.first, head_dim, scale, o, scores);
      else
        attend_query<float>(qr, kv, kv_off, g, id - g.first, head_dim, scale, o, scores);
    }
  });
}

std::vector<double> attention_mass(const float* q_row, std::span<const RowRange> visible,
                                   std::span<const RowRange> targets, const KvLayerView& kv, int n_head,
                                   int n_head_kv, int head_dim) {
  const int group = n_head / n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<double> mass(targets.size(), 0.0);
  std::vector<float> scores;
  std::vector<int64_t> rows;
  for (const RowRange& r : visible)
    for (int64_t j = r.begin; j < r.end; ++j) rows.push_back(j);
  for (int h = 0; h < n_head; ++h) {
    const float* q = q_row + int64_t{h} * head_dim;
    const int64_t kv_off = int64_t{h / group} * head_dim;
    scores.resize(rows.size());
    float m = -INFINITY;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t off = rows[i] * kv.row_stride + kv_off;
      if (kv.f16)
        scores[i] = vec::dot(static_cast<const uint16_t*>(kv.k) + off, q, head_dim) * scale;
      else
        scores[i] = vec::dot(static_cast<const float*>(kv.k) + off, q, head_dim) * scale;
      m = std::fmax(m, scores[i]);
    }
    double total = 0;
    for (float& s : scores) total += (s = std::exp(s - m));
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t t = 0; t < targets.size(); ++t)
        if (rows[i] >= targets[t].begin && rows[i] < targets[t].end) mass[t] += scores[i] / total;
  }
  for (double& x : mass) x /= n_head;
  return mass;
}

}  // namespace depcache

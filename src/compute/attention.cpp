#include "compute/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "compute/vec.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

constexpr int64_t kKeyBlock = 64;
constexpr int64_t kQueryBlock = 8;

template <typename T>
void attend_one(const float* q, const T* k, const T* v, int64_t stride, int64_t n_keys, int head_dim,
                float scale, float* out, float* scores) {
  float m = -INFINITY;
  float l = 0;
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t j0 = 0; j0 < n_keys; j0 += kKeyBlock) {
    const int64_t nb = std::min(kKeyBlock, n_keys - j0);
    float bm = -INFINITY;
    for (int64_t j = 0; j < nb; ++j) {
      scores[j] = vec::dot(k + (j0 + j) * stride, q, head_dim) * scale;
      bm = std::fmax(bm, scores[j]);
    }
    const float m_new = std::fmax(m, bm);
    const float corr = std::exp(m - m_new);  // 0 on the first block (m = -inf)
    l *= corr;
    vec::scale(out, corr, head_dim);
    for (int64_t j = 0; j < nb; ++j) {
      const float p = std::exp(scores[j] - m_new);
      l += p;
      vec::axpy(out, p, v + (j0 + j) * stride, head_dim);
    }
    m = m_new;
  }
  if (l > 0) vec::scale(out, 1.0f / l, head_dim);
}

}  // namespace

void attention(const float* q, int64_t n_tokens, const KvLayerView& kv, const int64_t* n_visible, int n_head,
               int n_head_kv, int head_dim, float* out, ThreadPool& pool) {
  const int group = n_head / n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t n_qblocks = (n_tokens + kQueryBlock - 1) / kQueryBlock;
  const int64_t q_stride = int64_t{n_head} * head_dim;
  pool.parallel_for(n_head * n_qblocks, [&](int64_t task, int) {
    const int h = static_cast<int>(task % n_head);
    const int64_t t0 = (task / n_head) * kQueryBlock;
    const int64_t t1 = std::min(n_tokens, t0 + kQueryBlock);
    const int64_t kv_off = int64_t{h / group} * head_dim;
    float scores[kKeyBlock];
    for (int64_t t = t0; t < t1; ++t) {
      const float* qt = q + t * q_stride + int64_t{h} * head_dim;
      float* ot = out + t * q_stride + int64_t{h} * head_dim;
      if (kv.f16)
        attend_one(qt, static_cast<const uint16_t*>(kv.k) + kv_off,
                   static_cast<const uint16_t*>(kv.v) + kv_off, kv.row_stride, n_visible[t], head_dim, scale,
                   ot, scores);
      else
        attend_one(qt, static_cast<const float*>(kv.k) + kv_off, static_cast<const float*>(kv.v) + kv_off,
                   kv.row_stride, n_visible[t], head_dim, scale, ot, scores);
    }
  });
}

}  // namespace depcache

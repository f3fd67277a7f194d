#include "compute/attention.h"

#include <algorithm>
#include <cmath>

#include "compute/vec.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

constexpr int64_t kKeyBlock = 64;
constexpr int kLanes = 8;       // one AVX2 vector of (query, head) pairs
constexpr int kMaxVectors = 8;  // pairs per task: up to 64

// e^x for every lane, x <= 0 (scores minus their running maximum), with a
// relative error of a few ulp; lanes below -87.3 (or -inf) give exactly 0.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_GE_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  // x = n ln2 + r, |r| <= ln2 / 2; ln2 split in two for an exact n ln2.
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-06f), r);
  // Taylor series to r^7 (truncation < 1e-8 relative on |r| <= 0.347).
  __m256 p = _mm256_set1_ps(1.f / 5040);
  for (float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

// The (query, head) pairs of one task: queries of one visibility group and
// the query heads of one KV head. Each pair is a vector lane and every lane
// runs the same operations in the same order whatever the other lanes hold,
// so a query's result does not depend on how the batch was cut into tasks.
struct LaneSet {
  int n = 0;
  int64_t row[kLanes * kMaxVectors];  // row of q and out
  int head[kLanes * kMaxVectors];     // query head
  int32_t end[kLanes * kMaxVectors];  // one past the last row of its causal run
};

struct TileScratch {
  std::vector<float> qt, kf, vf, p, ot;
};

template <typename T>
void widen_rows(const T* src, int64_t stride, int64_t n, int d, float* dst) {
  for (int64_t j = 0; j < n; ++j)
    for (int i = 0; i < d; i += 8) {
      if (i + 8 <= d)
        _mm256_storeu_ps(dst + j * d + i, vec::load8(src + j * stride + i));
      else
        for (int t = i; t < d; ++t) dst[j * d + t] = vec::load1(src + j * stride + t);
    }
}

// Online softmax over key blocks for up to 64 lanes. Q (scaled) and the
// output are kept transposed, [vector][dim][lane], so scores and outputs are
// plain vector FMAs with a broadcast key or value element.
template <typename T, int NV>
void attend_lanes(const LaneSet& ls, const float* q, int64_t q_stride, const KvLayerView& kv, int64_t kv_off,
                  const QueryGroup& g, int d, float scale, float* out, TileScratch& s) {
  const T* k = static_cast<const T*>(kv.k) + kv_off;
  const T* v = static_cast<const T*>(kv.v) + kv_off;
  s.qt.assign(static_cast<size_t>(NV) * d * kLanes, 0.0f);
  s.ot.assign(static_cast<size_t>(NV) * d * kLanes, 0.0f);
  s.kf.resize(kKeyBlock * d);
  s.vf.resize(kKeyBlock * d);
  s.p.resize(kKeyBlock * NV * kLanes);
  int32_t ends[kLanes * kMaxVectors];
  int32_t max_end = 0;
  for (int lane = 0; lane < NV * kLanes; ++lane) {
    ends[lane] = lane < ls.n ? ls.end[lane] : 0;
    max_end = std::max(max_end, ends[lane]);
    if (lane >= ls.n) continue;
    const float* qr = q + ls.row[lane] * q_stride + int64_t{ls.head[lane]} * d;
    for (int i = 0; i < d; ++i) s.qt[((lane / kLanes) * d + i) * kLanes + lane % kLanes] = qr[i] * scale;
  }
  __m256 m[NV], l[NV];
  __m256i endv[NV];
  for (int vi = 0; vi < NV; ++vi) {
    m[vi] = _mm256_set1_ps(-INFINITY);
    l[vi] = _mm256_setzero_ps();
    endv[vi] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ends + vi * kLanes));
  }
  auto block = [&](int64_t j0, int64_t nb, bool causal) {
    widen_rows(k + j0 * kv.row_stride, kv.row_stride, nb, d, s.kf.data());
    widen_rows(v + j0 * kv.row_stride, kv.row_stride, nb, d, s.vf.data());
    __m256 bm[NV];
    for (auto& x : bm) x = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < nb; ++j) {
      __m256 acc[NV];
      for (auto& x : acc) x = _mm256_setzero_ps();
      for (int i = 0; i < d; ++i) {
        const __m256 kb = _mm256_broadcast_ss(&s.kf[j * d + i]);
        for (int vi = 0; vi < NV; ++vi)
          acc[vi] = _mm256_fmadd_ps(kb, _mm256_loadu_ps(&s.qt[(vi * d + i) * kLanes]), acc[vi]);
      }
      for (int vi = 0; vi < NV; ++vi) {
        if (causal) {  // lanes whose run ends at or before this row do not see it
          const __m256i hidden =
              _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(j0 + j + 1)), endv[vi]);
          acc[vi] = _mm256_blendv_ps(acc[vi], _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(hidden));
        }
        bm[vi] = _mm256_max_ps(bm[vi], acc[vi]);
        _mm256_storeu_ps(&s.p[(j * NV + vi) * kLanes], acc[vi]);
      }
    }
    for (int vi = 0; vi < NV; ++vi) {
      const __m256 m_new = _mm256_max_ps(m[vi], bm[vi]);
      // A lane that has seen nothing yet keeps m = -inf; subtracting 0
      // instead keeps its exponentials at exactly 0 rather than NaN.
      const __m256 none = _mm256_cmp_ps(m_new, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
      const __m256 m_use = _mm256_andnot_ps(none, m_new);
      const __m256 corr = exp_nonpositive(_mm256_sub_ps(m[vi], m_use));
      l[vi] = _mm256_mul_ps(l[vi], corr);
      for (int64_t j = 0; j < nb; ++j) {
        float* pj = &s.p[(j * NV + vi) * kLanes];
        const __m256 p = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(pj), m_use));
        l[vi] = _mm256_add_ps(l[vi], p);
        _mm256_storeu_ps(pj, p);
      }
      float* o = &s.ot[static_cast<size_t>(vi) * d * kLanes];
      int i = 0;
      for (; i + 4 <= d; i += 4) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(o + (i + 0) * kLanes), corr);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(o + (i + 1) * kLanes), corr);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(o + (i + 2) * kLanes), corr);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(o + (i + 3) * kLanes), corr);
        for (int64_t j = 0; j < nb; ++j) {
          const __m256 p = _mm256_loadu_ps(&s.p[(j * NV + vi) * kLanes]);
          const float* vr = &s.vf[j * d + i];
          a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(vr + 0), p, a0);
          a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(vr + 1), p, a1);
          a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(vr + 2), p, a2);
          a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(vr + 3), p, a3);
        }
        _mm256_storeu_ps(o + (i + 0) * kLanes, a0);
        _mm256_storeu_ps(o + (i + 1) * kLanes, a1);
        _mm256_storeu_ps(o + (i + 2) * kLanes, a2);
        _mm256_storeu_ps(o + (i + 3) * kLanes, a3);
      }
      for (; i < d; ++i) {
        __m256 a = _mm256_mul_ps(_mm256_loadu_ps(o + i * kLanes), corr);
        for (int64_t j = 0; j < nb; ++j)
          a = _mm256_fmadd_ps(_mm256_broadcast_ss(&s.vf[j * d + i]),
                              _mm256_loadu_ps(&s.p[(j * NV + vi) * kLanes]), a);
        _mm256_storeu_ps(o + i * kLanes, a);
      }
      m[vi] = m_new;
    }
  };
  auto range = [&](int64_t begin, int64_t end, bool causal) {
    for (int64_t j0 = begin; j0 < end; j0 += kKeyBlock) block(j0, std::min(kKeyBlock, end - j0), causal);
  };
  for (const RowRange& r : g.context) range(r.begin, r.end, false);
  range(g.causal_begin, max_end, true);
  float inv[kLanes * kMaxVectors];
  for (int vi = 0; vi < NV; ++vi) {
    // 1/l where l > 0 (a lane with no visible row keeps zeros).
    const __m256 pos = _mm256_cmp_ps(l[vi], _mm256_setzero_ps(), _CMP_GT_OQ);
    _mm256_storeu_ps(inv + vi * kLanes,
                     _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(1.0f), l[vi]), pos));
  }
  for (int lane = 0; lane < ls.n; ++lane) {
    float* o = out + ls.row[lane] * q_stride + int64_t{ls.head[lane]} * d;
    const float* src = &s.ot[static_cast<size_t>(lane / kLanes) * d * kLanes + lane % kLanes];
    for (int i = 0; i < d; ++i) o[i] = src[i * kLanes] * inv[lane];
  }
}

template <typename T>
void attend_lanes_any(const LaneSet& ls, const float* q, int64_t q_stride, const KvLayerView& kv,
                      int64_t kv_off, const QueryGroup& g, int d, float scale, float* out, TileScratch& s) {
  switch ((ls.n + kLanes - 1) / kLanes) {
#define DEPCACHE_LANES(NV) \
  case NV:                 \
    return attend_lanes<T, NV>(ls, q, q_stride, kv, kv_off, g, d, scale, out, s);
    DEPCACHE_LANES(1)
    DEPCACHE_LANES(2)
    DEPCACHE_LANES(3)
    DEPCACHE_LANES(4)
    DEPCACHE_LANES(5)
    DEPCACHE_LANES(6)
    DEPCACHE_LANES(7)
    DEPCACHE_LANES(8)
#undef DEPCACHE_LANES
    default:
      fail(ErrorKind::Internal, "attention task of {} lanes", ls.n);
  }
}

// A task: KV head, a run of batch rows whose queries share one group, and
// the range of query heads of that KV head it covers.
struct Task {
  int kv_head;
  int64_t r0, r1;
  int h0, h1;
};

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
  const int64_t q_stride = int64_t{n_head} * head_dim;
  auto id_of = [&](int64_t r) { return ids.empty() ? r : ids[r]; };
  // Lanes per task are (query, head) pairs: as many queries as fill 64
  // lanes with all heads of a KV head (decode: one query, its heads).
  constexpr int kMaxLanes = kLanes * kMaxVectors;
  const int heads_per_task = std::min(group, kMaxLanes);
  const int64_t rows_per_task = std::max(1, kMaxLanes / heads_per_task);
  std::vector<Task> tasks;
  for (int64_t r0 = 0; r0 < n_q;) {
    const QueryGroup* g = &vis.group_of(id_of(r0));
    int64_t r1 = r0 + 1;
    while (r1 < n_q && r1 - r0 < rows_per_task && &vis.group_of(id_of(r1)) == g) ++r1;
    for (int kvh = 0; kvh < n_head_kv; ++kvh)
      for (int h0 = 0; h0 < group; h0 += heads_per_task)
        tasks.push_back({kvh, r0, r1, kvh * group + h0, kvh * group + std::min(group, h0 + heads_per_task)});
    r0 = r1;
  }
  pool.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti, int) {
    thread_local TileScratch scratch;
    const Task& t = tasks[ti];
    LaneSet ls;
    const QueryGroup& g = vis.group_of(id_of(t.r0));
    for (int64_t r = t.r0; r < t.r1; ++r)
      for (int h = t.h0; h < t.h1; ++h) {
        ls.row[ls.n] = r;
        ls.head[ls.n] = h;
        ls.end[ls.n] = static_cast<int32_t>(g.self_row + (id_of(r) - g.first) + 1);
        ++ls.n;
      }
    const int64_t kv_off = int64_t{t.kv_head} * head_dim;
    if (kv.f16)
      attend_lanes_any<uint16_t>(ls, q, q_stride, kv, kv_off, g, head_dim, scale, out, scratch);
    else
      attend_lanes_any<float>(ls, q, q_stride, kv, kv_off, g, head_dim, scale, out, scratch);
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

#pragma once
// The lane kernel of attention(): an online softmax over key blocks for up
// to 64 (query, head) lanes that share a KV head and a visibility group.
// Written once over a SIMD width and compiled per ISA: attention.cpp (AVX2)
// and attention_avx512.cpp (AVX-512) include it with their own flags. The
// templates live in an anonymous namespace, so each file keeps its own copy
// and the linker can never hand one ISA's code to the other's callers.
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "compute/attention.h"
#include "compute/quant.h"

namespace depcache::detail {

inline constexpr int kMaxLanes = 64;
inline constexpr int64_t kKeyBlock = 32;
// Keys are split at every multiple of this many KV rows: each part is
// attended on its own (possibly on another thread) and the parts are merged
// in row order (merge_parts in attention.cpp). The cut points depend on the
// rows alone, so a query's result does not depend on the batch, the thread
// count or which parts ran where.
inline constexpr int64_t kKeyPart = 1024;

// The (query, head) pairs of one task. Each pair is a vector lane and every
// lane runs the same operations in the same order whatever the other lanes
// hold, so a query's result does not depend on how the batch was cut.
struct LaneSet {
  int n = 0;
  int64_t row[kMaxLanes];  // row of q and out
  int head[kMaxLanes];     // query head
  int32_t end[kMaxLanes];  // one past the last row of its causal run
};

// Per-thread buffers of a task, sized by attention() for head dimension d
// (qt, ot: kMaxLanes * d; kf, vf: kKeyBlock * d; p: kKeyBlock * kMaxLanes).
// The kernels only index them: no std template is instantiated in an ISA
// file, where the linker could pick its copy for every caller.
struct TileScratch {
  std::vector<float> qt, kf, vf, p, ot;
};

// Rows [lo, hi) of what the lanes see. With `part` null the outputs are
// written normalised to `out`; else per lane, at part + lane * (d + 2), the
// running maximum m, the sum l of exp(score - m) (m taken as 0 while it is
// -inf) and the unnormalised output (d floats), for merge_parts.
using AttendLanesFn = void (*)(const LaneSet& ls, const float* q, int64_t q_stride, const KvLayerView& kv,
                               int64_t kv_off, const QueryGroup& g, int d, float scale, float softcap,
                               int64_t lo, int64_t hi, float* out, float* part, TileScratch& s);

// The kernel of each ISA for a KV storage type (F32, F16, Q8_0); nullptr
// where the compiler could not build that ISA.
AttendLanesFn attend_lanes_avx2(DType type);    // attention.cpp
AttendLanesFn attend_lanes_avx512(DType type);  // attention_avx512.cpp

}  // namespace depcache::detail

namespace depcache::detail {
namespace {

// Elements [off, off + d) of one stored row as floats: T is the element
// (float, uint16_t for f16) or the block (BlockQ8_0) the row is made of.
template <class S, typename T>
void widen_row(const uint8_t* row, int64_t off, float* dst, int d) {
  if constexpr (std::is_same_v<T, BlockQ8_0>) {
    // Whole blocks in vectors; a head slice that cuts a block is read by scalars.
    const auto* b = reinterpret_cast<const BlockQ8_0*>(row);
    for (int i = 0; i < d;) {
      const int64_t e = off + i;
      const int in = static_cast<int>(e % kQ32);
      const BlockQ8_0& blk = b[e / kQ32];
      if (in == 0 && d - i >= kQ32) {
        S::widen_q8(blk, dst + i);
        i += kQ32;
        continue;
      }
      const int take = kQ32 - in < d - i ? static_cast<int>(kQ32 - in) : d - i;
      const float scale = S::half(blk.d);
      for (int x = 0; x < take; ++x) dst[i + x] = scale * blk.qs[in + x];
      i += take;
    }
  } else {
    S::widen(reinterpret_cast<const T*>(row) + off, dst, d);
  }
}

// Calls f.template operator()<TV, TN>(vi0, n0) for register tiles covering
// lane vectors [0, NV) by [0, n): three lane vectors at a time (two for a
// remainder of two) by four, a lone vector by eight, then by one for what
// is left of n.
template <int NV, class F>
void tiles(int64_t n, F& f) {
  auto run = [&]<int TV, int TN>(int vi0) {
    int64_t i = 0;
    for (; i + TN <= n; i += TN) f.template operator()<TV, TN>(vi0, i);
    for (; i < n; ++i) f.template operator()<TV, 1>(vi0, i);
  };
  int vi0 = 0;
  for (; vi0 + 3 <= NV; vi0 += 3) run.template operator()<3, 4>(vi0);
  if (vi0 + 2 == NV)
    run.template operator()<2, 4>(vi0);
  else if (vi0 < NV)
    run.template operator()<1, 8>(vi0);
}

// S: the SIMD traits of an ISA (vector type V of S::W floats, see the ISA
// files). Q (scaled) and the output are kept transposed, [vector][dim][lane],
// so scores and outputs are plain vector FMAs with a broadcast key or value
// element.
template <class S, typename T, int NV>
void attend_lanes(const LaneSet& ls, const float* q, int64_t q_stride, const KvLayerView& kv, int64_t kv_off,
                  const QueryGroup& g, int d, float scale, float softcap, int64_t lo, int64_t hi, float* out,
                  float* part, TileScratch& s) {
  using V = typename S::V;
  constexpr int W = S::W;
  const auto* k = static_cast<const uint8_t*>(kv.k);
  const auto* v = static_cast<const uint8_t*>(kv.v);
  const size_t rb = kv.row_bytes;
  for (int64_t i = 0; i < int64_t{NV} * d * W; ++i) s.qt[i] = s.ot[i] = 0.0f;
  int32_t ends[kMaxLanes];
  int32_t max_end = 0;
  for (int lane = 0; lane < NV * W; ++lane) {
    ends[lane] = lane < ls.n ? ls.end[lane] : 0;
    if (ends[lane] > max_end) max_end = ends[lane];
    if (lane >= ls.n) continue;
    const float* qr = q + ls.row[lane] * q_stride + int64_t{ls.head[lane]} * d;
    for (int i = 0; i < d; ++i) s.qt[((lane / W) * d + i) * W + lane % W] = qr[i] * scale;
  }
  V m[NV], l[NV];
  typename S::I endv[NV];
  for (int vi = 0; vi < NV; ++vi) {
    m[vi] = S::set1(-INFINITY);
    l[vi] = S::zero();
    endv[vi] = S::load_i(ends + vi * W);
  }
  // Per block of keys: scores of every lane and key (p), the softmax update
  // per lane vector, then the outputs. Scores and outputs are computed in
  // register tiles of lane vectors by keys (scores) or by output dimensions
  // (outputs): each loaded vector serves a whole row or column of the tile,
  // and the tile's accumulators are independent FMA chains. Every score and
  // output element is the same sum, term for term, whatever the tile.
  auto block = [&](int64_t j0, int64_t nb, bool causal) {
    for (int64_t j = 0; j < nb; ++j) {
      widen_row<S, T>(k + (j0 + j) * rb, kv_off, s.kf.data() + j * d, d);
      widen_row<S, T>(v + (j0 + j) * rb, kv_off, s.vf.data() + j * d, d);
    }
    // p[j][vi] = q . k_j for lane vectors vi0.. and keys j..
    auto scores = [&]<int TV, int TK>(int vi0, int64_t j) {
      V acc[TV][TK];
      for (auto& a : acc)
        for (auto& x : a) x = S::zero();
      for (int i = 0; i < d; ++i) {
        V qv[TV];
        for (int t = 0; t < TV; ++t) qv[t] = S::load(&s.qt[((vi0 + t) * d + i) * W]);
        for (int kk = 0; kk < TK; ++kk) {
          const V kb = S::bcast(&s.kf[(j + kk) * d + i]);
          for (int t = 0; t < TV; ++t) acc[t][kk] = S::fmadd(kb, qv[t], acc[t][kk]);
        }
      }
      for (int t = 0; t < TV; ++t)
        for (int kk = 0; kk < TK; ++kk) S::store(&s.p[((j + kk) * NV + vi0 + t) * W], acc[t][kk]);
    };
    tiles<NV>(nb, scores);
    V corr[NV];
    for (int vi = 0; vi < NV; ++vi) {
      V bm = S::set1(-INFINITY);
      for (int64_t j = 0; j < nb; ++j) {
        float* pj = &s.p[(j * NV + vi) * W];
        V a = S::load(pj);
        if (softcap > 0) {  // Gemma 2: scores bounded as cap * tanh(score / cap)
          float t[W];
          S::store(t, a);
          for (int x = 0; x < W; ++x) t[x] = softcap * std::tanh(t[x] / softcap);
          a = S::load(t);
        }
        // Lanes whose causal run ends at or before this row do not see it.
        if (causal) a = S::hide_past(a, static_cast<int32_t>(j0 + j + 1), endv[vi]);
        bm = S::max(bm, a);
        if (causal || softcap > 0) S::store(pj, a);  // else the scores are as stored
      }
      const V m_new = S::max(m[vi], bm);
      // A lane that has seen nothing yet keeps m = -inf; subtracting 0
      // instead keeps its exponentials at exactly 0 rather than NaN.
      const V m_use = S::zero_if_neg_inf(m_new);
      corr[vi] = S::exp_nonpositive(S::sub(m[vi], m_use));
      l[vi] = S::mul(l[vi], corr[vi]);
      for (int64_t j = 0; j < nb; ++j) {
        float* pj = &s.p[(j * NV + vi) * W];
        const V p = S::exp_nonpositive(S::sub(S::load(pj), m_use));
        l[vi] = S::add(l[vi], p);
        S::store(pj, p);
      }
      m[vi] = m_new;
    }
    // o[vi][i] = corr * o[vi][i] + sum over keys of p[j][vi] * v_j[i], for lane
    // vectors vi0.. and output dimensions i..
    auto outputs = [&]<int TV, int TD>(int vi0, int64_t i) {
      V a[TV][TD];
      for (int t = 0; t < TV; ++t)
        for (int x = 0; x < TD; ++x)
          a[t][x] = S::mul(S::load(&s.ot[((vi0 + t) * d + i + x) * W]), corr[vi0 + t]);
      for (int64_t j = 0; j < nb; ++j) {
        V p[TV];
        for (int t = 0; t < TV; ++t) p[t] = S::load(&s.p[(j * NV + vi0 + t) * W]);
        const float* vr = &s.vf[j * d + i];
        for (int x = 0; x < TD; ++x) {
          const V vb = S::bcast(vr + x);
          for (int t = 0; t < TV; ++t) a[t][x] = S::fmadd(vb, p[t], a[t][x]);
        }
      }
      for (int t = 0; t < TV; ++t)
        for (int x = 0; x < TD; ++x) S::store(&s.ot[((vi0 + t) * d + i + x) * W], a[t][x]);
    };
    tiles<NV>(d, outputs);
  };
  auto range = [&](int64_t begin, int64_t end, bool causal) {
    begin = begin > lo ? begin : lo;
    end = end < hi ? end : hi;
    for (int64_t j0 = begin; j0 < end; j0 += kKeyBlock)
      block(j0, end - j0 < kKeyBlock ? end - j0 : kKeyBlock, causal);
  };
  for (const RowRange& r : g.context) range(r.begin, r.end, false);
  range(g.causal_begin, max_end, true);
  if (part) {
    float mv[kMaxLanes], lv[kMaxLanes];
    for (int vi = 0; vi < NV; ++vi) {
      S::store(mv + vi * W, m[vi]);
      S::store(lv + vi * W, l[vi]);
    }
    for (int lane = 0; lane < ls.n; ++lane) {
      float* p = part + static_cast<int64_t>(lane) * (d + 2);
      p[0] = mv[lane];
      p[1] = lv[lane];
      const float* src = &s.ot[static_cast<size_t>(lane / W) * d * W + lane % W];
      for (int i = 0; i < d; ++i) p[2 + i] = src[i * W];
    }
    return;
  }
  float inv[kMaxLanes];
  for (int vi = 0; vi < NV; ++vi) S::store(inv + vi * W, S::inv_or_one(l[vi]));
  for (int lane = 0; lane < ls.n; ++lane) {
    float* o = out + ls.row[lane] * q_stride + int64_t{ls.head[lane]} * d;
    const float* src = &s.ot[static_cast<size_t>(lane / W) * d * W + lane % W];
    for (int i = 0; i < d; ++i) o[i] = src[i * W] * inv[lane];
  }
}

// The instantiation for ceil(n / W) vectors.
template <class S, typename T, int NV = 1>
void attend_lanes_for(const LaneSet& ls, const float* q, int64_t q_stride, const KvLayerView& kv,
                      int64_t kv_off, const QueryGroup& g, int d, float scale, float softcap, int64_t lo,
                      int64_t hi, float* out, float* part, TileScratch& s) {
  if constexpr (NV * S::W < kMaxLanes) {
    if (ls.n > NV * S::W)
      return attend_lanes_for<S, T, NV + 1>(ls, q, q_stride, kv, kv_off, g, d, scale, softcap, lo, hi, out,
                                            part, s);
  }
  attend_lanes<S, T, NV>(ls, q, q_stride, kv, kv_off, g, d, scale, softcap, lo, hi, out, part, s);
}

// The kernel for a KV storage type, or nullptr for one it cannot read.
template <class S>
AttendLanesFn attend_lanes_of(DType type) {
  switch (type) {
    case DType::F32:
      return attend_lanes_for<S, float>;
    case DType::F16:
      return attend_lanes_for<S, uint16_t>;
    case DType::Q8_0:
      return attend_lanes_for<S, BlockQ8_0>;
    default:
      return nullptr;
  }
}

}  // namespace
}  // namespace depcache::detail

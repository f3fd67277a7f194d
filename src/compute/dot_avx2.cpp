// AVX2 + FMA + F16C kernels. Quantized weights are unpacked to int32 and
// turned into fp32 with the format's formula (one rounding, as in the scalar
// path), then multiplied into the float activations, so x is used exactly as
// given. (Integer dot products against a quantized x would be faster for the
// 4-bit types but would change the numerics.)
//
// From headers only intrinsics and plain structs are used, as in the AVX-512
// file, where that matters (see there).
#include <cstdint>

#include "compute/dot.h"
#include "compute/quant.h"
#include "compute/vec.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace depcache::detail {
namespace {

using vec::hsum;  // this file's ISA is the project baseline, so vec.h is safe here

inline float half(uint16_t h) { return _cvtsh_ss(h); }
inline float bf16(uint16_t b) {
  return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(int(uint32_t(b) << 16))));
}

inline __m128i load8(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m256 u8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
inline __m256 i8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// ---- Dense types: 8 weights per load, 4 accumulators to hide FMA latency.

struct F32Load {
  static __m256 vec(const void* w, int64_t i) { return _mm256_loadu_ps(static_cast<const float*>(w) + i); }
  static float one(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
};
struct F16Load {
  static __m256 vec(const void* w, int64_t i) {
    return _mm256_cvtph_ps(load16(static_cast<const uint16_t*>(w) + i));
  }
  static float one(const void* w, int64_t i) { return half(static_cast<const uint16_t*>(w)[i]); }
};
struct BF16Load {
  static __m256 vec(const void* w, int64_t i) {
    const __m256i v = _mm256_cvtepu16_epi32(load16(static_cast<const uint16_t*>(w) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static float one(const void* w, int64_t i) { return bf16(static_cast<const uint16_t*>(w)[i]); }
};

template <class L>
float dot_dense(const void* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(L::vec(w, i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(L::vec(w, i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(L::vec(w, i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(L::vec(w, i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(L::vec(w, i), _mm256_loadu_ps(x + i), a0);
  float tail = 0;
  for (; i < n; ++i) tail += L::one(w, i) * x[i];
  return hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) + tail;
}

template <class L>
void dequant_dense(const void* w, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, L::vec(w, i));
  for (; i < n; ++i) y[i] = L::one(w, i);
}

// ---- Quantized types. A walker decodes a row and hands groups of four
// 8-wide vectors to a sink: vector k holds elements i + k * stride ... + 7.
// The same walker serves the dot (sink = FMA with x) and dequantization
// (sink = store), so both see identical weights. Walkers alternate the
// template argument S between consecutive groups: the dot sink keeps a set of
// accumulators per S, so FMA latency does not serialise block after block.

struct DotSink {
  const float* x;
  __m256 a[8] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  template <int S>
  void put(int64_t i, int64_t stride, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
    a[4 * S] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a[4 * S]);
    a[4 * S + 1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + stride), a[4 * S + 1]);
    a[4 * S + 2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + i + 2 * stride), a[4 * S + 2]);
    a[4 * S + 3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + i + 3 * stride), a[4 * S + 3]);
  }
  float result() const {
    const __m256 s0 = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
    const __m256 s1 = _mm256_add_ps(_mm256_add_ps(a[4], a[5]), _mm256_add_ps(a[6], a[7]));
    return hsum(_mm256_add_ps(s0, s1));
  }
};

struct StoreSink {
  float* y;
  template <int S>
  void put(int64_t i, int64_t stride, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
    _mm256_storeu_ps(y + i, w0);
    _mm256_storeu_ps(y + i + stride, w1);
    _mm256_storeu_ps(y + i + 2 * stride, w2);
    _mm256_storeu_ps(y + i + 3 * stride, w3);
  }
};

// Simple 32-element blocks, two per step so consecutive blocks use different
// accumulators.
template <class Block, class Decode>
struct WalkPairs {
  template <class Sink>
  static void run(const void* src, int64_t n, Sink& sink) {
    const auto* b = static_cast<const Block*>(src);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64, b += 2) {
      Decode::template block<0>(b, i, sink);
      Decode::template block<1>(b + 1, i + 32, sink);
    }
    if (i < n) Decode::template block<0>(b, i, sink);
  }
};

struct DecodeQ8_0 {
  template <int S, class Sink>
  static void block(const BlockQ8_0* b, int64_t i, Sink& sink) {
    const __m256 d = _mm256_set1_ps(half(b->d));
    sink.template put<S>(
        i, 8, _mm256_mul_ps(d, i8_to_ps(load8(b->qs))), _mm256_mul_ps(d, i8_to_ps(load8(b->qs + 8))),
        _mm256_mul_ps(d, i8_to_ps(load8(b->qs + 16))), _mm256_mul_ps(d, i8_to_ps(load8(b->qs + 24))));
  }
};

struct DecodeQ4_0 {
  // Bytes 0-7 and 8-15 widened to int32; the low nibbles are elements 0..15,
  // the high ones 16..31. d*q - 8d is d*(q - 8) exactly.
  template <int S, class Sink>
  static void block(const BlockQ4_0* b, int64_t i, Sink& sink) {
    const float d = half(b->d);
    const __m256 vd = _mm256_set1_ps(d), v8d = _mm256_set1_ps(8 * d);
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    const __m256i r0 = _mm256_cvtepu8_epi32(load8(b->qs)), r1 = _mm256_cvtepu8_epi32(load8(b->qs + 8));
    auto w = [&](__m256i q) { return _mm256_fmsub_ps(_mm256_cvtepi32_ps(q), vd, v8d); };
    sink.template put<S>(i, 8, w(_mm256_and_si256(r0, low4)), w(_mm256_and_si256(r1, low4)),
                         w(_mm256_srli_epi32(r0, 4)), w(_mm256_srli_epi32(r1, 4)));
  }
};

// Per super-block, the sub-block factors as floats: d*sc and dmin*m (exact
// products of an fp16 and a 6-bit integer). The 6-bit fields are unpacked as
// in unpack_q4k_scales (quant.h), here so that it inlines: a call would spill
// the accumulators once per super-block.
inline void q4k_factors(const BlockQ4_K* b, float* ds, float* dm) {
  const uint8_t* p = b->scales;
  alignas(8) uint8_t sc[8], m[8];
  for (int j = 0; j < 4; ++j) {
    sc[j] = p[j] & 63;
    m[j] = p[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((p[j + 8] & 0xF) | ((p[j] >> 6) << 4));
    m[j + 4] = static_cast<uint8_t>((p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4));
  }
  _mm256_storeu_ps(ds, _mm256_mul_ps(u8_to_ps(load8(sc)), _mm256_set1_ps(half(b->d))));
  _mm256_storeu_ps(dm, _mm256_mul_ps(u8_to_ps(load8(m)), _mm256_set1_ps(half(b->dmin))));
}

struct WalkQ4_K {
  template <class Sink>
  static void run(const void* src, int64_t n, Sink& sink) {
    const auto* b = static_cast<const BlockQ4_K*>(src);
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    for (int64_t i = 0; i < n; i += 256, ++b) {
      float ds[8], dm[8];
      q4k_factors(b, ds, dm);
      for (int g = 0; g < 4; ++g) {
        const uint8_t* q = b->qs + 32 * g;
        const __m256i r0 = _mm256_cvtepu8_epi32(load8(q)), r1 = _mm256_cvtepu8_epi32(load8(q + 8));
        const __m256i r2 = _mm256_cvtepu8_epi32(load8(q + 16)), r3 = _mm256_cvtepu8_epi32(load8(q + 24));
        // d*sc*q - dmin*m with one rounding: d*sc*q is exact in fp32.
        const __m256 d1 = _mm256_broadcast_ss(&ds[2 * g]), m1 = _mm256_broadcast_ss(&dm[2 * g]);
        const __m256 d2 = _mm256_broadcast_ss(&ds[2 * g + 1]), m2 = _mm256_broadcast_ss(&dm[2 * g + 1]);
        auto lo = [&](__m256i r) {
          return _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(r, low4)), d1, m1);
        };
        auto hi = [&](__m256i r) {
          return _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 4)), d2, m2);
        };
        // Both halves into one accumulator set: two FMAs per accumulator per
        // 64 elements already hide the latency, and a second set would not
        // fit in 16 registers next to the factors.
        sink.template put<0>(i + 64 * g, 8, lo(r0), lo(r1), lo(r2), lo(r3));
        sink.template put<0>(i + 64 * g + 32, 8, hi(r0), hi(r1), hi(r2), hi(r3));
      }
    }
  }
};

struct WalkQ6_K {
  // Elements base+l.., +32, +64, +96 (one 8-wide slice of each quarter).
  template <int S, class Sink>
  static void step(const uint8_t* ql, const uint8_t* qh, const float* ds, const float* ds32, int l,
                   int64_t base, Sink& sink) {
    const __m256i low4 = _mm256_set1_epi32(0x0F), top2 = _mm256_set1_epi32(0x30);
    const __m256i a = _mm256_cvtepu8_epi32(load8(ql + l)), c = _mm256_cvtepu8_epi32(load8(ql + l + 32));
    const __m256i hb = _mm256_cvtepu8_epi32(load8(qh + l));
    // Two high bits per element, moved to bits 4-5 of the 6-bit value.
    const __m256i q1 =
        _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi32(hb, 4), top2));
    const __m256i q2 =
        _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_and_si256(_mm256_slli_epi32(hb, 2), top2));
    const __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_and_si256(hb, top2));
    const __m256i q4 =
        _mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_and_si256(_mm256_srli_epi32(hb, 2), top2));
    // ds*q - 32*ds: the exact d*sc*(q - 32), rounded once.
    auto w = [&](__m256i q, int k) {
      const int s = l / 16 + 2 * k;
      return _mm256_fmsub_ps(_mm256_cvtepi32_ps(q), _mm256_broadcast_ss(&ds[s]),
                             _mm256_broadcast_ss(&ds32[s]));
    };
    sink.template put<S>(base + l, 32, w(q1, 0), w(q2, 1), w(q3, 2), w(q4, 3));
  }

  template <class Sink>
  static void run(const void* src, int64_t n, Sink& sink) {
    const auto* b = static_cast<const BlockQ6_K*>(src);
    for (int64_t i = 0; i < n; i += 256, ++b) {
      float ds[16], ds32[16];  // d * scale and 32 * d * scale per sub-block
      const __m256 d = _mm256_set1_ps(half(b->d)), k32 = _mm256_set1_ps(32.f);
      for (int s = 0; s < 16; s += 8) {
        const __m256 v = _mm256_mul_ps(i8_to_ps(load8(b->scales + s)), d);
        _mm256_storeu_ps(ds + s, v);
        _mm256_storeu_ps(ds32 + s, _mm256_mul_ps(v, k32));
      }
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b->ql + 64 * h;
        const uint8_t* qh = b->qh + 32 * h;
        for (int l = 0; l < 32; l += 16) {
          step<0>(ql, qh, ds + 8 * h, ds32 + 8 * h, l, i + 128 * h, sink);
          step<1>(ql, qh, ds + 8 * h, ds32 + 8 * h, l + 8, i + 128 * h, sink);
        }
      }
    }
  }
};

using WalkQ8_0 = WalkPairs<BlockQ8_0, DecodeQ8_0>;
using WalkQ4_0 = WalkPairs<BlockQ4_0, DecodeQ4_0>;

template <class Walk>
float dot_quant(const void* w, const float* x, int64_t n) {
  DotSink sink;
  sink.x = x;
  Walk::run(w, n, sink);
  return sink.result();
}

template <class Walk>
void dequant_quant(const void* w, float* y, int64_t n) {
  StoreSink sink{y};
  Walk::run(w, n, sink);
}

}  // namespace

void fill_avx2_kernels(KernelSet& set) {
  auto put = [&](DType t, DotFn dot, DequantFn deq) { set.by_type[static_cast<uint32_t>(t)] = {dot, deq}; };
  set.by_type[static_cast<uint32_t>(DType::F32)].dot = dot_dense<F32Load>;  // dequant stays memcpy
  put(DType::F16, dot_dense<F16Load>, dequant_dense<F16Load>);
  put(DType::BF16, dot_dense<BF16Load>, dequant_dense<BF16Load>);
  put(DType::Q8_0, dot_quant<WalkQ8_0>, dequant_quant<WalkQ8_0>);
  put(DType::Q4_0, dot_quant<WalkQ4_0>, dequant_quant<WalkQ4_0>);
  put(DType::Q4_K, dot_quant<WalkQ4_K>, dequant_quant<WalkQ4_K>);
  put(DType::Q6_K, dot_quant<WalkQ6_K>, dequant_quant<WalkQ6_K>);
}

}  // namespace depcache::detail

#else
namespace depcache::detail {
void fill_avx2_kernels(KernelSet&) {}  // not an x86 build: the scalar set stays
}  // namespace depcache::detail
#endif

// AVX2 + FMA + F16C kernels. Quantized weights are unpacked to int32, turned
// into fp32 with the format's formula (one rounding, as the scalar path) and
// multiplied into float activations: decode is bound by memory bandwidth, so
// integer dot products would not pay for the extra quantization of x.
//
// Only intrinsics and plain structs are used from headers: an inline function
// shared with other translation units could be emitted with these flags.
#include <cstdint>

#include "compute/dot.h"
#include "compute/quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace depcache::detail {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

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
// (sink = store), so both see identical weights.

struct DotSink {
  const float* x;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  void operator()(int64_t i, int64_t stride, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
    a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + stride), a1);
    a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + i + 2 * stride), a2);
    a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + i + 3 * stride), a3);
  }
  float result() const { return hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))); }
};

struct StoreSink {
  float* y;
  void operator()(int64_t i, int64_t stride, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
    _mm256_storeu_ps(y + i, w0);
    _mm256_storeu_ps(y + i + stride, w1);
    _mm256_storeu_ps(y + i + 2 * stride, w2);
    _mm256_storeu_ps(y + i + 3 * stride, w3);
  }
};

struct WalkQ8_0 {
  template <class Sink>
  static void run(const void* src, int64_t n, Sink& sink) {
    const auto* b = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < n; i += 32, ++b) {
      const __m256 d = _mm256_set1_ps(half(b->d));
      sink(i, 8, _mm256_mul_ps(d, i8_to_ps(load8(b->qs))), _mm256_mul_ps(d, i8_to_ps(load8(b->qs + 8))),
           _mm256_mul_ps(d, i8_to_ps(load8(b->qs + 16))), _mm256_mul_ps(d, i8_to_ps(load8(b->qs + 24))));
    }
  }
};

struct WalkQ4_0 {
  template <class Sink>
  static void run(const void* src, int64_t n, Sink& sink) {
    const auto* b = static_cast<const BlockQ4_0*>(src);
    const __m128i low4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    for (int64_t i = 0; i < n; i += 32, ++b) {
      const __m256 d = _mm256_set1_ps(half(b->d));
      const __m128i raw = load16(b->qs);
      const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, low4), eight);                     // elements 0..15
      const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), eight);  // 16..31
      sink(i, 8, _mm256_mul_ps(d, i8_to_ps(lo)), _mm256_mul_ps(d, i8_to_ps(_mm_srli_si128(lo, 8))),
           _mm256_mul_ps(d, i8_to_ps(hi)), _mm256_mul_ps(d, i8_to_ps(_mm_srli_si128(hi, 8))));
    }
  }
};

struct WalkQ4_K {
  template <class Sink>
  static void run(const void* src, int64_t n, Sink& sink) {
    const auto* b = static_cast<const BlockQ4_K*>(src);
    const __m128i low4 = _mm_set1_epi8(0x0F);
    for (int64_t i = 0; i < n; i += 256, ++b) {
      uint8_t sc[8], m[8];
      unpack_q4k_scales(b->scales, sc, m);
      const float d = half(b->d), dmin = half(b->dmin);
      for (int g = 0; g < 4; ++g) {
        const __m128i r0 = load16(b->qs + 32 * g), r1 = load16(b->qs + 32 * g + 16);
        const __m128i lo0 = _mm_and_si128(r0, low4), lo1 = _mm_and_si128(r1, low4);
        const __m128i hi0 = _mm_and_si128(_mm_srli_epi16(r0, 4), low4);
        const __m128i hi1 = _mm_and_si128(_mm_srli_epi16(r1, 4), low4);
        // d*sc*q - dmin*m as one fused rounding: d*sc*q is exact in fp32.
        const __m256 d1 = _mm256_set1_ps(d * sc[2 * g]), m1 = _mm256_set1_ps(dmin * m[2 * g]);
        const __m256 d2 = _mm256_set1_ps(d * sc[2 * g + 1]), m2 = _mm256_set1_ps(dmin * m[2 * g + 1]);
        sink(i + 64 * g, 8, _mm256_fmsub_ps(u8_to_ps(lo0), d1, m1),
             _mm256_fmsub_ps(u8_to_ps(_mm_srli_si128(lo0, 8)), d1, m1),
             _mm256_fmsub_ps(u8_to_ps(lo1), d1, m1),
             _mm256_fmsub_ps(u8_to_ps(_mm_srli_si128(lo1, 8)), d1, m1));
        sink(i + 64 * g + 32, 8, _mm256_fmsub_ps(u8_to_ps(hi0), d2, m2),
             _mm256_fmsub_ps(u8_to_ps(_mm_srli_si128(hi0, 8)), d2, m2),
             _mm256_fmsub_ps(u8_to_ps(hi1), d2, m2),
             _mm256_fmsub_ps(u8_to_ps(_mm_srli_si128(hi1, 8)), d2, m2));
      }
    }
  }
};

struct WalkQ6_K {
  template <class Sink>
  static void run(const void* src, int64_t n, Sink& sink) {
    const auto* b = static_cast<const BlockQ6_K*>(src);
    const __m256i low4 = _mm256_set1_epi32(0x0F), top2 = _mm256_set1_epi32(0x30),
                  bias = _mm256_set1_epi32(32);
    for (int64_t i = 0; i < n; i += 256, ++b) {
      const float d = half(b->d);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b->ql + 64 * h;
        const uint8_t* qh = b->qh + 32 * h;
        const int8_t* sc = b->scales + 8 * h;
        for (int l = 0; l < 32; l += 8) {
          const __m256i a = _mm256_cvtepu8_epi32(load8(ql + l));
          const __m256i c = _mm256_cvtepu8_epi32(load8(ql + l + 32));
          const __m256i hb = _mm256_cvtepu8_epi32(load8(qh + l));
          // Two high bits per element, moved to bits 4-5 of the 6-bit value.
          const __m256i q1 =
              _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi32(hb, 4), top2));
          const __m256i q2 =
              _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_and_si256(_mm256_slli_epi32(hb, 2), top2));
          const __m256i q3 = _mm256_or_si256(_mm256_srli_epi32(a, 4), _mm256_and_si256(hb, top2));
          const __m256i q4 =
              _mm256_or_si256(_mm256_srli_epi32(c, 4), _mm256_and_si256(_mm256_srli_epi32(hb, 2), top2));
          auto w = [&](__m256i q, int k) {
            return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, bias)),
                                 _mm256_set1_ps(d * sc[l / 16 + 2 * k]));
          };
          sink(i + 128 * h + l, 32, w(q1, 0), w(q2, 1), w(q3, 2), w(q4, 3));
        }
      }
    }
  }
};

template <class Walk>
float dot_quant(const void* w, const float* x, int64_t n) {
  DotSink sink{x};
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

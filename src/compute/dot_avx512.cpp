// AVX-512 (F/BW/VL/DQ) kernels: the AVX2 scheme with 16-wide vectors, and
// masked loads for the tails of the dense types. Only F, BW, VL and DQ
// instructions are used even though the file is built with VNNI/BF16 flags,
// since best_isa() checks only those four.
//
// Only intrinsics and plain structs are used from headers: an inline function
// or template shared with other translation units could be emitted here with
// AVX-512 instructions and then be picked by the linker for every caller.
#include <cstdint>

#include "compute/dot.h"
#include "compute/quant.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#include "compute/avx512_intrinsics.h"

namespace depcache::detail {
namespace {

inline float half(uint16_t h) { return _cvtsh_ss(h); }
inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m512 i8_to_ps(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }
// Horizontal sum via shuffles (GCC 12's _mm512_reduce_add_ps trips -Wuninitialized).
inline float reduce(__m512 v) {
  const __m512 h = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // + the other 256-bit half
  const __m512 q = _mm512_add_ps(h, _mm512_shuffle_f32x4(h, h, 0xB1));  // + the neighbouring 128-bit lane
  __m128 s = _mm512_castps512_ps128(q);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline __mmask16 tail_mask(int64_t left) { return static_cast<__mmask16>((1u << left) - 1); }

// ---- Dense types: 16 weights per load; `mask` loads only the tail elements
// (masked lanes read as zero and never fault).

struct F32Load {
  static __m512 vec(const void* w, int64_t i, __mmask16 k) {
    return _mm512_maskz_loadu_ps(k, static_cast<const float*>(w) + i);
  }
};
struct F16Load {
  static __m512 vec(const void* w, int64_t i, __mmask16 k) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(w) + i));
  }
};
struct BF16Load {
  static __m512 vec(const void* w, int64_t i, __mmask16 k) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(w) + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
};

template <class L>
float dot_dense(const void* w, const float* x, int64_t n) {
  const __mmask16 all = 0xFFFF;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_fmadd_ps(L::vec(w, i, all), _mm512_loadu_ps(x + i), a0);
    a1 = _mm512_fmadd_ps(L::vec(w, i + 16, all), _mm512_loadu_ps(x + i + 16), a1);
    a2 = _mm512_fmadd_ps(L::vec(w, i + 32, all), _mm512_loadu_ps(x + i + 32), a2);
    a3 = _mm512_fmadd_ps(L::vec(w, i + 48, all), _mm512_loadu_ps(x + i + 48), a3);
  }
  for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(L::vec(w, i, all), _mm512_loadu_ps(x + i), a0);
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    a1 = _mm512_fmadd_ps(L::vec(w, i, k), _mm512_maskz_loadu_ps(k, x + i), a1);
  }
  return reduce(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

template <class L>
void dequant_dense(const void* w, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, L::vec(w, i, 0xFFFF));
  if (i < n) {
    const __mmask16 k = tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, k, L::vec(w, i, k));
  }
}

// ---- Quantized types: walkers hand pairs of 16-wide vectors (elements i..+15
// and i + stride..+15) to a sink, alternating the accumulator set S as in the
// AVX2 file.

struct DotSink {
  const float* x;
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  template <int S>
  void put(int64_t i, int64_t stride, __m512 w0, __m512 w1) {
    a[2 * S] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i), a[2 * S]);
    a[2 * S + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i + stride), a[2 * S + 1]);
  }
  float result() const { return reduce(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]))); }
};

struct StoreSink {
  float* y;
  template <int S>
  void put(int64_t i, int64_t stride, __m512 w0, __m512 w1) {
    _mm512_storeu_ps(y + i, w0);
    _mm512_storeu_ps(y + i + stride, w1);
  }
};

// Simple 32-element blocks, two per step (one per accumulator set).
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
    const __m512 d = _mm512_set1_ps(half(b->d));
    sink.template put<S>(i, 16, _mm512_mul_ps(d, i8_to_ps(load16(b->qs))),
                         _mm512_mul_ps(d, i8_to_ps(load16(b->qs + 16))));
  }
};

struct DecodeQ4_0 {
  // All 16 bytes widened at once: low nibbles are elements 0..15, high ones
  // 16..31; d*q - 8d is d*(q - 8) exactly.
  template <int S, class Sink>
  static void block(const BlockQ4_0* b, int64_t i, Sink& sink) {
    const float d = half(b->d);
    const __m512 vd = _mm512_set1_ps(d), v8d = _mm512_set1_ps(8 * d);
    const __m512i r = _mm512_cvtepu8_epi32(load16(b->qs));
    sink.template put<S>(
        i, 16, _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(r, _mm512_set1_epi32(0x0F))), vd, v8d),
        _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(r, 4)), vd, v8d));
  }
};

struct WalkQ4_K {
  template <class Sink>
  static void run(const void* src, int64_t n, Sink& sink) {
    const auto* b = static_cast<const BlockQ4_K*>(src);
    const __m512i low4 = _mm512_set1_epi32(0x0F);
    for (int64_t i = 0; i < n; i += 256, ++b) {
      // d*sc and dmin*m per sub-block (exact products of an fp16 and a 6-bit
      // integer), fields unpacked as in unpack_q4k_scales (quant.h) but
      // inline: a call would spill the accumulators once per super-block.
      const uint8_t* p = b->scales;
      const float d = half(b->d), dmin = half(b->dmin);
      float ds[8], dm[8];
      for (int j = 0; j < 4; ++j) {
        ds[j] = d * (p[j] & 63);
        dm[j] = dmin * (p[j + 4] & 63);
        ds[j + 4] = d * ((p[j + 8] & 0xF) | ((p[j] >> 6) << 4));
        dm[j + 4] = dmin * ((p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4));
      }
      for (int g = 0; g < 4; ++g) {
        const __m512i r0 = _mm512_cvtepu8_epi32(load16(b->qs + 32 * g));
        const __m512i r1 = _mm512_cvtepu8_epi32(load16(b->qs + 32 * g + 16));
        // d*sc*q - dmin*m with one rounding: d*sc*q is exact in fp32.
        const __m512 d1 = _mm512_set1_ps(ds[2 * g]), m1 = _mm512_set1_ps(dm[2 * g]);
        const __m512 d2 = _mm512_set1_ps(ds[2 * g + 1]), m2 = _mm512_set1_ps(dm[2 * g + 1]);
        auto lo = [&](__m512i r) {
          return _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(r, low4)), d1, m1);
        };
        auto hi = [&](__m512i r) {
          return _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(r, 4)), d2, m2);
        };
        sink.template put<0>(i + 64 * g, 16, lo(r0), lo(r1));
        sink.template put<1>(i + 64 * g + 32, 16, hi(r0), hi(r1));
      }
    }
  }
};

struct WalkQ6_K {
  template <class Sink>
  static void run(const void* src, int64_t n, Sink& sink) {
    const auto* b = static_cast<const BlockQ6_K*>(src);
    const __m512i low4 = _mm512_set1_epi32(0x0F), top2 = _mm512_set1_epi32(0x30);
    for (int64_t i = 0; i < n; i += 256, ++b) {
      float ds[16], ds32[16];  // d * scale and 32 * d * scale per sub-block
      const __m512 v = _mm512_mul_ps(i8_to_ps(load16(b->scales)), _mm512_set1_ps(half(b->d)));
      _mm512_storeu_ps(ds, v);
      _mm512_storeu_ps(ds32, _mm512_mul_ps(v, _mm512_set1_ps(32.f)));
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b->ql + 64 * h;
        const uint8_t* qh = b->qh + 32 * h;
        for (int l = 0; l < 32; l += 16) {  // one 16-element sub-block per quarter
          const __m512i a = _mm512_cvtepu8_epi32(load16(ql + l));
          const __m512i c = _mm512_cvtepu8_epi32(load16(ql + l + 32));
          const __m512i hb = _mm512_cvtepu8_epi32(load16(qh + l));
          const __m512i q1 =
              _mm512_or_si512(_mm512_and_si512(a, low4), _mm512_and_si512(_mm512_slli_epi32(hb, 4), top2));
          const __m512i q2 =
              _mm512_or_si512(_mm512_and_si512(c, low4), _mm512_and_si512(_mm512_slli_epi32(hb, 2), top2));
          const __m512i q3 = _mm512_or_si512(_mm512_srli_epi32(a, 4), _mm512_and_si512(hb, top2));
          const __m512i q4 =
              _mm512_or_si512(_mm512_srli_epi32(c, 4), _mm512_and_si512(_mm512_srli_epi32(hb, 2), top2));
          // ds*q - 32*ds: the exact d*sc*(q - 32), rounded once.
          auto w = [&](__m512i q, int k) {
            const int s = 8 * h + l / 16 + 2 * k;
            return _mm512_fmsub_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(ds[s]), _mm512_set1_ps(ds32[s]));
          };
          sink.template put<0>(i + 128 * h + l, 32, w(q1, 0), w(q2, 1));
          sink.template put<1>(i + 128 * h + l + 64, 32, w(q3, 2), w(q4, 3));
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

void fill_avx512_kernels(KernelSet& set) {
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
void fill_avx512_kernels(KernelSet&) {}  // compiler without AVX-512: the AVX2 set stays
}  // namespace depcache::detail
#endif

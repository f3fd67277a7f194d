// AVX-512 instantiation of the attention lane kernel (attention_lanes.h):
// 16 lanes per vector. Only intrinsics come from headers besides the kernel
// template, as in the other AVX-512 files.
#include "compute/attention_lanes.h"

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include "compute/avx512_intrinsics.h"

namespace depcache::detail {
namespace {

struct SimdAvx512 {
  static constexpr int W = 16;
  using V = __m512;
  using I = __m512i;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static I load_i(const int32_t* p) { return _mm512_loadu_si512(p); }
  static V hide_past(V x, int32_t row_plus_1, I end) {
    const __mmask16 hidden = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(row_plus_1), end);
    return _mm512_mask_mov_ps(x, hidden, set1(-INFINITY));
  }
  static V zero_if_neg_inf(V x) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, set1(-INFINITY), _CMP_NEQ_UQ), x);
  }
  static V inv_or_one(V l) {  // 1 only where nothing was seen (l = 0); NaN stays NaN
    return _mm512_mask_div_ps(set1(1.0f), _mm512_cmp_ps_mask(l, zero(), _CMP_NEQ_UQ), set1(1.0f), l);
  }
  // The scheme of vec::exp (vec.h) on 16 lanes: e^x for x <= 0, 0 below
  // -87.3, NaN kept.
  static V exp_nonpositive(V x) {
    const __mmask16 keep = _mm512_cmp_ps_mask(x, set1(-87.3f), _CMP_NLT_UQ);
    x = _mm512_max_ps(set1(-87.3f), x);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, set1(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, set1(1.42860677e-06f), r);
    __m512 p = set1(1.f / 5040);
    for (float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f})
      p = _mm512_fmadd_ps(p, r, set1(c));
    // p * 2^n by vscalefps: the same value as building 2^n's bits and
    // multiplying (n >= -126 here), in one instruction instead of four.
    return _mm512_maskz_scalef_ps(keep, p, n);
  }
  static void widen(const float* src, float* dst, int d) {
    for (int i = 0; i < d; i += 16) {
      const __mmask16 k = d - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (d - i)) - 1);
      _mm512_mask_storeu_ps(dst + i, k, _mm512_maskz_loadu_ps(k, src + i));
    }
  }
  static void widen(const uint16_t* src, float* dst, int d) {
    for (int i = 0; i < d; i += 16) {
      const __mmask16 k = d - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (d - i)) - 1);
      _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
    }
  }
  static float half(uint16_t h) { return _cvtsh_ss(h); }
  static void widen_q8(const BlockQ8_0& b, float* dst) {  // 32 values
    const __m512 scale = _mm512_set1_ps(_cvtsh_ss(b.d));
    for (int i = 0; i < 32; i += 16) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + i));
      _mm512_storeu_ps(dst + i, _mm512_mul_ps(scale, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
    }
  }
};

}  // namespace

AttendLanesFn attend_lanes_avx512(DType type) { return attend_lanes_of<SimdAvx512>(type); }

}  // namespace depcache::detail

#else
namespace depcache::detail {
AttendLanesFn attend_lanes_avx512(DType) { return nullptr; }  // compiler without AVX-512: AVX2 stays
}  // namespace depcache::detail
#endif

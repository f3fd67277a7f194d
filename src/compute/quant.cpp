#include "compute/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compute/dot.h"
#include "compute/fp16.h"
#include "util/error.h"

namespace depcache {

void unpack_q4k_scales(const uint8_t packed[12], uint8_t sc[8], uint8_t m[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = packed[j] & 63;
    m[j] = packed[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((packed[j + 8] & 0xF) | ((packed[j] >> 6) << 4));
    m[j + 4] = static_cast<uint8_t>((packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4));
  }
}

void pack_q4k_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t packed[12]) {
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

namespace {

// ---- Portable dequantizers (the Scalar ISA, and the fallback of the others).
// Each product below is exact in fp32 (an fp16 times a small integer), so
// every element is the correctly rounded value of the format's formula.

void dequant_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, sizeof(float) * n); }

void dequant_f16(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
}

void dequant_bf16(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
}

void dequant_q8_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t k = 0; k < n / 32; ++k, ++b, dst += 32) {
    const float d = fp16_to_fp32(b->d);
    for (int i = 0; i < 32; ++i) dst[i] = d * b->qs[i];
  }
}

void dequant_q4_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t k = 0; k < n / 32; ++k, ++b, dst += 32) {
    const float d = fp16_to_fp32(b->d);
    for (int j = 0; j < 16; ++j) {
      dst[j] = d * ((b->qs[j] & 0xF) - 8);
      dst[j + 16] = d * ((b->qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_K*>(src);
  for (int64_t k = 0; k < n / 256; ++k, ++b, dst += 256) {
    uint8_t sc[8], m[8];
    unpack_q4k_scales(b->scales, sc, m);
    const float d = fp16_to_fp32(b->d), dmin = fp16_to_fp32(b->dmin);
    for (int g = 0; g < 4; ++g) {
      const uint8_t* q = b->qs + 32 * g;
      const float d1 = d * sc[2 * g], m1 = dmin * m[2 * g];
      const float d2 = d * sc[2 * g + 1], m2 = dmin * m[2 * g + 1];
      for (int l = 0; l < 32; ++l) {
        dst[64 * g + l] = d1 * (q[l] & 0xF) - m1;
        dst[64 * g + 32 + l] = d2 * (q[l] >> 4) - m2;
      }
    }
  }
}

void dequant_q6_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  for (int64_t k = 0; k < n / 256; ++k, ++b) {
    const float d = fp16_to_fp32(b->d);
    for (int h = 0; h < 2; ++h, dst += 128) {
      const uint8_t* ql = b->ql + 64 * h;
      const uint8_t* qh = b->qh + 32 * h;
      const int8_t* sc = b->scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;
        const int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = d * sc[s] * q1;
        dst[l + 32] = d * sc[s + 2] * q2;
        dst[l + 64] = d * sc[s + 4] * q3;
        dst[l + 96] = d * sc[s + 6] * q4;
      }
    }
  }
}

// ---- Quantizers: used to write test and random-weight models, not on the
// inference path, so they favour a provable error bound over speed.

// Smallest fp16 (near amax / levels) with h * levels >= amax, so that amax
// maps to at most `levels` steps and nothing is clipped. Saturates at the
// largest finite half for values fp16 cannot scale.
uint16_t fp16_scale_for(float amax, double levels) {
  uint16_t h = fp32_to_fp16(static_cast<float>(amax / levels));
  while (static_cast<double>(fp16_to_fp32(h)) * levels < amax && h < 0x7BFF) ++h;
  return h;
}

// Nearest integer in [lo, hi]; nan (from nan input) maps to lo rather than
// reaching an undefined float-to-int conversion.
int round_clamp(float v, int lo, int hi) {
  const float r = std::nearbyint(v);
  if (!(r >= static_cast<float>(lo))) return lo;
  if (r > static_cast<float>(hi)) return hi;
  return static_cast<int>(r);
}

void quant_q8_0(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t k = 0; k < n / 32; ++k, ++b, x += 32) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    b->d = fp16_scale_for(amax, 127);
    const float d = fp16_to_fp32(b->d);
    for (int i = 0; i < 32; ++i) b->qs[i] = static_cast<int8_t>(d > 0 ? round_clamp(x[i] / d, -127, 127) : 0);
  }
}

void quant_q4_0(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t k = 0; k < n / 32; ++k, ++b, x += 32) {
    // The value of largest magnitude maps to -8, so its sign gets the 16th
    // level; the other side reaches +7.
    float vmax = 0;
    for (int i = 0; i < 32; ++i)
      if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
    b->d = fp32_to_fp16(vmax / -8);
    const float d = fp16_to_fp32(b->d);
    for (int j = 0; j < 16; ++j) {
      const int lo = d != 0 ? round_clamp(x[j] / d, -8, 7) + 8 : 8;
      const int hi = d != 0 ? round_clamp(x[j + 16] / d, -8, 7) + 8 : 8;
      b->qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// Per sub-block: the min offset is rounded up and the scale rounded up so the
// whole [min(lo, 0), hi] range is covered; every element is then within half
// a step (d * sc) of its value, and the step exceeds range / 15 by at most
// d + dmin / 15.
void quant_q4_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  for (int64_t k = 0; k < n / 256; ++k, ++b, x += 256) {
    float lo[8], hi[8], off[8], span[8], step[8];
    uint8_t sc[8], m[8];
    float max_neg_lo = 0, max_span = 0;
    for (int s = 0; s < 8; ++s) {
      lo[s] = 0;  // mins are stored unsigned, so the offset can only shift down
      hi[s] = x[32 * s];
      for (int i = 0; i < 32; ++i) {
        lo[s] = std::min(lo[s], x[32 * s + i]);
        hi[s] = std::max(hi[s], x[32 * s + i]);
      }
      max_neg_lo = std::max(max_neg_lo, -lo[s]);
    }
    b->dmin = fp16_scale_for(max_neg_lo, 63);
    const float dmin = fp16_to_fp32(b->dmin);
    for (int s = 0; s < 8; ++s) {
      m[s] = dmin > 0 ? static_cast<uint8_t>(std::min(63.0, std::ceil(-lo[s] / double(dmin)))) : 0;
      off[s] = dmin * m[s];
      span[s] = hi[s] + off[s];  // >= 0 because off >= -lo >= -hi
      max_span = std::max(max_span, span[s]);
    }
    b->d = fp16_scale_for(max_span, 15 * 63);
    const float d = fp16_to_fp32(b->d);
    for (int s = 0; s < 8; ++s) {
      sc[s] = d > 0 ? static_cast<uint8_t>(std::min(63.0, std::ceil(span[s] / (15.0 * d)))) : 0;
      step[s] = d * sc[s];
    }
    pack_q4k_scales(sc, m, b->scales);
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const int s0 = 2 * g, s1 = 2 * g + 1;
        const float v0 = x[64 * g + l], v1 = x[64 * g + 32 + l];
        const int q0 = step[s0] > 0 ? round_clamp((v0 + off[s0]) / step[s0], 0, 15) : 0;
        const int q1 = step[s1] > 0 ? round_clamp((v1 + off[s1]) / step[s1], 0, 15) : 0;
        b->qs[32 * g + l] = static_cast<uint8_t>(q0 | (q1 << 4));
      }
    }
  }
}

// Symmetric per 16-element sub-block: step = d * sc >= amax / 31 (scale
// rounded up), so every element is within half a step; q - 32 uses -31..31.
void quant_q6_k(const float* x, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  for (int64_t k = 0; k < n / 256; ++k, ++b, x += 256) {
    float amax[16], max_amax = 0;
    for (int s = 0; s < 16; ++s) {
      amax[s] = 0;
      for (int i = 0; i < 16; ++i) amax[s] = std::max(amax[s], std::fabs(x[16 * s + i]));
      max_amax = std::max(max_amax, amax[s]);
    }
    b->d = fp16_scale_for(max_amax, 31 * 127);
    const float d = fp16_to_fp32(b->d);
    float step[16];
    for (int s = 0; s < 16; ++s) {
      b->scales[s] = d > 0 ? static_cast<int8_t>(std::min(127.0, std::ceil(amax[s] / (31.0 * d)))) : 0;
      step[s] = d * b->scales[s];
    }
    std::memset(b->ql, 0, sizeof b->ql);
    std::memset(b->qh, 0, sizeof b->qh);
    for (int e = 0; e < 256; ++e) {
      const int q = (step[e / 16] > 0 ? round_clamp(x[e] / step[e / 16], -32, 31) : 0) + 32;
      const int h = e / 128, r = e % 128, l = r % 32, group = r / 32;
      b->ql[64 * h + l + 32 * (group & 1)] |= static_cast<uint8_t>((q & 0xF) << (4 * (group >> 1)));
      b->qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * group));
    }
  }
}

}  // namespace

namespace detail {
void fill_scalar_dequant(KernelSet& set) {
  auto put = [&](DType t, DequantFn f) { set.by_type[static_cast<uint32_t>(t)].dequant = f; };
  put(DType::F32, dequant_f32);
  put(DType::F16, dequant_f16);
  put(DType::BF16, dequant_bf16);
  put(DType::Q8_0, dequant_q8_0);
  put(DType::Q4_0, dequant_q4_0);
  put(DType::Q4_K, dequant_q4_k);
  put(DType::Q6_K, dequant_q6_k);
}
}  // namespace detail

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  detail::kernels_for(t, n).dequant(src, dst, n);
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  detail::kernels_for(t, n);  // validates the type and n
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = fp32_to_fp16(src[i]);
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = fp32_to_bf16(src[i]);
      return;
    case DType::Q8_0:
      return quant_q8_0(src, dst, n);
    case DType::Q4_0:
      return quant_q4_0(src, dst, n);
    case DType::Q4_K:
      return quant_q4_k(src, dst, n);
    case DType::Q6_K:
      return quant_q6_k(src, dst, n);
    default:
      fail(ErrorKind::InvalidInput, "cannot quantize to tensor type {}", dtype_info(t).name);
  }
}

}  // namespace depcache

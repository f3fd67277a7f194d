#include "compute/kv_format.h"

#include <fmt/ranges.h>
#include <immintrin.h>

#include <array>
#include <cmath>
#include <cstring>

#include "compute/fp16.h"
#include "compute/quant.h"
#include "util/error.h"

namespace depcache {
namespace {

constexpr std::array kKvTypes = {DType::F16, DType::F32, DType::Q8_0};
constexpr uint16_t kF16Nan = 0x7E00;

// One block of 32: scale amax / 127 in fp16, values rounded to the nearest
// multiple of the (rounded) scale. AVX2, 8 lanes at a time; the same
// operations in the same order as a scalar loop would do them.
void encode_q8_block(const float* x, BlockQ8_0& b) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps();
  __m256 finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  for (int i = 0; i < 32; i += 8) {
    const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
    finite = _mm256_and_ps(finite, _mm256_cmp_ps(a, inf, _CMP_LT_OQ));  // false for NaN and Inf
    amax = _mm256_max_ps(amax, a);
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float a = _mm_cvtss_f32(m);
  const uint16_t d16 = fp32_to_fp16(a / 127.0f);
  const float d = fp16_to_fp32(d16);
  if (_mm256_movemask_ps(finite) != 0xFF || !std::isfinite(d)) {
    b.d = kF16Nan;
    std::memset(b.qs, 0, sizeof b.qs);
    return;
  }
  b.d = d16;
  const __m256 id = _mm256_set1_ps(d > 0 ? 1.0f / d : 0.0f);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  for (int i = 0; i < 32; i += 8) {
    __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), id),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(hi, _mm256_max_ps(lo, q));
    const __m256i q32 = _mm256_cvtps_epi32(q);
    const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(b.qs + i), _mm_packs_epi16(q16, q16));
  }
}

void decode_q8_block(const BlockQ8_0& b, int first, int n, float* dst) {
  const float d = fp16_to_fp32(b.d);
  for (int i = 0; i < n; ++i) dst[i] = d * b.qs[first + i];
}

}  // namespace

std::span<const DType> kv_types() { return kKvTypes; }

std::string kv_type_name(DType type) {
  switch (type) {
    case DType::F16:
      return "f16";
    case DType::F32:
      return "f32";
    case DType::Q8_0:
      return "q8_0";
    default:
      return std::string(dtype_info(type).name);
  }
}

std::vector<std::string> kv_type_names() {
  std::vector<std::string> names;
  for (DType t : kv_types()) names.push_back(kv_type_name(t));
  return names;
}

DType parse_kv_type(const std::string& name) {
  for (DType t : kv_types())
    if (kv_type_name(t) == name) return t;
  fail(ErrorKind::InvalidInput, "KV cache type '{}' is not supported ({})", name,
       fmt::join(kv_type_names(), ", "));
}

std::string kv_type_refusal(DType type, int64_t row_elems) {
  if (type != DType::F16 && type != DType::F32 && type != DType::Q8_0)
    return fmt::format("KV cache type {} is not supported (f16, f32, q8_0)", kv_type_name(type));
  if (row_elems < 0) return fmt::format("KV rows of {} elements", row_elems);
  if (type == DType::Q8_0 && row_elems % kQ32 != 0)
    return fmt::format(
        "KV cache type q8_0 stores rows in blocks of {} elements; this model's KV rows have {} "
        "(n_head_kv * head_dim): use f16",
        kQ32, row_elems);
  return {};
}

void require_kv_type(DType type, int64_t row_elems) {
  if (std::string why = kv_type_refusal(type, row_elems); !why.empty())
    fail(ErrorKind::InvalidInput, "{}", why);
}

size_t kv_row_bytes(DType type, int64_t row_elems) {
  require_kv_type(type, row_elems);
  return row_bytes(type, row_elems);
}

void kv_encode(DType type, const float* src, uint8_t* dst, int64_t n_rows, int64_t row_elems) {
  const int64_t n = n_rows * row_elems;
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
      for (; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::Q8_0: {
      auto* b = reinterpret_cast<BlockQ8_0*>(dst);
      for (int64_t k = 0; k < n / kQ32; ++k) encode_q8_block(src + k * kQ32, b[k]);
      return;
    }
    default:
      require_kv_type(type, row_elems);
  }
}

void kv_decode(DType type, const uint8_t* src, float* dst, int64_t n_rows, int64_t row_elems) {
  require_kv_type(type, row_elems);
  dequantize_row(type, src, dst, n_rows * row_elems);  // the ISA's kernels; q8_0 is d * q, as encoded
}

void kv_decode_part(DType type, const uint8_t* row, int64_t first, int64_t n, float* dst) {
  switch (type) {
    case DType::F32:
      std::memcpy(dst, reinterpret_cast<const float*>(row) + first, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      const auto* s = reinterpret_cast<const uint16_t*>(row) + first;
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
      return;
    }
    case DType::Q8_0: {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(row);
      for (int64_t i = 0; i < n;) {
        const int64_t e = first + i;
        const int in = static_cast<int>(e % kQ32);
        const int take = static_cast<int>(std::min<int64_t>(kQ32 - in, n - i));
        decode_q8_block(b[e / kQ32], in, take, dst + i);
        i += take;
      }
      return;
    }
    default:
      require_kv_type(type, 0);
  }
}

}  // namespace depcache

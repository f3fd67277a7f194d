#include "compute/quant_reference.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "util/error.h"

namespace depcache {
namespace {

uint16_t u16_at(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }  // little-endian

// IEEE binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
double half_value(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
  double v;
  if (exponent == 0)
    v = std::ldexp(mantissa, -24);  // subnormal: mantissa * 2^(1 - 15 - 10)
  else if (exponent == 31)
    v = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else
    v = std::ldexp(1024 + mantissa, exponent - 25);  // (1 + m/2^10) * 2^(e - 15)
  return sign ? -v : v;
}

// bfloat16: 1 sign bit, 8 exponent bits (bias 127), 7 mantissa bits.
double bf16_value(uint16_t b) {
  const int sign = b >> 15, exponent = (b >> 7) & 255, mantissa = b & 127;
  double v;
  if (exponent == 0)
    v = std::ldexp(mantissa, -133);  // subnormal: mantissa * 2^(1 - 127 - 7)
  else if (exponent == 255)
    v = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else
    v = std::ldexp(128 + mantissa, exponent - 134);  // (1 + m/2^7) * 2^(e - 127)
  return sign ? -v : v;
}

// Q8_0, 34 bytes: d (fp16) at 0, 32 signed bytes at 2.
double q8_0_element(const uint8_t* block, int e) {
  return half_value(u16_at(block)) * static_cast<int8_t>(block[2 + e]);
}

// Q4_0, 18 bytes: d (fp16) at 0, 16 bytes at 2; element e < 16 is the low
// nibble of byte e, element e >= 16 the high nibble of byte e - 16.
double q4_0_element(const uint8_t* block, int e) {
  const uint8_t byte = block[2 + e % 16];
  const int nibble = e < 16 ? (byte & 0x0F) : (byte >> 4);
  return half_value(u16_at(block)) * (nibble - 8);
}

// Q4_K, 144 bytes: d at 0, dmin at 2, 12 bytes of scales at 4, 128 bytes of
// nibbles at 16. Element e is in sub-block s = e / 32; sub-blocks 2g and 2g+1
// share bytes 32g..32g+31 of the nibbles, low and high halves.
double q4_k_element(const uint8_t* block, int e) {
  const uint8_t* scales = block + 4;
  const int s = e / 32;
  int scale, min;
  if (s < 4) {
    scale = scales[s] % 64;
    min = scales[s + 4] % 64;
  } else {
    // Low 4 bits from byte s + 4 (scale: low nibble, min: high nibble), top 2
    // bits from bits 6-7 of byte s - 4 (scale) and byte s (min).
    scale = (scales[s + 4] % 16) + (scales[s - 4] / 64) * 16;
    min = (scales[s + 4] / 16) + (scales[s] / 64) * 16;
  }
  const uint8_t byte = block[16 + 32 * (e / 64) + e % 32];
  const int q = (e % 64) < 32 ? byte % 16 : byte / 16;
  return half_value(u16_at(block)) * scale * q - half_value(u16_at(block + 2)) * min;
}

// Q6_K, 210 bytes: ql (128 bytes) at 0, qh (64) at 128, 16 signed scales at
// 192, d at 208. Within half h = e / 128, with r = e % 128, l = r % 32 and
// quarter k = r / 32: the low 4 bits are in ql[64h + l + 32 * (k % 2)], low
// nibble for k < 2 and high nibble for k >= 2; the top 2 bits are bits 2k and
// 2k+1 of qh[32h + l]. Scale = scales[e / 16].
double q6_k_element(const uint8_t* block, int e) {
  const int h = e / 128, r = e % 128, l = r % 32, k = r / 32;
  const uint8_t low_byte = block[64 * h + l + 32 * (k % 2)];
  const int low = k < 2 ? low_byte % 16 : low_byte / 16;
  const int high = (block[128 + 32 * h + l] >> (2 * k)) % 4;
  const int q = low + 16 * high;
  const int scale = static_cast<int8_t>(block[192 + e / 16]);
  return half_value(u16_at(block + 208)) * scale * (q - 32);
}

}  // namespace

void dequantize_row_f64(DType t, const void* src, double* dst, int64_t n) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  int block_size = 0, block_bytes = 0;
  double (*element)(const uint8_t*, int) = nullptr;
  switch (t) {
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, bytes + 4 * i, 4);
        dst[i] = f;
      }
      return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half_value(u16_at(bytes + 2 * i));
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_value(u16_at(bytes + 2 * i));
      return;
    case DType::Q8_0:
      block_size = 32, block_bytes = 34, element = q8_0_element;
      break;
    case DType::Q4_0:
      block_size = 32, block_bytes = 18, element = q4_0_element;
      break;
    case DType::Q4_K:
      block_size = 256, block_bytes = 144, element = q4_k_element;
      break;
    case DType::Q6_K:
      block_size = 256, block_bytes = 210, element = q6_k_element;
      break;
    default:
      fail(ErrorKind::InvalidInput, "no reference dequantizer for type {}", static_cast<uint32_t>(t));
  }
  if (n < 0 || n % block_size != 0)
    fail(ErrorKind::InvalidInput, "reference: {} is not a multiple of {}", n, block_size);
  for (int64_t i = 0; i < n; ++i)
    dst[i] = element(bytes + (i / block_size) * block_bytes, static_cast<int>(i % block_size));
}

}  // namespace depcache

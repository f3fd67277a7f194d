#pragma once
// Scalar conversions between fp32 and the two 16-bit float formats the model
// files use (IEEE binary16 and bfloat16). Plain bit manipulation, no
// intrinsics, so every layer and every ISA build can use them.
#include <bit>
#include <cstdint>

namespace depcache {

// binary16 -> fp32 is exact: every half (subnormals included) is a float.
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf, or nan with its payload
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half = mant * 2^-24: normalise so the leading one becomes
    // the implicit bit of a normal float.
    const int lead = std::bit_width(mant) - 1;  // 0..9
    mant = (mant << (10 - lead)) & 0x3FFu;
    bits = sign | (static_cast<uint32_t>(103 + lead) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

// fp32 -> binary16, round to nearest even; overflow gives inf, nan stays a
// quiet nan with the top payload bits (as the F16C instruction does).
inline uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  // 65520 is the midpoint between 65504 (max half, odd mantissa) and 2^16:
  // the tie goes to the even side, which is infinity.
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (ax >= 0x38800000u) {  // >= 2^-14: normal half
    uint32_t h = ((ax >> 23) - 112) << 10 | ((ax >> 13) & 0x3FFu);
    const uint32_t rest = ax & 0x1FFFu;
    // A carry out of the mantissa correctly bumps the exponent.
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (ax < 0x33000000u) return sign;  // below 2^-25: rounds to zero
  // Subnormal half: the value in units of 2^-24 is m >> shift.
  const uint32_t e = ax >> 23;  // 102..112
  const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t h = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;  // may become 0x400, the smallest normal
  return static_cast<uint16_t>(sign | h);
}

// bfloat16 is the top half of an fp32, so widening is a shift.
inline float bf16_to_fp32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// fp32 -> bfloat16, round to nearest even; nan is kept and made quiet so the
// truncation cannot turn it into an infinity.
inline uint16_t fp32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace depcache

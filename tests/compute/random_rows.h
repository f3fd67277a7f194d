#pragma once
// Random rows of every element type for the kernel tests: random bytes in
// every field, except fp16 scales and F16/BF16 elements, which are finite.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "compute/dtype.h"
#include "compute/fp16.h"

namespace depcache {

inline void put16(std::vector<uint8_t>& row, size_t offset, uint16_t v) { std::memcpy(&row[offset], &v, 2); }

// A finite fp16 scale of either sign spanning 2^-20..2^3 (subnormal halves
// included), so products stay finite and every format field gets exercised.
inline uint16_t random_scale(std::mt19937& rng) {
  const float v = std::exp2(std::uniform_real_distribution<float>(-20.f, 3.f)(rng));
  return fp32_to_fp16(rng() & 1 ? -v : v);
}

// Random bytes for every field, except that fp16 scales are finite (above)
// and F16/BF16 elements are finite.
inline std::vector<uint8_t> random_row(DType t, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> row(row_bytes(t, n));
  for (auto& b : row) b = static_cast<uint8_t>(rng());
  std::normal_distribution<float> normal(0.f, 4.f);
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::F32) {
      const float f = normal(rng);
      std::memcpy(&row[4 * i], &f, 4);
    } else if (t == DType::F16) {
      uint16_t h;
      do h = static_cast<uint16_t>(rng());
      while (((h >> 10) & 31) == 31);
      put16(row, 2 * i, h);
    } else if (t == DType::BF16) {  // |v| in 2^-30..2^30, 5% zero/subnormal
      const uint32_t e = rng() % 20 == 0 ? 0 : 97 + rng() % 61;
      put16(row, 2 * i, static_cast<uint16_t>((rng() & 0x8000u) | (e << 7) | (rng() & 0x7Fu)));
    }
  }
  const int64_t blocks = n / dtype_info(t).block_size;
  for (int64_t k = 0; k < blocks; ++k) {
    if (t == DType::Q8_0) put16(row, 34 * k, random_scale(rng));
    if (t == DType::Q4_0) put16(row, 18 * k, random_scale(rng));
    if (t == DType::Q4_K) put16(row, 144 * k, random_scale(rng)), put16(row, 144 * k + 2, random_scale(rng));
    if (t == DType::Q6_K) put16(row, 210 * k + 208, random_scale(rng));
  }
  return row;
}

inline std::vector<float> random_x(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}

}  // namespace depcache

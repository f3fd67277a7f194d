// Element types: fast dequantizers and dot kernels of every ISA the CPU has
// against the independent float64 reference, quantizer round trips against
// bounds derived from each format, and the fp16/bf16 conversions.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "compute/dot.h"
#include "compute/fp16.h"
#include "compute/quant.h"
#include "compute/quant_reference.h"
#include "random_rows.h"
#include "test_support.h"
#include "util/error.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace depcache {
namespace DEPCACHE_TEST_FILE {

constexpr DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                            DType::Q4_0, DType::Q4_K, DType::Q6_K};
constexpr Isa kIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512};

std::string type_name(DType t) { return std::string(dtype_info(t).name); }

// One block, three blocks, and the model widths 896 and 4864 (not powers of
// two); the dense types also get lengths that leave SIMD tails.
std::vector<int64_t> sizes_for(DType t) {
  switch (dtype_info(t).block_size) {
    case 1:
      return {1, 7, 31, 33, 896, 4864, 4867};
    case 32:
      return {32, 96, 896, 4864};
    default:
      return {256, 768, 2816, 4864};  // 896 is not a multiple of 256
  }
}

// ---- Parameterised over (ISA, type); ISAs the CPU lacks are skipped.

class KernelTest : public ::testing::TestWithParam<std::tuple<Isa, DType>> {
 protected:
  void SetUp() override {
    const Isa isa = std::get<0>(GetParam());
    if (!isa_supported(isa)) DEPCACHE_SKIP_CPU(test::isa_missing_reason(isa));
    set_isa(isa);
    ASSERT_EQ(current_isa(), isa);
  }
  void TearDown() override { set_isa(saved_); }
  DType type() const { return std::get<1>(GetParam()); }
  std::string label(int64_t n) const {
    return type_name(type()) + "/" + std::string(isa_name(std::get<0>(GetParam()))) +
           "/n=" + std::to_string(n);
  }
  Isa saved_ = current_isa();
};

// (a) Every kernel computes the format's formula with a single fp32 rounding
// at the end (each partial product is exact in fp32), so the result equals the
// float64 value up to float rounding: 1e-6 relative is ~17 half-ulps of room.
TEST_P(KernelTest, DequantizeMatchesReference) {
  std::mt19937 rng(1234);
  for (int64_t n : sizes_for(type())) {
    const std::vector<uint8_t> row = random_row(type(), n, rng);
    std::vector<double> ref(n);
    std::vector<float> fast(n), ref_f(n);
    dequantize_row_f64(type(), row.data(), ref.data(), n);
    dequantize_row(type(), row.data(), fast.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ref_f[i] = static_cast<float>(ref[i]);
      ASSERT_LE(std::fabs(fast[i] - ref[i]), 1e-6 * std::fabs(ref[i])) << label(n) << " element " << i;
    }
    test::max_abs_diff(fast.data(), ref_f.data(), n, "dequantize " + label(n));
  }
}

// (b) quantize -> dequantize stays within the bound each quantizer is built
// for; see the per-type comments.
TEST_P(KernelTest, QuantizeRoundTrip) {
  std::mt19937 rng(99);
  const DType t = type();
  const int64_t bs = dtype_info(t).block_size;
  for (int64_t n : sizes_for(t)) {
    // Sub-blocks of 16 with ranges spread over 2^-6..2^6, so the per-block
    // scales and the super-block scales of the K types all matter.
    std::vector<float> x(n);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> exponent(-6.f, 6.f);
    for (int64_t i = 0; i < n; i += 16) {
      const float scale = std::exp2(exponent(rng)), shift = rng() % 4 == 0 ? 2 * scale : 0;
      for (int64_t j = i; j < std::min(n, i + 16); ++j) x[j] = shift + scale * normal(rng);
    }
    if (n >= 2 * bs)
      for (int64_t j = 0; j < bs; ++j) x[j] = 0;  // an all-zero block must come back exact
    std::vector<uint8_t> q(row_bytes(t, n));
    std::vector<float> y(n);
    quantize_row(t, x.data(), q.data(), n);
    dequantize_row(t, q.data(), y.data(), n);
    test::max_abs_diff(x.data(), y.data(), n, "round trip " + label(n));

    for (int64_t b0 = 0; b0 < n; b0 += bs) {
      const float* xb = x.data() + b0;
      const float* yb = y.data() + b0;
      const uint8_t* qb = q.data() + (b0 / bs) * dtype_info(t).block_bytes;
      double amax = 0;
      for (int64_t j = 0; j < bs; ++j) amax = std::max(amax, double(std::fabs(xb[j])));
      const double slack = 1e-6 * amax;  // fp32 rounding inside the quantizer
      auto err = [&](int64_t j) { return std::fabs(double(xb[j]) - double(yb[j])); };
      switch (t) {
        case DType::F32:
          for (int64_t j = 0; j < bs; ++j) ASSERT_EQ(xb[j], yb[j]);
          break;
        case DType::F16:  // half ulp: 2^-11 relative, or 2^-25 among subnormals
          for (int64_t j = 0; j < bs; ++j)
            ASSERT_LE(err(j), std::max(std::ldexp(std::fabs(double(xb[j])), -11), 0x1p-25));
          break;
        case DType::BF16:  // half ulp of an 8-bit significand
          for (int64_t j = 0; j < bs; ++j) ASSERT_LE(err(j), std::ldexp(std::fabs(xb[j]), -8));
          break;
        case DType::Q8_0: {
          // d is amax/127 rounded up to fp16 (so nothing clips): at most 2^-10
          // above; every element is then within d/2.
          const auto& b = *reinterpret_cast<const BlockQ8_0*>(qb);
          const double d = fp16_to_fp32(b.d);
          ASSERT_LE(d, amax / 127 * (1 + 0x1p-10) + 0x1p-24) << label(n);
          for (int64_t j = 0; j < bs; ++j) ASSERT_LE(err(j), 0.5 * d + slack) << label(n) << " " << b0 + j;
          break;
        }
        case DType::Q4_0: {
          // d = -vmax/8 (nearest fp16): 16 levels from -8d to 7d. Elements are
          // within d/2, except those of the other sign beyond 7.5d, which clip
          // to 7d: within |x| - 7|d| <= (1 + 2^-8)|d|.
          const auto& b = *reinterpret_cast<const BlockQ4_0*>(qb);
          const double d = std::fabs(fp16_to_fp32(b.d));
          ASSERT_LE(d, amax / 8 * (1 + 0x1p-11) + 0x1p-24) << label(n);
          for (int64_t j = 0; j < bs; ++j)
            ASSERT_LE(err(j), std::max(0.5 * d, std::fabs(xb[j]) - 7 * d) + slack)
                << label(n) << " " << b0 + j;
          break;
        }
        case DType::Q4_K: {
          // Per 32-element sub-block s with range R = max - min(min, 0): the
          // min offset and the scale are rounded up so the range is covered,
          // hence |err| <= step/2 with step = d * sc[s], and the step wastes
          // at most one unit of each 6-bit field: step <= (R + dmin)/15 + d.
          const auto& b = *reinterpret_cast<const BlockQ4_K*>(qb);
          uint8_t sc[8], m[8];
          unpack_q4k_scales(b.scales, sc, m);
          const double d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
          for (int s = 0; s < 8; ++s) {
            double lo = 0, hi = xb[32 * s];
            for (int j = 0; j < 32; ++j)
              lo = std::min(lo, double(xb[32 * s + j])), hi = std::max(hi, double(xb[32 * s + j]));
            const double step = d * sc[s];
            ASSERT_LE(step, (hi - lo + dmin) / 15 + d + slack) << label(n) << " sub-block " << s;
            for (int j = 0; j < 32; ++j)
              ASSERT_LE(err(32 * s + j), 0.5 * step + slack) << label(n) << " " << b0 + 32 * s + j;
          }
          ASSERT_LE(dmin, amax / 63 * (1 + 0x1p-10) + 0x1p-24) << label(n);
          break;
        }
        case DType::Q6_K: {
          // Symmetric per 16-element sub-block: step = d * sc[s] >= amax_s/31
          // (rounded up, nothing clips), so |err| <= step/2, and the step
          // exceeds amax_s/31 by at most one unit of the 8-bit scale, d.
          const auto& b = *reinterpret_cast<const BlockQ6_K*>(qb);
          const double d = fp16_to_fp32(b.d);
          ASSERT_LE(d, amax / (31 * 127) * (1 + 0x1p-10) + 0x1p-24) << label(n);
          for (int s = 0; s < 16; ++s) {
            double amax_s = 0;
            for (int j = 0; j < 16; ++j) amax_s = std::max(amax_s, double(std::fabs(xb[16 * s + j])));
            const double step = d * b.scales[s];
            ASSERT_LE(step, amax_s / 31 + d + slack) << label(n) << " sub-block " << s;
            for (int j = 0; j < 16; ++j)
              ASSERT_LE(err(16 * s + j), 0.5 * step + slack) << label(n) << " " << b0 + 16 * s + j;
          }
          break;
        }
        default:
          FAIL() << "untested type";
      }
    }
    if (n >= 2 * bs) {
      for (int64_t j = 0; j < bs; ++j) ASSERT_EQ(y[j], 0.f) << label(n);
    }
  }
}

// (c) Tolerance: for any summation order, an fp32 sum of n products with
// fused or separate roundings is within gamma_n * sum|w_i x_i| of the exact
// value (gamma_n = n*u/(1 - n*u), u = 2^-24, Higham 2002 §3.1); the
// dequantized weights add at most u * sum|w_i x_i|. (n + 2) * FLT_EPSILON =
// 2(n + 2)u covers both. x is read from an odd address to exercise
// unaligned loads.
TEST_P(KernelTest, DotMatchesReference) {
  std::mt19937 rng(777);
  for (int64_t n : sizes_for(type())) {
    const std::vector<uint8_t> row = random_row(type(), n, rng);
    std::vector<float> xbuf = random_x(n + 1, rng);
    const float* x = xbuf.data() + 1;
    std::vector<double> w(n);
    dequantize_row_f64(type(), row.data(), w.data(), n);
    double exact = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) exact += w[i] * x[i], mag += std::fabs(w[i] * x[i]);
    const double tol = (n + 2) * double(FLT_EPSILON) * mag;
    const double got = dot_row(type(), row.data(), x, n);
    EXPECT_LE(std::fabs(got - exact), tol) << label(n) << " got " << got << " want " << exact;
    std::printf("[check] dot %s: |err| = %.3g, tolerance %.3g (sum|wx| = %.3g)\n", label(n).c_str(),
                std::fabs(got - exact), tol, mag);
  }
}

// A one-hot x picks out one weight: the sum of exact zeros plus w_k is exact,
// so this pins every element's position in the dot kernels, which a random x
// with a tolerance cannot.
TEST_P(KernelTest, DotOneHotPicksEachElement) {
  std::mt19937 rng(5);
  const int64_t n = dtype_info(type()).block_size == 1 ? 45 : 2 * dtype_info(type()).block_size;
  const std::vector<uint8_t> row = random_row(type(), n, rng);
  std::vector<float> w(n), x(n, 0.f);
  dequantize_row(type(), row.data(), w.data(), n);
  for (int64_t k = 0; k < n; ++k) {
    x[k] = 1.f;
    ASSERT_EQ(dot_row(type(), row.data(), x.data(), n), w[k]) << label(n) << " element " << k;
    x[k] = 0.f;
  }
}

// dequantize_rows with padded rows equals row-by-row dequantize_row, and one
// row is just a row.
TEST_P(KernelTest, DequantizeRowsHonoursStride) {
  std::mt19937 rng(11);
  const int64_t n = dtype_info(type()).block_size == 256 ? 768 : 96, rows = 5;
  const size_t rb = row_bytes(type(), n), stride = rb + 6;  // even padding keeps 2-byte alignment
  std::vector<uint8_t> panel(stride * rows);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<uint8_t> row = random_row(type(), n, rng);
    std::memcpy(panel.data() + r * stride, row.data(), rb);
  }
  std::vector<float> all(n * rows), one(n);
  dequantize_rows(type(), panel.data(), stride, rows, n, all.data());
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(type(), panel.data() + r * stride, one.data(), n);
    ASSERT_EQ(0, std::memcmp(one.data(), all.data() + r * n, n * sizeof(float))) << label(n) << " row " << r;
  }
  dequantize_rows(type(), panel.data(), stride, 1, n, all.data());
  dequantize_row(type(), panel.data(), one.data(), n);
  ASSERT_EQ(0, std::memcmp(one.data(), all.data(), n * sizeof(float))) << label(n) << " single row";
}

INSTANTIATE_TEST_SUITE_P(AllIsasAndTypes, KernelTest,
                         ::testing::Combine(::testing::ValuesIn(kIsas), ::testing::ValuesIn(kTypes)),
                         [](const auto& info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" +
                                  type_name(std::get<1>(info.param));
                         });

// Every kernel rounds once from the exact value, so all ISAs must agree
// exactly on dequantized weights (compared as values: a zero weight may come
// out as +0 from a fused d*q - 8d and as -0 from d*0 with d < 0).
TEST(Kernels, IsasAgreeExactly) {
  const Isa saved = current_isa();
  std::mt19937 rng(3);
  for (DType t : kTypes) {
    const int64_t n = 4864;
    const std::vector<uint8_t> row = random_row(t, n, rng);
    std::vector<float> base(n), other(n);
    set_isa(Isa::Scalar);
    dequantize_row(t, row.data(), base.data(), n);
    for (Isa isa : kIsas) {
      if (!test::isa_available(isa)) continue;
      set_isa(isa);
      dequantize_row(t, row.data(), other.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(base[i], other[i]) << type_name(t) << " " << isa_name(isa) << " " << i;
    }
  }
  set_isa(saved);
}

// All 65536 half and bfloat16 bit patterns through each ISA's dequantizer.
TEST(Kernels, DequantizeEverySixteenBitPattern) {
  const Isa saved = current_isa();
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<double> ref(65536);
  std::vector<float> fast(65536);
  for (DType t : {DType::F16, DType::BF16}) {
    dequantize_row_f64(t, all.data(), ref.data(), 65536);
    for (Isa isa : kIsas) {
      if (!test::isa_available(isa)) continue;
      set_isa(isa);
      dequantize_row(t, all.data(), fast.data(), 65536);
      for (uint32_t i = 0; i < 65536; ++i) {
        if (std::isnan(ref[i])) {
          ASSERT_TRUE(std::isnan(fast[i])) << type_name(t) << " " << isa_name(isa) << " " << i;
        } else {
          ASSERT_EQ(double(fast[i]), ref[i]) << type_name(t) << " " << isa_name(isa) << " " << i;
        }
      }
    }
  }
  set_isa(saved);
}

TEST(Kernels, BadLengthsAndTypesThrow) {
  std::vector<uint8_t> buf(4096);
  std::vector<float> f(1024);
  auto expect_invalid = [](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << what;
    }
  };
  expect_invalid([&] { dequantize_row(DType::Q8_0, buf.data(), f.data(), 33); }, "Q8_0 n=33");
  expect_invalid([&] { dequantize_row(DType::Q4_K, buf.data(), f.data(), 128); }, "Q4_K n=128");
  expect_invalid([&] { quantize_row(DType::Q6_K, f.data(), buf.data(), 300); }, "quantize Q6_K n=300");
  expect_invalid([&] { quantize_row(DType::Q4_0, f.data(), buf.data(), 16); }, "quantize Q4_0 n=16");
  expect_invalid([&] { dot_row(DType::Q4_0, buf.data(), f.data(), 31); }, "dot Q4_0 n=31");
  expect_invalid([&] { dot_row(DType::F32, buf.data(), f.data(), -1); }, "dot F32 n=-1");
  expect_invalid([&] { dequantize_rows(DType::Q6_K, buf.data(), 210, 2, 255, f.data()); }, "rows Q6_K n=255");
  expect_invalid([&] { dot_row(DType::Q5_0, buf.data(), f.data(), 32); }, "dot Q5_0 (no kernels)");
  expect_invalid([&] { dequantize_row(DType::Q8_K, buf.data(), f.data(), 256); }, "dequantize Q8_K");
  std::vector<double> d(256);
  expect_invalid([&] { dequantize_row_f64(DType::Q8_0, buf.data(), d.data(), 40); }, "reference Q8_0 n=40");
}

TEST(Kernels, IsaSelection) {
  EXPECT_EQ(isa_from_name("AVX2"), Isa::Avx2);
  EXPECT_EQ(isa_from_name("scalar"), Isa::Scalar);
  EXPECT_EQ(isa_from_name("avx512"), Isa::Avx512);
  EXPECT_EQ(isa_from_name("sse"), std::nullopt);
  EXPECT_TRUE(isa_supported(Isa::Scalar));
  EXPECT_TRUE(isa_supported(best_isa()));
  std::printf("[info] best ISA on this machine: %s\n", std::string(isa_name(best_isa())).c_str());
  if (best_isa() != Isa::Avx512) {
    EXPECT_THROW(set_isa(Isa::Avx512), Error);
  }
}

// ---- (d) fp16 / bf16 conversions.

// binary16 value from its fields, independent of fp16.h.
double half_bits_value(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return h & 0x8000 ? -v : v;
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = fp16_to_fp32(h);
    if (((h >> 10) & 31) == 31 && (h & 1023)) {  // nan: stays nan, made quiet, payload kept
      ASSERT_TRUE(std::isnan(f)) << i;
      ASSERT_EQ(fp32_to_fp16(f), h | 0x0200) << i;
      continue;
    }
    if (((h >> 10) & 31) != 31) {
      ASSERT_EQ(double(f), half_bits_value(h)) << i;
    }
    ASSERT_EQ(fp32_to_fp16(f), h) << i;
#if defined(__F16C__)
    ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(_cvtsh_ss(h))) << i;
#endif
  }
  EXPECT_EQ(fp16_to_fp32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_fp32(0xFC00), -std::numeric_limits<float>::infinity());
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(0.1f), 0x2E66);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3C00);      // tie, 0x3C00 is even
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie, rounds up to even
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65519.99f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);  // tie with 2^16 goes to even: inf
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);  // tie with zero goes to even
  EXPECT_EQ(fp32_to_fp16(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(fp32_to_fp16(3 * 0x1p-25f), 0x0002);        // 1.5 units: tie to 2
  EXPECT_EQ(fp32_to_fp16(1023.5f * 0x1p-24f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()) & 0x7E00, 0x7E00);
  EXPECT_EQ(fp32_to_fp16(std::bit_cast<float>(0x7F800001u)), 0x7E00);  // signalling nan made quiet, not inf
}

#if defined(__F16C__)
// The hardware converter is an independent oracle over a sweep of all float
// bit patterns (every 4093rd, a prime step, so all exponents and low bits
// vary), nan included.
TEST(Fp16, MatchesF16CConversion) {
  for (uint64_t bits = 0; bits < (1ull << 32); bits += 4093) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
    ASSERT_EQ(fp32_to_fp16(f), _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) << std::hex << bits;
  }
}
#endif

TEST(Bf16, EveryBf16RoundTrips) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<uint16_t>(i);
    const float f = bf16_to_fp32(b);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), i << 16);
    if (std::isnan(f)) {
      ASSERT_EQ(fp32_to_bf16(f), b | 0x0040) << i;
    } else {
      ASSERT_EQ(fp32_to_bf16(f), b) << i;
    }
  }
}

TEST(Bf16, RoundsToNearestEven) {
  auto from_bits = [](uint32_t u) { return std::bit_cast<float>(u); };
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7F7FFFFFu)), 0x7F80);  // max float rounds to inf
  EXPECT_EQ(fp32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7F800001u)), 0x7FC0);  // nan whose payload is all truncated
  EXPECT_EQ(fp32_to_bf16(from_bits(0xFFC12345u)), 0xFFC1);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00008000u)), 0x0000);  // subnormal tie to even
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00018000u)), 0x0002);
}

// Nearest-even checked against the neighbours for random finite floats.
TEST(Bf16, RandomValuesRoundToNearest) {
  std::mt19937 rng(42);
  for (int it = 0; it < 1000000; ++it) {
    const uint32_t u = rng();
    const float f = std::bit_cast<float>(u);
    if (!std::isfinite(f) || (u & 0x7FFFFFFFu) >= 0x7F7F8000u) continue;  // skip nan/inf and overflow
    const uint16_t b = fp32_to_bf16(f);
    const double err = std::fabs(double(bf16_to_fp32(b)) - f);
    for (int step : {-1, 1}) {
      const auto nb = static_cast<uint16_t>(b + step);
      if ((nb & 0x8000) != (b & 0x8000) || !std::isfinite(bf16_to_fp32(nb))) continue;
      const double nerr = std::fabs(double(bf16_to_fp32(nb)) - f);
      ASSERT_LE(err, nerr) << std::hex << u;
      if (err == nerr) {
        ASSERT_EQ(b & 1, 0) << std::hex << u;
      }
    }
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

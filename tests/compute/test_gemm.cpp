// Panel layout and panel GEMM kernels of every ISA the CPU has, against the
// float64 reference dequantizer, on odd shapes: one row, rows that leave a
// part-filled panel, token counts that leave part-filled tiles of every
// width, inputs that are not a multiple of any vector length.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "compute/dot.h"
#include "compute/fp16.h"
#include "compute/matmul.h"
#include "compute/packed_matrix.h"
#include "compute/quant_reference.h"
#include "random_rows.h"
#include "test_support.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

constexpr DType kPanelTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                                 DType::Q4_K, DType::Q4_0, DType::Q6_K};
constexpr Isa kIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512};

std::vector<int64_t> inputs_for(DType t) {
  switch (dtype_info(t).block_size) {
    case 1:
      return {1, 7, 33, 896};
    case 32:
      return {32, 96, 896};
    default:
      return {256, 768};
  }
}

// A weight matrix in file rows, its float64 values and its panels.
struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<double> values;  // n_out x n_in
  WeightMatrix w;

  TestMatrix(DType t, int64_t n_in, int64_t n_out, std::mt19937& rng) {
    const size_t rb = row_bytes(t, n_in);
    values.resize(n_in * n_out);
    for (int64_t r = 0; r < n_out; ++r) {
      const std::vector<uint8_t> row = random_row(t, n_in, rng);
      bytes.insert(bytes.end(), row.begin(), row.end());
      dequantize_row_f64(t, row.data(), values.data() + r * n_in, n_in);
    }
    w = {t, n_in, n_out, bytes.data(), rb, nullptr};
    w.packed = std::make_shared<const PackedMatrix>(w);
  }
};

// y[t][r] against the exact sum, with the bound of the dot tests (fp32
// summation in any order: (n + 2) * FLT_EPSILON * sum|w x|), plus `underflow`
// per operation for products that underflow: one subnormal step, or the
// smallest normal where the instruction flushes subnormals to zero.
void expect_matches(const TestMatrix& m, const float* x, int64_t xs, int64_t n_tok, const float* y,
                    int64_t ys, const std::string& label, double underflow = FLT_TRUE_MIN) {
  const int64_t n_in = m.w.n_in;
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t r = 0; r < m.w.n_out; ++r) {
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < n_in; ++k) {
        const double p = m.values[r * n_in + k] * x[t * xs + k];
        exact += p, mag += std::fabs(p);
      }
      const double tol = (n_in + 2) * (double(FLT_EPSILON) * mag + underflow);
      ASSERT_LE(std::fabs(y[t * ys + r] - exact), tol)
          << label << " token " << t << " row " << r << " got " << y[t * ys + r] << " want " << exact;
    }
}

class PanelTest : public ::testing::TestWithParam<std::tuple<Isa, DType>> {
 protected:
  void SetUp() override {
    const Isa isa = std::get<0>(GetParam());
    if (!isa_supported(isa)) DEPCACHE_SKIP_CPU(test::isa_missing_reason(isa));
    set_isa(isa);
  }
  void TearDown() override { set_isa(saved_); }
  DType type() const { return std::get<1>(GetParam()); }
  Isa saved_ = current_isa();
};

// Packing moves values, it does not compute them: every weight read back
// from the panels equals the exact value (the formulas are exact in fp32
// before their one rounding), and rows past n_out are zero.
TEST_P(PanelTest, PackingKeepsEveryValue) {
  std::mt19937 rng(11);
  for (int64_t n_in : inputs_for(type())) {
    const TestMatrix m(type(), n_in, 45, rng);
    const PackedMatrix& p = *m.w.packed;
    ASSERT_EQ(p.n_panels(), 2);
    for (int64_t r = 0; r < 2 * kPanelRows; ++r)
      for (int64_t k = 0; k < n_in; ++k) {
        const float got = panel_value(type(), p.panel(r / kPanelRows), r % kPanelRows, k);
        const float want = r < 45 ? static_cast<float>(m.values[r * n_in + k]) : 0.0f;
        ASSERT_EQ(got, want) << "row " << r << " input " << k << " n_in " << n_in;
      }
  }
}

// Strided x and y, read from an odd address; y's padding columns must stay
// untouched (the masked stores of a part-filled panel).
TEST_P(PanelTest, GemmMatchesReference) {
  std::mt19937 rng(23);
  const std::string isa(isa_name(std::get<0>(GetParam())));
  for (int64_t n_in : inputs_for(type()))
    for (int64_t n_out : {1, 17, 32, 45})
      for (int64_t n_tok : {1, 2, 7, 13, 29}) {
        const TestMatrix m(type(), n_in, n_out, rng);
        const int64_t xs = n_in + 3, ys = n_out + 5;
        std::vector<float> xbuf = random_x(n_tok * xs + 1, rng);
        const float* x = xbuf.data() + 1;
        constexpr float kSentinel = -12345.0f;
        std::vector<float> y(n_tok * ys, kSentinel);
        const PackedMatrix& p = *m.w.packed;
        for (int64_t pi = 0; pi < p.n_panels(); ++pi)
          panel_gemm(type(), p.panel(pi), n_in, x, xs, n_tok, y.data() + pi * kPanelRows, ys,
                     static_cast<int>(std::min<int64_t>(kPanelRows, n_out - pi * kPanelRows)));
        const std::string label = isa + "/" + std::string(dtype_info(type()).name) + " n_in " +
                                  std::to_string(n_in) + " n_out " + std::to_string(n_out) + " tokens " +
                                  std::to_string(n_tok);
        expect_matches(m, x, xs, n_tok, y.data(), ys, label);
        for (int64_t t = 0; t < n_tok; ++t)
          for (int64_t c = n_out; c < ys; ++c)
            ASSERT_EQ(y[t * ys + c], kSentinel) << label << " wrote padding";
        if (HasFatalFailure()) return;
      }
}

INSTANTIATE_TEST_SUITE_P(AllIsasAndTypes, PanelTest,
                         ::testing::Combine(::testing::ValuesIn(kIsas), ::testing::ValuesIn(kPanelTypes)),
                         [](const auto& info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" +
                                  std::string(dtype_info(std::get<1>(info.param)).name);
                         });

// The threaded matmul over panels: decode (runs of panels per thread) and
// prefill (panels, or token chunks when panels are few) cover every output
// once, for token counts around the chunk sizes.
TEST(PanelMatmul, EveryThreadSplitCoversTheOutput) {
  std::mt19937 rng(5);
  ThreadPool pool(2);
  std::vector<float> scratch;
  for (int64_t n_out : {40, 200, 1000})
    for (int64_t n_tok : {1, 3, 4, 61, 130}) {
      const TestMatrix m(DType::F16, 64, n_out, rng);
      const std::vector<float> x = random_x(n_tok * 64, rng);
      std::vector<float> y(n_tok * n_out, NAN);
      matmul(m.w, x.data(), n_tok, y.data(), pool, scratch);
      expect_matches(m, x.data(), 64, n_tok, y.data(), n_out,
                     "n_out " + std::to_string(n_out) + " tokens " + std::to_string(n_tok));
      if (HasFatalFailure()) return;
    }
}

// Int8 activations: quantization within half a step of x, and the int8
// kernels equal to float64 arithmetic on the quantized activations (weights
// times d * q), up to fp32 summation.
TEST(Int8Activations, QuantizationIsWithinHalfAStep) {
  std::mt19937 rng(3);
  std::vector<float> x = random_x(5 * 96, rng);
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block
  std::vector<int8_t> q(x.size());
  std::vector<float> xs(5 * 3 * kActScales);
  quantize_activations(x.data(), 5, 96, q.data(), xs.data());
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t b = 0; b < 3; ++b) {
      const float* sc = &xs[(t * 3 + b) * kActScales];
      const float d = sc[0];
      float amax = 0;
      int sum = 0, half[2] = {0, 0};
      for (int64_t i = 0; i < 32; ++i) {
        const int64_t at = t * 96 + b * 32 + i;
        amax = std::max(amax, std::fabs(x[at]));
        EXPECT_LE(std::fabs(x[at] - d * q[at]), 0.5f * d * (1 + 1e-5f) + FLT_TRUE_MIN) << "element " << at;
        EXPECT_LE(std::abs(int{q[at]}), 127);
        sum += q[at];
        half[i / 16] += q[at];
      }
      EXPECT_FLOAT_EQ(d, amax / 127);
      EXPECT_FLOAT_EQ(sc[1], d * static_cast<float>(sum));
      EXPECT_FLOAT_EQ(sc[2], d * static_cast<float>(half[0]));
      EXPECT_FLOAT_EQ(sc[3], d * static_cast<float>(half[1]));
    }
  EXPECT_EQ(xs[kActScales], 0.0f);  // token 0, block 1: zeros
  EXPECT_THROW(quantize_activations(x.data(), 1, 33, q.data(), xs.data()), Error);
}

void int8_kernels_match_quantized_reference(std::string_view isa);

// Every ISA with int8 kernels: AVX2 (vpmaddubsw) everywhere, AVX-512 where
// the CPU has VNNI.
TEST(Int8Activations, KernelsMatchQuantizedReference) {
  const Isa saved = current_isa();
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (!test::isa_available(isa)) continue;
    set_isa(isa);
    if (!has_int8_panels(DType::Q8_0)) {
      ASSERT_EQ(isa, Isa::Avx512) << "AVX2 always has int8 kernels";
      set_isa(saved);
      DEPCACHE_SKIP_CPU("this CPU has no AVX-512 VNNI");
    }
    int8_kernels_match_quantized_reference(isa_name(isa));
  }
  set_isa(saved);
}

void int8_kernels_match_quantized_reference(std::string_view isa) {
  std::mt19937 rng(41);
  for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q4_0, DType::Q6_K})
    for (int64_t n_in : inputs_for(t))
      for (int64_t n_out : {1, 17, 45})
        for (int64_t n_tok : {1, 4, 5, 6, 7, 13, 29}) {
          const TestMatrix m(t, n_in, n_out, rng);
          const std::vector<float> x = random_x(n_tok * n_in, rng);
          std::vector<int8_t> xq(x.size());
          std::vector<float> xs(n_tok * n_in / 32 * kActScales);
          quantize_activations(x.data(), n_tok, n_in, xq.data(), xs.data());
          std::vector<float> xhat(x.size());
          for (int64_t i = 0; i < n_tok * n_in; ++i) xhat[i] = xs[(i / 32) * kActScales] * xq[i];
          const int64_t ys = n_out + 3;
          std::vector<float> y(n_tok * ys, -1.0f);
          const PackedMatrix& p = *m.w.packed;
          for (int64_t pi = 0; pi < p.n_panels(); ++pi)
            panel_gemm_i8(t, p.panel(pi), n_in, xq.data(), xs.data(), n_tok, y.data() + pi * kPanelRows, ys,
                          static_cast<int>(std::min<int64_t>(kPanelRows, n_out - pi * kPanelRows)));
          expect_matches(m, xhat.data(), n_in, n_tok, y.data(), ys,
                         std::string(isa) + " " + std::string(dtype_info(t).name) + " int8 n_in " +
                             std::to_string(n_in) + " n_out " + std::to_string(n_out) + " tokens " +
                             std::to_string(n_tok));
          for (int64_t i = 0; i < n_tok; ++i)
            for (int64_t c = n_out; c < ys; ++c) ASSERT_EQ(y[i * ys + c], -1.0f) << "wrote padding";
          if (::testing::Test::HasFatalFailure()) return;
        }
}

// BF16 products: activations rounded to the nearest even bfloat16 (nan
// kept a nan, infinities kept), a row's odd length padded with one zero.
TEST(Bf16Products, ActivationsRoundToNearestEven) {
  const float one_up = std::bit_cast<float>(0x3F808000u);    // half way between two bf16: 1 + 2^-8
  const float three_up = std::bit_cast<float>(0x3F818000u);  // half way, odd below: rounds up
  const std::vector<float> x = {
      1.0f, one_up, three_up, std::bit_cast<float>(0x3F808001u), -2.5f, INFINITY, -INFINITY, NAN, 1e-40f};
  const int64_t n = static_cast<int64_t>(x.size());
  ASSERT_EQ(bf16_row_length(n), n + 1);
  std::vector<uint16_t> xb(2 * (n + 1), 0xFFFF);
  std::vector<float> two(x);
  two.insert(two.end(), x.begin(), x.end());
  round_activations_bf16(two.data(), 2, n, xb.data());
  for (int t = 0; t < 2; ++t) {
    const uint16_t* b = xb.data() + t * (n + 1);
    EXPECT_EQ(b[0], 0x3F80);
    EXPECT_EQ(b[1], 0x3F80) << "a tie rounds to the even neighbour";
    EXPECT_EQ(b[2], 0x3F82) << "a tie rounds to the even neighbour";
    EXPECT_EQ(b[3], 0x3F81) << "past the tie rounds up";
    EXPECT_EQ(bf16_to_fp32(b[4]), -2.5f);
    EXPECT_EQ(bf16_to_fp32(b[5]), INFINITY);
    EXPECT_EQ(bf16_to_fp32(b[6]), -INFINITY);
    EXPECT_TRUE(std::isnan(bf16_to_fp32(b[7])));
    EXPECT_EQ(b[n], 0) << "the padding of an odd row";
  }
  EXPECT_EQ(bf16_row_length(896), 896);
}

// The kernels against float64 arithmetic on the rounded values (weights
// from panel_value_bf16, activations as rounded), up to fp32 summation, on
// every shape of the panel tests: odd input counts included.
TEST(Bf16Products, KernelsMatchRoundedReference) {
  const Isa saved = current_isa();
  if (!test::isa_available(Isa::Avx512)) DEPCACHE_SKIP_CPU(test::isa_missing_reason(Isa::Avx512));
  set_isa(Isa::Avx512);
  if (!has_bf16_panels(DType::BF16)) {
    set_isa(saved);
    DEPCACHE_SKIP_CPU("this CPU has no AVX512-BF16");
  }
  std::mt19937 rng(43);
  for (DType t : {DType::BF16, DType::F16})
    for (int64_t n_in : inputs_for(t))
      for (int64_t n_out : {1, 17, 45})
        for (int64_t n_tok : {1, 2, 7, 12, 13, 29}) {
          TestMatrix m(t, n_in, n_out, rng);
          const PackedMatrix& p = *m.w.packed;
          for (int64_t r = 0; r < n_out; ++r)
            for (int64_t k = 0; k < n_in; ++k) {
              double& v = m.values[r * n_in + k];
              v = bf16_product_operand(static_cast<float>(v));
              ASSERT_EQ(panel_value_bf16(t, p.panel(r / kPanelRows), r % kPanelRows, k), v);
            }
          const std::vector<float> x = random_x(n_tok * n_in, rng);
          const int64_t len = bf16_row_length(n_in);
          std::vector<uint16_t> xb(n_tok * len);
          round_activations_bf16(x.data(), n_tok, n_in, xb.data());
          std::vector<float> xhat(x.size());
          for (int64_t i = 0; i < n_tok; ++i)
            for (int64_t k = 0; k < n_in; ++k)
              xhat[i * n_in + k] = bf16_product_operand(bf16_to_fp32(xb[i * len + k]));
          const int64_t ys = n_out + 3;
          std::vector<float> y(n_tok * ys, -1.0f);
          for (int64_t pi = 0; pi < p.n_panels(); ++pi)
            panel_gemm_bf16(t, p.panel(pi), n_in, xb.data(), n_tok, y.data() + pi * kPanelRows, ys,
                            static_cast<int>(std::min<int64_t>(kPanelRows, n_out - pi * kPanelRows)));
          expect_matches(m, xhat.data(), n_in, n_tok, y.data(), ys,
                         std::string(dtype_info(t).name) + " bf16 n_in " + std::to_string(n_in) + " n_out " +
                             std::to_string(n_out) + " tokens " + std::to_string(n_tok),
                         FLT_MIN);
          for (int64_t i = 0; i < n_tok; ++i)
            for (int64_t c = n_out; c < ys; ++c) ASSERT_EQ(y[i * ys + c], -1.0f) << "wrote padding";
          if (HasFatalFailure()) return set_isa(saved);
        }
  set_isa(saved);
}

// Through matmul: on, BF16 and F16 matrices give the rounded products (in
// decode and prefill splits), F32 ones stay exact; off, all are exact.
TEST(Bf16Products, MatmulRoundsOnlyWhenOnAndOnlyItsTypes) {
  const bool saved = bf16_products();
  std::mt19937 rng(47);
  ThreadPool pool(2);
  std::vector<float> scratch;
  for (bool on : {false, true}) {
    set_bf16_products(on);
    for (DType t : {DType::BF16, DType::F16, DType::F32})
      for (int64_t n_tok : {1, 30}) {
        TestMatrix m(t, 96, 70, rng);
        const std::vector<float> x = random_x(n_tok * 96, rng);
        std::vector<float> y(n_tok * 70, NAN);
        matmul(m.w, x.data(), n_tok, y.data(), pool, scratch);
        const bool rounds = on && has_bf16_panels(t);
        std::vector<float> xr(x);
        if (rounds) {
          for (double& v : m.values) v = bf16_product_operand(static_cast<float>(v));
          for (float& v : xr) v = bf16_product_operand(v);
        }
        expect_matches(m, xr.data(), 96, n_tok, y.data(), 70,
                       std::string(dtype_info(t).name) + (rounds ? " rounded" : " exact") + " tokens " +
                           std::to_string(n_tok),
                       FLT_MIN);
        if (HasFatalFailure()) return set_bf16_products(saved);
      }
  }
  set_bf16_products(false);
  EXPECT_EQ(matmul_mode_tag(), int8_activations() ? "int8-activations" : "");
  set_bf16_products(true);
  EXPECT_NE(matmul_mode_tag().find("bf16-products"), std::string::npos);
  set_bf16_products(saved);
}

TEST(PanelMatmul, TypesWithoutPanelsAreRefused) {
  EXPECT_FALSE(packable(DType::Q5_0));
  EXPECT_TRUE(packable(DType::Q6_K));
  std::vector<uint8_t> row(64);
  const WeightMatrix w{DType::Q5_0, 32, 1, row.data(), row.size(), nullptr};
  try {
    PackedMatrix p(w);
    FAIL() << "packed a Q5_0 matrix";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("Q5_0"), std::string::npos) << e.what();
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

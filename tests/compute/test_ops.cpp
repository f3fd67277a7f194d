// Matmul (both paths, every weight type), attention, RoPE and sampling
// against plain float64 computations.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "compute/attention.h"
#include "compute/matmul.h"
#include "compute/ops.h"
#include "compute/quant.h"
#include "compute/quant_reference.h"
#include "compute/sampling.h"
#include "compute/vec.h"
#include "test_support.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::randn;

class MatmulTypes : public ::testing::TestWithParam<DType> {};

// For both the per-row dot path (n_tokens < kGemmMinTokens) and the GEMM path,
// on odd shapes. Reference: float64 products of the float64-dequantized
// weights. Tolerance: float32 accumulation over n_in terms, bounded by
// n_in * 2^-24 * sum|w*x|; we allow 1e-5 relative to sum|w*x| for n_in <= 1024.
TEST_P(MatmulTypes, MatchesFloat64Reference) {
  const DType type = GetParam();
  const int64_t block = dtype_info(type).block_size;
  ThreadPool pool(2);
  std::vector<float> scratch;
  for (int64_t n_in :
       {block == 1 ? int64_t{19} : block, block * 3, block == 256 ? int64_t{1024} : int64_t{896}})
    for (int64_t n_out : {int64_t{1}, int64_t{37}})
      for (int64_t n_tokens : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{17}}) {
        const auto wf = randn(n_in * n_out, 1, 0.5f);
        std::vector<uint8_t> wq(row_bytes(type, n_in) * n_out);
        for (int64_t r = 0; r < n_out; ++r)
          quantize_row(type, wf.data() + r * n_in, wq.data() + r * row_bytes(type, n_in), n_in);
        const WeightMatrix w{type, n_in, n_out, wq.data(), row_bytes(type, n_in), nullptr};
        const auto x = randn(n_tokens * n_in, 2);
        std::vector<float> y(n_tokens * n_out);
        matmul(w, x.data(), n_tokens, y.data(), pool, scratch);
        std::vector<double> wd(n_in);
        for (int64_t r = 0; r < n_out; ++r) {
          dequantize_row_f64(type, w.row(r), wd.data(), n_in);
          for (int64_t t = 0; t < n_tokens; ++t) {
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < n_in; ++i) {
              ref += wd[i] * x[t * n_in + i];
              mag += std::fabs(wd[i] * x[t * n_in + i]);
            }
            ASSERT_NEAR(y[t * n_out + r], ref, 1e-5 * mag + 1e-6)
                << dtype_info(type).name << " n_in=" << n_in << " n_out=" << n_out
                << " n_tokens=" << n_tokens;
          }
        }
      }
}

INSTANTIATE_TEST_SUITE_P(AllComputeTypes, MatmulTypes,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0,
                                           DType::Q4_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_info(info.param).name); });

TEST(Rope, RotationComposesAndPreservesNorm) {
  // Rotating by p1 then p2 equals rotating by p1 + p2, for both styles;
  // dimensions past n_rot are untouched.
  for (bool neox : {false, true}) {
    auto x = randn(2 * 16, 6);
    auto once = x, twice = x;
    const int32_t p_total[1] = {1234}, p1[1] = {1000}, p2[1] = {234};
    rope(once.data(), 1, 2, 16, 12, p_total, 10000.0f, neox);
    rope(twice.data(), 1, 2, 16, 12, p1, 10000.0f, neox);
    rope(twice.data(), 1, 2, 16, 12, p2, 10000.0f, neox);
    EXPECT_LT(test::max_abs_diff(once.data(), twice.data(), 16, neox ? "neox compose" : "normal compose"),
              1e-4);
    double n0 = 0, n1 = 0;
    for (int i = 0; i < 16; ++i) n0 += x[i] * x[i], n1 += once[i] * once[i];
    EXPECT_NEAR(n0, n1, 1e-4);
    for (int i = 12; i < 16; ++i) EXPECT_EQ(x[i], once[i]);
    // position 0 is the identity
    auto z = x;
    const int32_t p0[1] = {0};
    rope(z.data(), 1, 2, 16, 16, p0, 10000.0f, neox);
    EXPECT_EQ(z, x);
  }
  // Normal style rotates adjacent pairs: at pos 1, first pair turns by 1 radian.
  std::vector<float> v = {1, 0, 0, 0};
  const int32_t p[1] = {1};
  rope(v.data(), 1, 1, 4, 4, p, 10000.0f, false);
  EXPECT_NEAR(v[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(v[1], std::sin(1.0), 1e-6);
  std::vector<float> w = {1, 0, 0, 0};
  rope(w.data(), 1, 1, 4, 4, p, 10000.0f, true);
  EXPECT_NEAR(w[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(w[2], std::sin(1.0), 1e-6);
}

TEST(Sampling, GreedyAndFilters) {
  const std::vector<float> logits = {0.1f, 3.0f, 2.9f, -1.0f, 2.0f};
  Sampler greedy(SamplerParams{});
  EXPECT_EQ(greedy.sample(logits), 1);
  Sampler top1(SamplerParams{.temperature = 1.0f, .top_k = 1, .logit_bias = {}});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(top1.sample(logits), 1);
  // top-p small enough keeps only the best token.
  Sampler nucleus(SamplerParams{.temperature = 1.0f, .top_k = 0, .top_p = 0.3f, .logit_bias = {}});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(nucleus.sample(logits), 1);
  // min-p 0.5 keeps tokens 1 and 2 (p2/p1 = e^-0.1), drops 4 (e^-1).
  Sampler minp(SamplerParams{.temperature = 1.0f, .top_k = 0, .min_p = 0.5f, .seed = 3, .logit_bias = {}});
  std::vector<int> seen(5);
  for (int i = 0; i < 400; ++i) seen[minp.sample(logits)]++;
  EXPECT_GT(seen[1], 100);
  EXPECT_GT(seen[2], 100);
  EXPECT_EQ(seen[0] + seen[3] + seen[4], 0);
  // Same seed, same sequence.
  Sampler a(SamplerParams{.temperature = 1.5f, .top_k = 0, .seed = 9, .logit_bias = {}}),
      b(SamplerParams{.temperature = 1.5f, .top_k = 0, .seed = 9, .logit_bias = {}});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
  EXPECT_THROW(Sampler(SamplerParams{.temperature = -1.0f, .logit_bias = {}}), Error);
  EXPECT_THROW(Sampler(SamplerParams{.top_p = 0.0f, .logit_bias = {}}), Error);
}

// The vector exp of the attention softmax and SwiGLU against std::exp in
// double: a few ulp over the whole finite range, exact 0 below -87.3.
TEST(VecExp, FewUlpOverTheRange) {
  std::vector<float> xs;
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f) xs.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.5f}) xs.push_back(x);
  while (xs.size() % 8) xs.push_back(0.0f);
  double worst = 0;
  for (size_t i = 0; i < xs.size(); i += 8) {
    float got[8];
    _mm256_storeu_ps(got, vec::exp(_mm256_loadu_ps(&xs[i])));
    for (int j = 0; j < 8; ++j) {
      const double want = std::exp(static_cast<double>(xs[i + j]));
      const double rel = std::fabs(got[j] - want) / want;
      worst = std::isfinite(rel) ? std::max(worst, rel) : INFINITY;  // NaN counts as the worst
    }
  }
  std::printf("[check] vec::exp worst relative error %.3g\n", worst);
  EXPECT_LT(worst, 4 * FLT_EPSILON);
  float low[8];
  _mm256_storeu_ps(low,
                   vec::exp(_mm256_setr_ps(-87.4f, -100.f, -1e30f, -INFINITY, -88.f, -200.f, -90.f, -1e5f)));
  for (float v : low) EXPECT_EQ(v, 0.0f);
  float nan[8];
  _mm256_storeu_ps(nan, vec::exp(_mm256_set1_ps(NAN)));
  for (float v : nan) EXPECT_TRUE(std::isnan(v)) << "exp(NaN) must stay NaN";
}

TEST(Swiglu, MatchesFloat64WithTails) {
  for (int64_t n : {1, 7, 8, 13, 4864 + 3}) {
    std::vector<float> gate = test::randn(n, 3), up = test::randn(n, 4);
    gate[0] = 95.0f;                  // e^-g underflows
    if (n > 1) gate[n - 1] = -95.0f;  // e^-g overflows: silu is -0
    const std::vector<float> g0 = gate;
    swiglu(gate.data(), up.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = g0[i], want = g / (1 + std::exp(-g)) * up[i];
      EXPECT_NEAR(gate[i], want, 4 * FLT_EPSILON * std::fabs(want) + 1e-30) << "n " << n << " i " << i;
    }
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

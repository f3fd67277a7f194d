// The fidelity measurement: KL divergence of first-token distributions,
// token ROUGE-L, and their combination against full attention.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "eval/fidelity.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

TEST(Fidelity, KlDivergenceOfLogits) {
  const std::vector<float> p = {1.0f, 2.0f, 3.0f}, shifted = {11.0f, 12.0f, 13.0f};
  EXPECT_EQ(kl_divergence_of_logits(p, p), 0.0);
  EXPECT_NEAR(kl_divergence_of_logits(p, shifted), 0.0, 1e-12) << "softmax ignores a constant shift";
  // Two outcomes, P = (1/2, 1/2), Q = (1/(1+e), e/(1+e)): KL = ln((1+e)/2) - 1/2 ... in closed form.
  const std::vector<float> half = {0.0f, 0.0f}, q = {0.0f, 1.0f};
  const double q0 = 1 / (1 + std::exp(1.0)), q1 = 1 - q0;
  EXPECT_NEAR(kl_divergence_of_logits(half, q), 0.5 * std::log(0.5 / q0) + 0.5 * std::log(0.5 / q1), 1e-12);
  EXPECT_GT(kl_divergence_of_logits(half, q), 0.0);
  const std::vector<float> nan = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_EQ(kl_divergence_of_logits(half, nan), INFINITY);
  EXPECT_EQ(kl_divergence_of_logits(nan, half), INFINITY);
  EXPECT_EQ(kl_divergence_of_logits(half, p), INFINITY) << "lengths differ";
}

TEST(Fidelity, RougeL) {
  const std::vector<int32_t> ref = {1, 2, 3, 4, 5}, same = ref, none = {9, 9};
  EXPECT_EQ(rouge_l(ref, same), 1.0);
  EXPECT_EQ(rouge_l(ref, none), 0.0);
  EXPECT_EQ(rouge_l({}, {}), 1.0);
  EXPECT_EQ(rouge_l(ref, {}), 0.0);
  // LCS of (1 2 3 4 5) and (1 3 5 7) is (1 3 5): P = 3/4, R = 3/5, F = 2PR/(P+R) = 2/3.
  EXPECT_NEAR(rouge_l(ref, std::vector<int32_t>{1, 3, 5, 7}), 2.0 / 3.0, 1e-12);
}

TEST(Fidelity, AgainstFullAttention) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f}, other = {2.0f, 0.5f, -1.0f};
  const std::vector<int32_t> tokens = {1, 4, 4, 2}, diverged = {1, 4, 7, 2};
  const Fidelity same = compare_to_full(logits, tokens, logits, tokens);
  EXPECT_TRUE(same.first_token_agrees);
  EXPECT_TRUE(same.identical);
  EXPECT_EQ(same.kl_first_token, 0.0);
  EXPECT_EQ(same.rouge_l, 1.0);
  const Fidelity off = compare_to_full(logits, tokens, other, diverged);
  EXPECT_TRUE(off.first_token_agrees);
  EXPECT_FALSE(off.identical);
  EXPECT_GT(off.kl_first_token, 0.1);
  EXPECT_NEAR(off.rouge_l, 0.75, 1e-12);
  EXPECT_FALSE(compare_to_full(logits, tokens, other, std::vector<int32_t>{0, 4, 4, 2}).first_token_agrees);
  // NaN logits with the same argmax-of-garbage tokens: never agreement.
  const std::vector<float> nan = {0.5f, std::nanf(""), -1.0f};
  const Fidelity broken = compare_to_full(logits, tokens, nan, tokens);
  EXPECT_FALSE(broken.first_token_agrees);
  EXPECT_FALSE(broken.identical);
  EXPECT_EQ(broken.rouge_l, 0.0);
  EXPECT_EQ(broken.kl_first_token, INFINITY);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

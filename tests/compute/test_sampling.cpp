// The sampler's OpenAI adjustments (presence / frequency penalties, logit
// bias) on logits whose outcome can be worked out by hand, and token
// log-probabilities against a plain float64 log-softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "compute/sampling.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

std::vector<int32_t> greedy_run(const std::vector<float>& logits, SamplerParams p, int n) {
  Sampler s(p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(logits));
  return out;
}

// Logits a = 2.0, b = 1.5, c = 0. OpenAI: mu[j] - c[j] * frequency - (c[j] > 0) * presence.
// frequency 0.3: a (2.0 vs 1.5), a (1.7), b (a 1.4 < 1.5), a (1.4 > b 1.2), b (a 1.1 < 1.2), a (1.1 > 0.9).
// presence 0.6: a, then b (a 1.4 < 1.5), then a for good (1.4 > b 0.9; counted once).
TEST(Sampling, PenaltiesFollowOpenAIsFormula) {
  const std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  SamplerParams p;
  EXPECT_EQ(greedy_run(logits, p, 4), (std::vector<int32_t>{0, 0, 0, 0}));
  p.frequency_penalty = 0.3f;
  EXPECT_EQ(greedy_run(logits, p, 6), (std::vector<int32_t>{0, 0, 1, 0, 1, 0}));
  p.frequency_penalty = 0;
  p.presence_penalty = 0.6f;
  EXPECT_EQ(greedy_run(logits, p, 5), (std::vector<int32_t>{0, 1, 0, 0, 0}));
  // Negative values favour repeats: b, once picked, stays ahead of a.
  p.presence_penalty = -0.6f;
  const std::vector<float> close = {1.5f, 2.0f, 0.0f};
  EXPECT_EQ(greedy_run(close, p, 3), (std::vector<int32_t>{1, 1, 1}));
  // Out of OpenAI's range.
  p.presence_penalty = 2.5f;
  EXPECT_THROW(p.validate(), Error);
  p.presence_penalty = 0;
  p.frequency_penalty = -2.01f;
  EXPECT_THROW(p.validate(), Error);
}

TEST(Sampling, LogitBiasOf100ForcesATokenAndMinus100BansIt) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 3);
  std::vector<float> logits(64);
  for (float& x : logits) x = normal(rng);
  const int32_t best = argmax(logits);
  const int32_t forced = (best + 5) % 64;
  SamplerParams p;
  p.temperature = 1.5f;
  p.top_k = 0;
  p.seed = 9;
  p.logit_bias = {{forced, 100.0f}};
  Sampler s(p);
  for (int i = 0; i < 200; ++i) ASSERT_EQ(s.sample(logits), forced);
  // Banned: never picked, even at a high temperature; greedy takes the runner-up.
  p.logit_bias = {{best, -100.0f}};
  p.temperature = 2.0f;
  Sampler banned(p);
  for (int i = 0; i < 2000; ++i) ASSERT_NE(banned.sample(logits), best);
  std::vector<float> without = logits;
  without[best] = -1e30f;
  p.temperature = 0;
  EXPECT_EQ(Sampler(p).sample(logits), argmax(without));
  // Checked against the vocabulary: an id beyond it, a bias beyond 100, every token banned.
  p.logit_bias = {{64, 1.0f}};
  EXPECT_THROW(p.validate(64), Error);
  EXPECT_NO_THROW(p.validate(65));
  p.logit_bias = {{1, 100.5f}};
  EXPECT_THROW(p.validate(), Error);
  p.logit_bias = {{0, -100.0f}, {1, -100.0f}};
  EXPECT_THROW(p.validate(2), Error);
  EXPECT_NO_THROW(p.validate(3));
}

// log p = x - log(sum exp x), in double; the top ones sorted, the argmax first.
TEST(Sampling, TokenLogprobIsTheLogSoftmaxOfTheLogits) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 4);
  for (const float offset : {0.0f, 3000.0f, -3000.0f}) {  // far from 0: exp would overflow unshifted
    std::vector<float> logits(1000);
    for (float& x : logits) x = normal(rng) + offset;
    double max = -INFINITY;
    for (float x : logits) max = std::max(max, static_cast<double>(x));
    double sum = 0;
    for (float x : logits) sum += std::exp(x - max);
    const auto expected = [&](int32_t i) { return logits[i] - max - std::log(sum); };
    const TokenLogprob lp = token_logprob(logits, 17, 20);
    EXPECT_EQ(lp.token, 17);
    EXPECT_NEAR(lp.logprob, expected(17), 1e-4);
    ASSERT_EQ(lp.top.size(), 20u);
    EXPECT_EQ(lp.top[0].token, argmax(logits));
    double mass = 0;
    for (size_t i = 0; i < lp.top.size(); ++i) {
      EXPECT_TRUE(std::isfinite(lp.top[i].logprob));
      EXPECT_NEAR(lp.top[i].logprob, expected(lp.top[i].token), 1e-4);
      if (i > 0) {
        EXPECT_GE(lp.top[i - 1].logprob, lp.top[i].logprob);
      }
      mass += std::exp(lp.top[i].logprob);
    }
    EXPECT_LE(mass, 1.0 + 1e-6);
    EXPECT_GE(lp.top[0].logprob, lp.logprob);
    EXPECT_TRUE(token_logprob(logits, 3, 0).top.empty());
  }
  EXPECT_THROW(token_logprob(std::vector<float>{1, 2}, 2, 1), Error);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

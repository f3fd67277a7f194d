#pragma once
// Picks the next token from logits: greedy, or temperature sampling after
// top-k, top-p (nucleus) and min-p filtering, with a seeded generator. Before
// either, OpenAI's logit bias and presence / frequency penalties (over the
// tokens this sampler picked) adjust the logits. Also the log-probabilities
// of a token and of the most likely ones, for clients that ask for them.
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace depcache {

struct SamplerParams {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 40;            // <= 0: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  uint64_t seed = 0;
  // OpenAI's penalties, in [-2, 2]: a token's logit loses presence_penalty
  // once it was generated, and frequency_penalty times the number of times.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Added to a token's logit, in [-100, 100]; -100 bans the token outright.
  std::vector<std::pair<int32_t, float>> logit_bias;

  void validate() const;  // throws depcache::Error on out-of-range values
  // Also: every logit_bias id is below n_vocab, and some token is not banned.
  void validate(int32_t n_vocab) const;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);
  // Picks a token and counts it for the penalties.
  int32_t sample(std::span<const float> logits);

 private:
  std::span<const float> adjusted(std::span<const float> logits);

  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<float> adjusted_;
  std::unordered_map<int32_t, int> generated_;  // token -> times picked (with penalties only)
};

int32_t argmax(std::span<const float> logits);

struct TokenProb {
  int32_t token = 0;
  float logprob = 0;
};
// A token's log-probability under log-softmax(logits) and the `top` most
// likely tokens (most likely first, ties by lower id).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<TokenProb> top;
};
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top);

}  // namespace depcache

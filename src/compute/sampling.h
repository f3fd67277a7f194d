#pragma once
// Picks the next token from logits: greedy, or temperature sampling after
// top-k, top-p (nucleus) and min-p filtering, with a seeded generator.
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace depcache {

struct SamplerParams {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 40;            // <= 0: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  uint64_t seed = 0;

  void validate() const;  // throws depcache::Error on out-of-range values
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);
  int32_t sample(std::span<const float> logits);

 private:
  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace depcache

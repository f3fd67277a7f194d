#pragma once
// Inputs shared by the micro-benchmarks.
#include <cstdint>
#include <random>
#include <vector>

namespace depcache::bench {

// n standard-normal floats from a fixed seed.
inline std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& f : v) f = normal(rng);
  return v;
}

}  // namespace depcache::bench

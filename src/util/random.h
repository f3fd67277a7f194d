#pragma once
// Seeded random numbers that do not depend on the library or the number of
// threads: a stream per seed, so callers give each row its own seed.
#include <cstdint>

namespace depcache {

// The splitmix64 generator: advances `state`, returns the next value.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// n samples of normal(0, stddev) from the stream `seed` (Box-Muller).
void fill_normal(float* out, int64_t n, uint64_t seed, float stddev);

}  // namespace depcache

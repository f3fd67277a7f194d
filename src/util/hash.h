#pragma once
// 64-bit hashes of bytes: XXH3 from the xxHash library. Its output is frozen
// (stable across runs, platforms and library versions since 0.8.0), so it can
// be stored in files (checksums, content keys) and shared between processes
// (remote tier keys). Not for adversarial input. Chaining — a hash as the
// seed of the next — hashes a sequence of fields.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace depcache {

// Bytes by pointer and size. A separate name, so that a string literal never
// binds to (pointer, size) instead of the string_view overload.
inline uint64_t hash_bytes(const void* data, size_t n, uint64_t seed = 0) {
  return XXH3_64bits_withSeed(data, n, seed);
}

inline uint64_t hash_string(std::string_view s, uint64_t seed = 0) {
  return hash_bytes(s.data(), s.size(), seed);
}

}  // namespace depcache

#pragma once
// 64-bit FNV-1a: fast, stable across runs and platforms, so it can be stored
// in files (checksums) and used for feature hashing. Not for adversarial input.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace depcache {

inline constexpr uint64_t kFnv1aSeed = 0xcbf29ce484222325ull;

// Bytes by pointer and size. A separate name, so that a string literal never
// binds to (pointer, size) instead of the string_view overload.
inline uint64_t fnv1a64_bytes(const void* data, size_t n, uint64_t h = kFnv1aSeed) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

inline uint64_t fnv1a64(std::string_view s, uint64_t h = kFnv1aSeed) {
  return fnv1a64_bytes(s.data(), s.size(), h);
}

}  // namespace depcache

#pragma once
// Keyed message authentication (HMAC-SHA256, OpenSSL's libcrypto) under a
// per-deployment secret, for what the process reads back from places others
// can write to: without the secret, no one can make bytes that pass check().
#include <array>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <span>
#include <vector>

namespace depcache {

using MacTag = std::array<uint8_t, 32>;

class MacKey {
 public:
  static constexpr size_t kMinBytes = 32;  // as long as the tag: guessing it is no easier than a tag
  // The whole file is the secret (no trimming: every replica must read the
  // same bytes). Throws InvalidInput naming the file when it cannot be read
  // or holds fewer than kMinBytes bytes.
  static MacKey from_file(const std::filesystem::path& path);
  explicit MacKey(std::vector<uint8_t> secret);

  // HMAC-SHA256 of the concatenation of `parts`. Thread-safe.
  MacTag tag(std::initializer_list<std::span<const uint8_t>> parts) const;
  // Whether `expected` is the tag of `parts`, compared in constant time.
  bool check(std::span<const uint8_t> expected, std::initializer_list<std::span<const uint8_t>> parts) const;

 private:
  std::vector<uint8_t> secret_;
};

}  // namespace depcache

#pragma once
// The deployment's secret (--cache-key-file) and what it does, with OpenSSL's
// libcrypto, for what the process writes to and reads back from places
// others can reach (a cache directory, Redis, an events channel):
//  - tag()/check(): HMAC-SHA256; without the secret no one makes bytes that
//    pass check();
//  - seal()/open(): AES-256-GCM under a key derived from the secret, so a
//    reader of the stored bytes learns their size and nothing else;
//  - name(): a 64-bit name for a content key, derived from the secret, so
//    that names filed in shared places reveal nothing about the content
//    (whoever lacks the secret cannot compute the name of a guess).
// Each use has its own derived key (domain separation).
#include <array>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <span>
#include <vector>

namespace depcache {

using MacTag = std::array<uint8_t, 32>;
using CipherNonce = std::array<uint8_t, 12>;  // AES-GCM's 96 bits: never twice under one key
using CipherTag = std::array<uint8_t, 16>;

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

  // Encrypts `data` in place; the tag covers it and `aad` (authenticated,
  // not encrypted). Thread-safe.
  CipherTag seal(const CipherNonce& nonce, std::initializer_list<std::span<const uint8_t>> aad,
                 std::span<uint8_t> data) const;
  // Decrypts `data` in place; false (data then unusable) when the tag does
  // not match the bytes, aad and nonce.
  bool open(const CipherNonce& nonce, std::initializer_list<std::span<const uint8_t>> aad,
            std::span<uint8_t> data, std::span<const uint8_t> tag) const;
  // A content key's name in shared places (HMAC under a derived key, cut to
  // 64 bits). Thread-safe.
  uint64_t name(uint64_t content_key) const;

 private:
  std::vector<uint8_t> secret_;
  std::array<uint8_t, 32> cipher_key_{}, name_key_{};
};

}  // namespace depcache

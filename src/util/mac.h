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
//    (whoever lacks the secret cannot compute the name of a guess):
//    SipHash-2-4, a PRF made for short inputs (a router names every block
//    of every request it scores: HMAC-SHA256 cost 1.4 us a name there).
// Each use has its own derived key (domain separation).
#include <openssl/types.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

namespace depcache {

using MacTag = std::array<uint8_t, 32>;
using CipherNonce = std::array<uint8_t, 12>;  // AES-GCM's 96 bits: never twice under one key
using CipherTag = std::array<uint8_t, 16>;
using SipKey = std::array<uint8_t, 16>;

// SipHash-2-4 of `value`'s 8 little-endian bytes under `key` (OpenSSL's).
uint64_t siphash24(const SipKey& key, uint64_t value);

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
  // A content key's name in shared places (SipHash-2-4 under a derived
  // key). Thread-safe.
  uint64_t name(uint64_t content_key) const;

 private:
  std::vector<uint8_t> secret_;
  std::array<uint8_t, 32> cipher_key_{};
  // SipHash keyed once; each name() works on a copy (keying costs more than
  // the hash). Shared by copies of this key, never changed.
  std::shared_ptr<const EVP_MAC_CTX> name_ctx_;
};

}  // namespace depcache

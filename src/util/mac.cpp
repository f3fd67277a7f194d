#include "util/mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <algorithm>
#include <memory>
#include <string_view>

#include "util/error.h"
#include "util/file_io.h"

namespace depcache {
namespace {

struct MacDeleter {
  void operator()(EVP_MAC* m) const { EVP_MAC_free(m); }
  void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
};

// Fetched once: the algorithm object is immutable and may be shared by threads.
EVP_MAC* hmac() {
  static const std::unique_ptr<EVP_MAC, MacDeleter> mac(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
  if (!mac) fail(ErrorKind::Internal, "OpenSSL offers no HMAC");
  return mac.get();
}

EVP_MAC* siphash() {
  static const std::unique_ptr<EVP_MAC, MacDeleter> mac(EVP_MAC_fetch(nullptr, "SIPHASH", nullptr));
  if (!mac) fail(ErrorKind::Internal, "OpenSSL offers no SipHash");
  return mac.get();
}

// A SipHash context keyed with `key`, for 64-bit results.
std::shared_ptr<const EVP_MAC_CTX> siphash_ctx(const SipKey& key) {
  std::shared_ptr<EVP_MAC_CTX> ctx(EVP_MAC_CTX_new(siphash()), MacDeleter{});
  unsigned int size = 8;
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_uint(OSSL_MAC_PARAM_SIZE, &size),
                               OSSL_PARAM_construct_end()};
  if (!ctx || EVP_MAC_init(ctx.get(), key.data(), key.size(), params) != 1)
    fail(ErrorKind::Internal, "SipHash setup failed in OpenSSL");
  return ctx;
}

uint64_t siphash_of(const EVP_MAC_CTX* keyed, uint64_t value) {
  // The copy is read from `keyed` only, so threads may share it.
  const std::unique_ptr<EVP_MAC_CTX, MacDeleter> ctx(EVP_MAC_CTX_dup(keyed));
  uint8_t io[8];
  for (int i = 0; i < 8; ++i) io[i] = static_cast<uint8_t>(value >> (8 * i));
  size_t n = 0;
  if (!ctx || EVP_MAC_update(ctx.get(), io, sizeof io) != 1 ||
      EVP_MAC_final(ctx.get(), io, &n, sizeof io) != 1 || n != sizeof io)
    fail(ErrorKind::Internal, "SipHash failed in OpenSSL");
  uint64_t out = 0;
  for (int i = 0; i < 8; ++i) out |= static_cast<uint64_t>(io[i]) << (8 * i);
  return out;
}

MacTag hmac_sha256(std::span<const uint8_t> key, std::initializer_list<std::span<const uint8_t>> parts) {
  const std::unique_ptr<EVP_MAC_CTX, MacDeleter> ctx(EVP_MAC_CTX_new(hmac()));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  MacTag out{};
  size_t n = 0;
  bool ok = ctx && EVP_MAC_init(ctx.get(), key.data(), key.size(), params) == 1;
  for (const std::span<const uint8_t> p : parts)
    ok = ok && EVP_MAC_update(ctx.get(), p.data(), p.size()) == 1;
  ok = ok && EVP_MAC_final(ctx.get(), out.data(), &n, out.size()) == 1 && n == out.size();
  if (!ok) fail(ErrorKind::Internal, "HMAC-SHA256 failed in OpenSSL");
  return out;
}

}  // namespace

MacKey MacKey::from_file(const std::filesystem::path& path) {
  const Fd fd = open_read(path);
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (!fd.ok() || ec)
    fail(ErrorKind::InvalidInput, "cache key file {} cannot be read: {}", path.string(),
         ec ? ec.message() : "cannot open it");
  if (size < kMinBytes)
    fail(ErrorKind::InvalidInput,
         "cache key file {} holds {} bytes; a key needs at least {} (e.g. head -c 32 /dev/urandom > {})",
         path.string(), size, kMinBytes, path.string());
  if (size > (1u << 20))
    fail(ErrorKind::InvalidInput, "cache key file {} is over 1 MiB: not a key", path.string());
  std::vector<uint8_t> secret(size);
  if (!read_exact_at(fd, secret.data(), secret.size(), 0))
    fail(ErrorKind::InvalidInput, "cache key file {} cannot be read", path.string());
  return MacKey(std::move(secret));
}

MacKey::MacKey(std::vector<uint8_t> secret) : secret_(std::move(secret)) {
  if (secret_.size() < kMinBytes)
    fail(ErrorKind::InvalidInput, "a MAC key needs at least {} bytes, not {}", kMinBytes, secret_.size());
  // Derived keys: HMAC of a label under the secret (HKDF's expand step with
  // one block), one per use.
  const auto derive = [&](std::string_view label) {
    return tag({{reinterpret_cast<const uint8_t*>(label.data()), label.size()}});
  };
  cipher_key_ = derive("depcache record cipher 1");
  const MacTag names = derive("depcache content names 2");
  SipKey sip{};
  std::copy_n(names.begin(), sip.size(), sip.begin());
  name_ctx_ = siphash_ctx(sip);
}

MacTag MacKey::tag(std::initializer_list<std::span<const uint8_t>> parts) const {
  return hmac_sha256(secret_, parts);
}

bool MacKey::check(std::span<const uint8_t> expected,
                   std::initializer_list<std::span<const uint8_t>> parts) const {
  const MacTag t = tag(parts);
  return expected.size() == t.size() && CRYPTO_memcmp(expected.data(), t.data(), t.size()) == 0;
}

namespace {

struct CipherDeleter {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherDeleter>;

// EVP's update calls take int lengths: long inputs go in pieces.
constexpr size_t kPiece = size_t{1} << 30;

CipherCtx gcm_ctx(bool encrypt, const std::array<uint8_t, 32>& key, const CipherNonce& nonce,
                  std::initializer_list<std::span<const uint8_t>> aad) {
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  const auto init = encrypt ? EVP_EncryptInit_ex : EVP_DecryptInit_ex;
  bool ok =
      ctx && init(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(nonce.size()), nullptr) == 1 &&
      init(ctx.get(), nullptr, nullptr, key.data(), nonce.data()) == 1;
  for (const std::span<const uint8_t> a : aad)
    for (size_t at = 0; ok && at < a.size(); at += kPiece) {
      int n = 0;
      const int len = static_cast<int>(std::min(kPiece, a.size() - at));
      ok = (encrypt ? EVP_EncryptUpdate : EVP_DecryptUpdate)(ctx.get(), nullptr, &n, a.data() + at, len) == 1;
    }
  if (!ok) fail(ErrorKind::Internal, "AES-256-GCM setup failed in OpenSSL");
  return ctx;
}

// In place: GCM is a stream mode, output and input may be the same bytes.
bool gcm_update(EVP_CIPHER_CTX* ctx, bool encrypt, std::span<uint8_t> data) {
  for (size_t at = 0; at < data.size(); at += kPiece) {
    int n = 0;
    const int len = static_cast<int>(std::min(kPiece, data.size() - at));
    if ((encrypt ? EVP_EncryptUpdate : EVP_DecryptUpdate)(ctx, data.data() + at, &n, data.data() + at, len) !=
            1 ||
        n != len)
      return false;
  }
  return true;
}

}  // namespace

CipherTag MacKey::seal(const CipherNonce& nonce, std::initializer_list<std::span<const uint8_t>> aad,
                       std::span<uint8_t> data) const {
  const CipherCtx ctx = gcm_ctx(true, cipher_key_, nonce, aad);
  CipherTag tag{};
  int n = 0;
  uint8_t end[16];
  if (!gcm_update(ctx.get(), true, data) || EVP_EncryptFinal_ex(ctx.get(), end, &n) != 1 || n != 0 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag.size()), tag.data()) != 1)
    fail(ErrorKind::Internal, "AES-256-GCM encryption failed in OpenSSL");
  return tag;
}

bool MacKey::open(const CipherNonce& nonce, std::initializer_list<std::span<const uint8_t>> aad,
                  std::span<uint8_t> data, std::span<const uint8_t> tag) const {
  if (tag.size() != sizeof(CipherTag)) return false;
  const CipherCtx ctx = gcm_ctx(false, cipher_key_, nonce, aad);
  CipherTag expected{};
  std::copy(tag.begin(), tag.end(), expected.begin());
  int n = 0;
  uint8_t end[16];
  return gcm_update(ctx.get(), false, data) &&
         EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(expected.size()),
                             expected.data()) == 1 &&
         EVP_DecryptFinal_ex(ctx.get(), end, &n) == 1;
}

uint64_t MacKey::name(uint64_t content_key) const { return siphash_of(name_ctx_.get(), content_key); }

uint64_t siphash24(const SipKey& key, uint64_t value) { return siphash_of(siphash_ctx(key).get(), value); }

}  // namespace depcache

#include "util/mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <memory>

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
}

MacTag MacKey::tag(std::initializer_list<std::span<const uint8_t>> parts) const {
  const std::unique_ptr<EVP_MAC_CTX, MacDeleter> ctx(EVP_MAC_CTX_new(hmac()));
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  MacTag out{};
  size_t n = 0;
  bool ok = ctx && EVP_MAC_init(ctx.get(), secret_.data(), secret_.size(), params) == 1;
  for (const std::span<const uint8_t> p : parts)
    ok = ok && EVP_MAC_update(ctx.get(), p.data(), p.size()) == 1;
  ok = ok && EVP_MAC_final(ctx.get(), out.data(), &n, out.size()) == 1 && n == out.size();
  if (!ok) fail(ErrorKind::Internal, "HMAC-SHA256 failed in OpenSSL");
  return out;
}

bool MacKey::check(std::span<const uint8_t> expected,
                   std::initializer_list<std::span<const uint8_t>> parts) const {
  const MacTag t = tag(parts);
  return expected.size() == t.size() && CRYPTO_memcmp(expected.data(), t.data(), t.size()) == 0;
}

}  // namespace depcache

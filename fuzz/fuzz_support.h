#pragma once
// What the fuzz targets share: a reader that turns the fuzzer's bytes into
// structured values, where the reference material lives, and how a target
// reports a broken property (a message and abort(), which libFuzzer records
// as a crash with the input that caused it).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace depcache::fuzz {

[[noreturn]] inline void violated(const char* what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

// Reads values off the front of the input; past the end it yields zeros and
// empty strings, so every input decodes to something.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  // The bytes up to the next `sep` (dropped) or the end.
  std::string_view until(uint8_t sep) {
    const void* hit = n_ ? std::memchr(p_, sep, n_) : nullptr;
    const size_t len = hit ? static_cast<size_t>(static_cast<const uint8_t*>(hit) - p_) : n_;
    const std::string_view out(reinterpret_cast<const char*>(p_), len);
    p_ += len;
    n_ -= len;
    if (hit) u8();
    return out;
  }
  std::span<const uint8_t> rest() const { return {p_, n_}; }

 private:
  const uint8_t* p_;
  size_t n_;
};

// ../shared beside the clone, or DEPCACHE_SHARED; a target that needs it and
// does not find it stops with a message rather than fuzzing less than it says.
inline std::filesystem::path shared_file(const std::string& relative) {
  const char* env = std::getenv("DEPCACHE_SHARED");
  const std::filesystem::path path =
      std::filesystem::path(env && *env ? env : DEPCACHE_SHARED_DIR) / relative;
  if (!std::filesystem::exists(path)) {
    std::fprintf(stderr, "reference file not found: %s (set DEPCACHE_SHARED to the shared folder)\n",
                 path.c_str());
    std::exit(1);
  }
  return path;
}

}  // namespace depcache::fuzz

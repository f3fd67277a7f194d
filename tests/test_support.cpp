#include "test_support.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace depcache::test {

std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("DEPCACHE_SHARED"); env && *env) return env;
  std::filesystem::path p = DEPCACHE_SHARED_DIR;
  return std::filesystem::exists(p) ? p : std::filesystem::path{};
}

std::filesystem::path temp_path(const std::string& stem) {
  static std::atomic<int> counter{0};
  return std::filesystem::temp_directory_path() /
         (stem + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
}

double max_abs_diff(const float* a, const float* b, int64_t n, const std::string& label) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(double(a[i]) - double(b[i])));
  std::printf("[check] %s: max |diff| = %.3g over %lld values\n", label.c_str(), m, (long long)n);
  return m;
}

}  // namespace depcache::test

#pragma once
// Helpers shared by the test binaries: where the reference material lives and
// how to compare tensors with a printed max difference.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "compute/dtype.h"

namespace depcache {
class Model;
}

namespace depcache::test {

// ../shared beside the clone (override with DEPCACHE_SHARED); empty if absent.
std::filesystem::path shared_dir();

// Skips the calling test with a clear message when ../shared is not there.
#define DEPCACHE_REQUIRE_SHARED(path_var, relative)                                   \
  const std::filesystem::path path_var = ::depcache::test::shared_dir() / (relative); \
  if (::depcache::test::shared_dir().empty() || !std::filesystem::exists(path_var))   \
  GTEST_SKIP() << "reference file not found (../shared absent?): " << (relative)

// A fresh temporary directory removed at process exit is not needed: callers
// remove what they make. Returns a unique path under the system temp dir.
std::filesystem::path temp_path(const std::string& stem);

// The depcache binary run through the shell: `args` is a shell fragment,
// stdin holds stdin_text, stdout and stderr are merged into out.
struct CliRun {
  int code;  // exit status, -1 if killed by a signal
  std::string out;
};
CliRun run_cli(const std::string& args, const std::string& stdin_text = "");

// A real redis-server (the Debian package) on a free loopback port, with no
// persistence, stopped on destruction. port() is 0 when redis-server is not
// installed; tests then skip with a message.
class RedisServer {
 public:
  RedisServer();
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  int port() const { return port_; }
  void stop();
  void start();  // again, on the same port

 private:
  int port_ = 0;
  int pid_ = -1;
};
#define DEPCACHE_REQUIRE_REDIS(server)  \
  ::depcache::test::RedisServer server; \
  if (server.port() == 0) GTEST_SKIP() << "redis-server not installed (scripts/setup.sh installs it)"

// A random-weight model of a preset shape (std 0.2, so logits differ enough
// for comparisons to mean something), written with the project's GGUF writer
// and loaded; made once per process per (preset, type, tied).
std::shared_ptr<const Model> random_model(const std::string& preset, DType type, bool tied = false);

// n normal(0, scale) floats from a seeded generator.
std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f);

// Max absolute difference between two float arrays, printed with a label.
double max_abs_diff(const float* a, const float* b, int64_t n, const std::string& label);

}  // namespace depcache::test

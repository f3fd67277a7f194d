#pragma once
// Helpers shared by the test binaries: where the reference material lives and
// how to compare tensors with a printed max difference.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compute/dot.h"
#include "compute/dtype.h"
#include "exec/kv_assembly.h"
#include "exec/visibility.h"
#include "kv/kv_span.h"
#include "strategy/strategy.h"

namespace depcache {
class Model;
}

namespace depcache::test {

// Strict mode (DEPCACHE_STRICT=1, set by .ci/run): a test that cannot find
// what it needs (../shared, Redis, WordNet) fails instead of skipping, so CI
// never passes on tests that did not run for want of setup. A CPU feature is
// the exception: no setup adds one, so such a test skips in every mode, its
// reason tagged "(cpu)" (DEPCACHE_SKIP_CPU), and the test command counts it
// apart.
bool strict_mode();

// Every skip prints one "[skip-reason] Suite.Test: reason" line, which the
// test command collects into its summary of what did not run.
void print_skip_reason(const std::string& reason);

// Skips the calling test (returns from it), or fails it in strict mode.
#define DEPCACHE_SKIP(reason)                                                             \
  do {                                                                                    \
    const std::string skip_reason_ = (reason);                                            \
    ::depcache::test::print_skip_reason(skip_reason_);                                    \
    if (::depcache::test::strict_mode()) GTEST_FAIL() << "strict mode: " << skip_reason_; \
    GTEST_SKIP() << skip_reason_;                                                         \
  } while (0)

// Skips the calling test because this CPU lacks an instruction set it needs
// (in every mode; see strict_mode).
#define DEPCACHE_SKIP_CPU(reason)                                                 \
  do {                                                                            \
    const std::string skip_reason_ = ::depcache::test::cpu_skip_reason((reason)); \
    ::depcache::test::print_skip_reason(skip_reason_);                            \
    GTEST_SKIP() << skip_reason_;                                                 \
  } while (0)

// "(cpu) reason": the tag the test command counts CPU skips by.
std::string cpu_skip_reason(const std::string& reason);

// Why a test of an ISA's kernels cannot run on this CPU (for DEPCACHE_SKIP_CPU).
std::string isa_missing_reason(Isa isa);

// An ISA's kernels can run on this CPU; otherwise reports that this variant
// of the calling test did not run (the test ends as skipped, in every mode)
// and the caller's loop goes on with the others.
bool isa_available(Isa isa);

// ../shared beside the clone (override with DEPCACHE_SHARED); empty if absent.
std::filesystem::path shared_dir();

// Skips the calling test with a clear message when ../shared is not there.
#define DEPCACHE_REQUIRE_SHARED(path_var, relative)                                   \
  const std::filesystem::path path_var = ::depcache::test::shared_dir() / (relative); \
  if (::depcache::test::shared_dir().empty() || !std::filesystem::exists(path_var))   \
  DEPCACHE_SKIP(std::string("reference file not found (../shared absent?): ") + (relative))

// The leading C++ engine's source that scripts/fetch_llama_cpp.sh brings into
// the build folder (override with DEPCACHE_LLAMA_CPP); empty if absent.
std::filesystem::path llama_cpp_dir();

// Skips the calling test when that source is not there.
#define DEPCACHE_REQUIRE_LLAMA_CPP(path_var, relative)                                   \
  const std::filesystem::path path_var = ::depcache::test::llama_cpp_dir() / (relative); \
  if (::depcache::test::llama_cpp_dir().empty() || !std::filesystem::exists(path_var))   \
  DEPCACHE_SKIP(std::string("llama.cpp source not found (run scripts/fetch_llama_cpp.sh): ") + (relative))

// A fresh temporary directory removed at process exit is not needed: callers
// remove what they make. Returns a unique path under the system temp dir.
std::filesystem::path temp_path(const std::string& stem);

// A file's bytes (empty when it cannot be read).
std::string slurp(const std::filesystem::path& path);

// The depcache binary run through the shell: `args` is a shell fragment,
// stdin holds stdin_text, stdout and stderr are merged into out.
struct CliRun {
  int code;  // exit status, -1 if killed by a signal
  std::string out;
};
CliRun run_cli(const std::string& args, const std::string& stdin_text = "");
// Any shell command: its stdout (stderr as the command redirects it) and exit status.
CliRun run_shell(const std::string& command);

// A real redis-server (the Debian package) on a free loopback port, with no
// persistence, stopped on destruction. port() is 0 when redis-server is not
// installed; tests then skip with a message.
class RedisServer {
 public:
  // extra_args: more redis-server options ("--cluster-enabled", "yes", ...);
  // an argument equal to kFreePort becomes a free port of its own. A server
  // that exits at start, or whose port another server answers (a port
  // another process took meanwhile), is started again on new ports.
  static constexpr const char* kFreePort = "{free port}";
  explicit RedisServer(std::vector<std::string> extra_args = {});
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  int port() const { return port_; }
  void stop();
  void start();  // again, on the same port
  bool running() const { return pid_ > 0; }

 private:
  bool launch();  // false: it exited at start, or its port answered as another server
  int port_ = 0;
  int pid_ = -1;
  std::vector<std::string> extra_args_;
};

// A free loopback TCP port (bound, read back, released).
int free_port();

// A real Redis Cluster (Debian's redis-server and redis-cli) on loopback:
// `masters` masters with `replicas` replicas each, a 1 s node timeout (so a
// killed master's replica takes over within a few seconds) and
// cluster-require-full-coverage off (the other masters serve meanwhile), made with
// `redis-cli --cluster create` and up (every node says cluster_state:ok)
// when the constructor returns. Its node files go to a temporary directory
// removed on destruction. ports() is empty when redis-server is not installed.
class RedisCluster {
 public:
  RedisCluster(int masters, int replicas);
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;
  std::vector<int> ports() const;
  std::string seeds() const;  // "127.0.0.1:p,127.0.0.1:q" (the first two nodes)
  // redis-cli -p port ARGS, its output.
  std::string cli(int port, const std::string& args) const;
  void kill(int port);               // SIGKILL
  std::vector<int> masters() const;  // ports of the live masters
  // Waits until every live node reports cluster_state:ok and `masters` live
  // masters serve every slot; false after timeout_ms.
  bool wait_ok(int masters, int timeout_ms) const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};
#define DEPCACHE_REQUIRE_REDIS_CLUSTER(cluster, masters, replicas) \
  ::depcache::test::RedisCluster cluster(masters, replicas);       \
  if (cluster.ports().empty()) DEPCACHE_SKIP("redis-server not installed (scripts/setup.sh installs it)")
#define DEPCACHE_REQUIRE_REDIS(server)  \
  ::depcache::test::RedisServer server; \
  if (server.port() == 0) DEPCACHE_SKIP("redis-server not installed (scripts/setup.sh installs it)")

// A random-weight model of a preset shape (std 0.2, so logits differ enough
// for comparisons to mean something), written with the project's GGUF writer
// and loaded; made once per process per (preset, type, tied, layers).
// n_layer > 0 overrides the preset's.
std::shared_ptr<const Model> random_model(const std::string& preset, DType type, bool tied = false,
                                          int n_layer = 0);

// Sets element `index` of the F32 tensor `tensor` in a GGUF file to `value`
// (NaN, say, or a changed weight), in place.
void set_f32_weight(const std::filesystem::path& gguf, const std::string& tensor, int64_t index, float value);

// n normal(0, scale) floats from a seeded generator.
std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f);

// Max absolute difference between two arrays, printed with a label. A NaN
// or Inf anywhere, or a length mismatch, is an infinite difference (see
// util/numeric.h), so no comparison passes on non-finite output.
double max_abs_diff(std::span<const float> a, std::span<const float> b, const std::string& label);
double max_abs_diff(std::span<const float> a, std::span<const double> b, const std::string& label);
double max_abs_diff(const float* a, const float* b, int64_t n, const std::string& label);
// The same relative to the largest |ref| (at least 1e-30): for float64
// references whose scale depends on the model.
double max_rel_diff(std::span<const float> got, std::span<const double> ref, const std::string& label);

// A request's prompt K/V (RequestResult::prompt_kv) as an assembly of its
// own: row r holds prompt row r at the position the request gave it, so
// what reads an assembly (kv_deviation, KvAssembly::read) reads the request's.
KvAssembly prompt_assembly(const ModelConfig& config, const KvSpan& rows);

// The rows query q of a visibility sees, one by one, in order.
std::vector<int64_t> rows_seen(const Visibility& v, int64_t q);

}  // namespace depcache::test

#pragma once
// Clients of `depcache serve` for the server's tests: curl over loopback, the
// parsing of streamed replies and /metrics scrapes, and the server binary as
// a child process.
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

namespace depcache::test {

bool have_curl();
#define REQUIRE_CURL() \
  if (!::depcache::test::have_curl()) DEPCACHE_SKIP("curl not installed (scripts/setup.sh installs it)")

// A ServeProcess that came up (curl is there to talk to it), or the test
// stops with the server's log.
#define REQUIRE_SERVER(server) \
  REQUIRE_CURL();              \
  ASSERT_GT((server).port(), 0) << "the server did not come up:\n" << (server).log()

// True in a sanitizer build (either compiler; tests/CMakeLists.txt defines
// it), where load tests send fewer requests.
constexpr bool kSanitized =
#ifdef DEPCACHE_SANITIZED
    true;
#else
    false;
#endif

struct Reply {
  int status = 0;  // 0: no HTTP answer
  std::string body;
  nlohmann::json j() const { return nlohmann::json::parse(body); }
};

// curl with `args` (a shell fragment) against http://127.0.0.1:port.
Reply curl(int port, const std::string& path, const std::string& args = "");
// curl arguments that POST `body` as JSON.
std::string post(const nlohmann::json& body);
// POSTs `body` as JSON over a raw socket with a small receive buffer, then
// reads the reply `chunk` bytes at a time with `pause` between reads: a client
// slower than the server, whose writes to it then block. Returns the status
// and the body (de-chunked).
Reply slow_post(int port, const std::string& path, const nlohmann::json& body, size_t chunk,
                std::chrono::milliseconds pause);
// The text of a streamed reply and its last JSON chunk; expects the [DONE] end.
std::pair<std::string, nlohmann::json> read_stream(const std::string& body);
// A sample of a /metrics scrape: `series` is the name with its labels as
// written; -1 when absent.
double sample(const std::string& metrics, const std::string& series);

// A random-weight model file (4 layers of 256, context 32768), made once per
// process: decode slow enough that a long request is still running when a
// client goes away or a signal comes.
const std::filesystem::path& serve_model_file();

// `depcache serve` as a child process on a free loopback port, its stderr in
// a file. The constructor returns once the server says it is ready (port() is
// 0 if it never did; log() tells why). The destructor kills what still runs.
class ServeProcess {
 public:
  // command: "serve", or "route" (which says "ready" too).
  explicit ServeProcess(const std::vector<std::string>& args, const std::string& command = "serve");
  ~ServeProcess();
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }
  int pid() const { return pid_; }
  void signal(int sig) const;
  // The exit code once the process ends within `limit`; -1 if it is still
  // running, 128 + N if signal N ended it.
  int wait_exit(std::chrono::milliseconds limit);
  std::string log() const;
  std::string metrics() const { return curl(port_, "/metrics").body; }
  // Scrapes until `done(scrape)` holds, every 50 ms, `tries` times at most;
  // returns the last scrape.
  template <class Done>
  std::string metrics_when(Done done, int tries = 600) const {
    std::string m;
    for (int i = 0; i < tries; ++i) {
      m = metrics();
      if (done(m)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return m;
  }
  // Peak resident memory (VmHWM) in bytes while it runs; 0 if unknown.
  int64_t peak_rss_bytes() const;

 private:
  std::filesystem::path err_;
  int pid_ = -1, port_ = 0, exit_code_ = -1;
};

}  // namespace depcache::test

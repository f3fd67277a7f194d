#include "test_support.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>

#include "compute/dot.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/model_writer.h"
#include "util/numeric.h"

namespace depcache::test {

std::vector<float> randn(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::shared_ptr<const Model> random_model(const std::string& preset, DType type, bool tied, int n_layer) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const Model>> cache;
  const std::lock_guard lock(mutex);
  const std::string key = preset + "/" + std::string(dtype_info(type).name) + (tied ? "/tied" : "") + "/" +
                          std::to_string(n_layer);
  auto& m = cache[key];
  if (!m) {
    RandomModelOptions o;
    o.shape = *model_preset(preset);
    o.shape.tied_embeddings = tied;
    if (n_layer > 0) o.shape.n_layer = n_layer;
    o.type = type;
    o.seed = 7;
    o.stddev = 0.2f;
    o.n_threads = 2;
    const auto path = temp_path("random-model") += ".gguf";
    write_random_model(path, o);
    m = Model::load(path);
    std::filesystem::remove(path);  // the mapping stays valid after unlink
  }
  return m;
}

void set_f32_weight(const std::filesystem::path& gguf, const std::string& tensor, int64_t index,
                    float value) {
  std::vector<uint8_t> bytes(std::filesystem::file_size(gguf));
  {
    std::ifstream in(gguf, std::ios::binary);
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  const GgufFile file = GgufFile::parse(bytes);
  const GgufTensor* t = file.find_tensor(tensor);
  if (!t || t->type != DType::F32 || index < 0 || index >= t->n_elements())
    throw std::runtime_error("set_f32_weight: no F32 tensor " + tensor + " with element " +
                             std::to_string(index));
  const size_t at = static_cast<size_t>(t->data - bytes.data()) + static_cast<size_t>(index) * sizeof(float);
  std::memcpy(bytes.data() + at, &value, sizeof value);
  std::ofstream(gguf, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("DEPCACHE_SHARED"); env && *env) return env;
  std::filesystem::path p = DEPCACHE_SHARED_DIR;
  return std::filesystem::exists(p) ? p : std::filesystem::path{};
}

std::filesystem::path llama_cpp_dir() {
  if (const char* env = std::getenv("DEPCACHE_LLAMA_CPP"); env && *env) return env;
  std::filesystem::path p = DEPCACHE_LLAMA_CPP_DIR;
  return std::filesystem::exists(p) ? p : std::filesystem::path{};
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("no free loopback port");
  ::close(fd);
  return ntohs(addr.sin_port);
}

namespace {

// The process id the Redis server on connected socket `fd` reports (INFO
// server's process_id); -2 when it answers with an error (a password is
// required), -1 when it does not answer as Redis.
int redis_pid_at(int fd) {
  const timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string ask = "INFO server\r\n";
  if (::send(fd, ask.data(), ask.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(ask.size())) return -1;
  std::string got;
  char buf[4096];
  for (;;) {
    const size_t at = got.find("process_id:");
    if (at != std::string::npos && got.find("\r\n", at) != std::string::npos)
      return std::atoi(got.c_str() + at + 11);
    if (got.starts_with("-") && got.find("\r\n") != std::string::npos) return -2;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0 || got.size() > 65536) return -1;
    got.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

RedisServer::RedisServer(std::vector<std::string> extra_args) {
  if (!std::filesystem::exists("/usr/bin/redis-server")) return;
  for (int attempt = 0; attempt < 5; ++attempt) {
    port_ = free_port();
    extra_args_ = extra_args;
    for (std::string& a : extra_args_)
      if (a == kFreePort) a = std::to_string(free_port());
    if (launch()) return;
  }
  throw std::runtime_error("redis-server exited at start on five pairs of free ports");
}

RedisServer::~RedisServer() { stop(); }

void RedisServer::start() {
  if (!launch())
    throw std::runtime_error("redis-server did not start again on port " + std::to_string(port_));
}

bool RedisServer::launch() {
  const std::string port = std::to_string(port_);
  pid_ = fork();
  if (pid_ == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    std::vector<std::string> args{"redis-server", "--port",      port, "--bind",
                                  "127.0.0.1",    "--save",      "",   "--appendonly",
                                  "no",           "--daemonize", "no"};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv("/usr/bin/redis-server", argv.data());
    _exit(127);
  }
  // Ready when it accepts connections.
  for (int i = 0; i < 500; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    const bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    // The server that answers must be ours: another test's redis-server may
    // have taken the port between free_port() and our bind (ours then exits).
    const int pid = up ? redis_pid_at(fd) : -1;
    ::close(fd);
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {  // it gave up (a port in use, usually)
      pid_ = -1;
      return false;
    }
    // (One that wants a password cannot say which it is: ours while our child runs.)
    if (pid == pid_ || pid == -2) return true;
    if (up) {  // another server's port: ours is about to give up
      stop();
      return false;
    }
    usleep(10000);
  }
  throw std::runtime_error("redis-server did not start on port " + port);
}

void RedisServer::stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

RedisCluster::RedisCluster(int masters, int replicas) {
  if (!std::filesystem::exists("/usr/bin/redis-server")) return;
  dir_ = temp_path("redis-cluster");
  std::filesystem::create_directories(dir_);
  std::string create = "redis-cli --cluster create";
  for (int i = 0; i < masters * (1 + replicas); ++i) {
    // A folder per node: a replica writes its master's snapshot to dump.rdb
    // in its folder and then loads that file, so replicas sharing one folder
    // could load each other's masters' keys (seen: 257 keys on the replicas
    // where 240 were written).
    const std::filesystem::path node_dir = dir_ / ("node-" + std::to_string(i));
    std::filesystem::create_directories(node_dir);
    const std::string conf = (node_dir / "nodes.conf").string();
    // The cluster bus gets a port of its own (not port + 10000, which may be taken).
    nodes_.push_back(std::make_unique<RedisServer>(std::vector<std::string>{
        "--cluster-enabled", "yes", "--cluster-config-file", conf, "--cluster-node-timeout", "1000",
        "--cluster-port", RedisServer::kFreePort, "--dir", node_dir.string(),
        // What a cache wants (docs/tiers.md): the other masters keep serving
        // while one master's slots have no master.
        "--cluster-require-full-coverage", "no"}));
    create += " 127.0.0.1:" + std::to_string(nodes_.back()->port());
  }
  create += " --cluster-replicas " + std::to_string(replicas) + " --cluster-yes 2>&1";
  const CliRun r = run_shell(create);
  if (r.code != 0) throw std::runtime_error("redis-cli --cluster create failed: " + r.out);
  if (!wait_ok(masters, 20000)) throw std::runtime_error("the Redis Cluster did not come up within 20 s");
}

RedisCluster::~RedisCluster() {
  nodes_.clear();
  if (!dir_.empty()) std::filesystem::remove_all(dir_);
}

std::vector<int> RedisCluster::ports() const {
  std::vector<int> out;
  for (const auto& n : nodes_) out.push_back(n->port());
  return out;
}

std::string RedisCluster::seeds() const {
  std::string s;
  for (size_t i = 0; i < nodes_.size() && i < 2; ++i)
    s += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(nodes_[i]->port());
  return s;
}

std::string RedisCluster::cli(int port, const std::string& args) const {
  return run_shell("redis-cli -p " + std::to_string(port) + " " + args + " 2>&1").out;
}

void RedisCluster::kill(int port) {
  for (const auto& n : nodes_)
    if (n->port() == port) n->stop();
}

std::vector<int> RedisCluster::masters() const {
  std::vector<int> out;
  for (const auto& n : nodes_)
    if (n->running() && cli(n->port(), "role").rfind("master", 0) == 0) out.push_back(n->port());
  return out;
}

bool RedisCluster::wait_ok(int masters, int timeout_ms) const {
  for (int waited = 0; waited < timeout_ms; waited += 100) {
    bool ok = true;
    for (const auto& n : nodes_)
      if (n->running() && cli(n->port(), "cluster info").find("cluster_state:ok") == std::string::npos)
        ok = false;
    if (ok && static_cast<int>(this->masters().size()) == masters) return true;
    usleep(100000);
  }
  return false;
}

std::filesystem::path temp_path(const std::string& stem) {
  static std::atomic<int> counter{0};
  return std::filesystem::temp_directory_path() /
         (stem + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
}

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

CliRun run_cli(const std::string& args, const std::string& stdin_text) {
  const auto in = temp_path("stdin");
  std::ofstream(in, std::ios::binary) << stdin_text;
  CliRun r = run_shell(std::string(DEPCACHE_BINARY) + " " + args + " <" + in.string() + " 2>&1");
  std::filesystem::remove(in);
  return r;
}

CliRun run_shell(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while (p && (n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

namespace {
template <class B>
double report_max_abs_diff(std::span<const float> a, std::span<const B> b, const std::string& label) {
  const double m = max_abs_difference(a, b);
  std::printf("[check] %s: max |diff| = %.3g over %zu values%s\n", label.c_str(), m, a.size(),
              a.size() == b.size() ? "" : " (lengths differ)");
  return m;
}
}  // namespace

double max_abs_diff(std::span<const float> a, std::span<const float> b, const std::string& label) {
  return report_max_abs_diff(a, b, label);
}

double max_abs_diff(std::span<const float> a, std::span<const double> b, const std::string& label) {
  return report_max_abs_diff(a, b, label);
}

double max_abs_diff(const float* a, const float* b, int64_t n, const std::string& label) {
  return report_max_abs_diff(std::span(a, n), std::span(b, n), label);
}

double max_rel_diff(std::span<const float> got, std::span<const double> ref, const std::string& label) {
  double scale = 1e-30;
  for (double r : ref) scale = std::isfinite(r) ? std::max(scale, std::fabs(r)) : INFINITY;
  const double d = max_abs_difference(got, ref);
  std::printf("[check] %s: max |diff| = %.3g, max |ref| = %.3g\n", label.c_str(), d, scale);
  return std::isfinite(scale) ? d / scale : INFINITY;
}

bool strict_mode() {
  const char* s = std::getenv("DEPCACHE_STRICT");
  return s && *s && std::string(s) != "0";
}

void print_skip_reason(const std::string& reason) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("[skip-reason] %s.%s: %s\n", info ? info->test_suite_name() : "?", info ? info->name() : "?",
              reason.c_str());
  std::fflush(stdout);
}

KvAssembly prompt_assembly(const ModelConfig& config, const KvSpan& rows) {
  KvAssembly kv(config, std::max<int64_t>(rows.n_tokens(), 1), rows.type());
  // At the positions the rows were encoded at: placed as they are, unrotated.
  kv.place(rows, 0, rows.n_tokens(), 0, rows.positions());
  kv.set_n_past(rows.n_tokens());
  return kv;
}

std::string cpu_skip_reason(const std::string& reason) { return "(cpu) " + reason; }

std::string isa_missing_reason(Isa isa) {
  return "this CPU cannot run the " + std::string(isa_name(isa)) + " kernels";
}

bool isa_available(Isa isa) {
  if (isa_supported(isa)) return true;
  print_skip_reason(cpu_skip_reason(isa_missing_reason(isa)));
  []() { GTEST_SKIP(); }();  // records the skip without returning from the caller
  return false;
}

std::vector<int64_t> rows_seen(const Visibility& v, int64_t q) {
  std::vector<int64_t> rows;
  for (const RowRange& r : v.visible(q))
    for (int64_t j = r.begin; j < r.end; ++j) rows.push_back(j);
  return rows;
}

}  // namespace depcache::test

#include "server/server_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace depcache::test {

using nlohmann::json;

bool have_curl() { return std::system("curl --version >/dev/null 2>&1") == 0; }

Reply curl(int port, const std::string& path, const std::string& args) {
  const auto body = temp_path("body");
  const std::string out =
      run_shell(fmt::format("curl -s -N -o {} -w '%{{http_code}}' {} http://127.0.0.1:{}{}", body.string(),
                            args, port, path))
          .out;
  Reply r;
  r.status = out.empty() ? 0 : std::stoi(out);
  r.body = slurp(body);
  std::filesystem::remove(body);
  return r;
}

std::string post(const json& body) {
  // curl reads the file after this returns: removed at exit.
  static struct Files {
    std::mutex mu;
    std::vector<std::filesystem::path> paths;
    ~Files() {
      for (const auto& p : paths) std::filesystem::remove(p);
    }
  } files;
  const auto file = temp_path("request");
  std::ofstream(file) << body.dump();
  {
    std::lock_guard lock(files.mu);
    files.paths.push_back(file);
  }
  return fmt::format("-H 'Content-Type: application/json' --data-binary @{}", file.string());
}

Reply slow_post(int port, const std::string& path, const json& body, size_t chunk,
                std::chrono::milliseconds pause) {
  Reply r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r;
  const int rcvbuf = 2048;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string raw;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string text = body.dump();
    const std::string request = fmt::format(
        "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
        "Connection: close\r\n\r\n{}",
        path, text.size(), text);
    for (size_t sent = 0; sent < request.size();) {
      const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    std::vector<char> buf(chunk);
    for (ssize_t n; (n = recv(fd, buf.data(), buf.size(), 0)) > 0;) {
      raw.append(buf.data(), static_cast<size_t>(n));
      std::this_thread::sleep_for(pause);
    }
  }
  close(fd);
  const size_t head_end = raw.find("\r\n\r\n");
  if (!raw.starts_with("HTTP/1.1 ") || head_end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  const std::string head = raw.substr(0, head_end);
  std::string rest = raw.substr(head_end + 4);
  if (head.find("Transfer-Encoding: chunked") == std::string::npos) {
    r.body = std::move(rest);
    return r;
  }
  for (size_t at = 0;;) {  // size in hex, CRLF, data, CRLF; a 0 size ends
    const size_t line_end = rest.find("\r\n", at);
    if (line_end == std::string::npos) break;
    const size_t size = std::stoul(rest.substr(at, line_end - at), nullptr, 16);
    if (size == 0) break;
    r.body += rest.substr(line_end + 2, size);
    at = line_end + 2 + size + 2;
  }
  return r;
}

std::pair<std::string, json> read_stream(const std::string& body) {
  std::string text;
  json last;
  size_t at = 0;
  bool done = false;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    last = json::parse(data);
    if (!last.contains("choices")) continue;
    const json& choice = last["choices"][0];
    if (choice.contains("text"))
      text += choice["text"].get<std::string>();
    else if (choice["delta"].contains("content"))
      text += choice["delta"]["content"].get<std::string>();
  }
  EXPECT_TRUE(done) << "the stream ends with [DONE]";
  return {text, last};
}

double sample(const std::string& metrics, const std::string& series) {
  size_t at = 0;
  while ((at = metrics.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || metrics[at - 1] == '\n') return std::stod(metrics.substr(at + series.size() + 1));
    ++at;
  }
  return -1;
}

const std::filesystem::path& serve_model_file() {
  static const std::filesystem::path path = [] {
    const auto p = temp_path("serve-model").replace_extension(".gguf");
    const CliRun r =
        run_cli(fmt::format("model new --preset tiny --layers 4 --embd 256 --heads 4 --heads-kv 2 --ff 768 "
                            "--ctx 32768 --seed 5 -o {}",
                            p.string()));
    if (r.code != 0) throw std::runtime_error(r.out);
    return p;
  }();
  return path;
}

ServeProcess::ServeProcess(const std::vector<std::string>& args, const std::string& command)
    : err_(temp_path("serve-log")) {
  std::vector<std::string> all = {DEPCACHE_BINARY, command, "--host", "127.0.0.1", "--port", "0"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return;
  pid_ = pid;
  // Ready once the model is loaded: the port is in the first line.
  for (int i = 0; i < 2400 && port_ == 0 && wait_exit(std::chrono::milliseconds(0)) < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    const std::string text = log();
    if (text.find("ready") == std::string::npos) continue;
    const size_t at = text.find("127.0.0.1:");
    if (at != std::string::npos) port_ = std::stoi(text.substr(at + 10));
  }
}

ServeProcess::~ServeProcess() {
  if (pid_ > 0 && wait_exit(std::chrono::milliseconds(0)) < 0) {
    kill(pid_, SIGKILL);
    wait_exit(std::chrono::seconds(10));
  }
  std::filesystem::remove(err_);
}

void ServeProcess::signal(int sig) const {
  if (pid_ > 0) kill(pid_, sig);
}

int ServeProcess::wait_exit(std::chrono::milliseconds limit) {
  if (exit_code_ >= 0 || pid_ <= 0) return exit_code_;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string ServeProcess::log() const { return slurp(err_); }

int64_t ServeProcess::peak_rss_bytes() const {
  std::ifstream in(fmt::format("/proc/{}/status", pid_));
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("VmHWM:")) return std::stoll(line.substr(6)) * 1024;  // kB
  return 0;
}

}  // namespace depcache::test

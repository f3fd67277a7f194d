#include "server/http_connection.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "server/openai.h"
#include "util/timing.h"

namespace depcache {
namespace {

// How the connection handed to a thread is to be treated: served, answered
// 503 at once (every slot busy), or closed unanswered (even the 503s are
// backed up).
enum class SlotMode { Serve, Busy, Drop };
thread_local SlotMode t_mode = SlotMode::Serve;

// The connection threads: up to `slots` connections served at once, each on
// a thread of its own (started when first needed, then kept); a connection
// beyond them is handed to the one rejecting thread instead of waiting for a
// slot. The library gives us a job per accepted connection; the job's
// mode tells process_and_close_socket what to do with it.
class SlotQueue : public httplib::TaskQueue {
 public:
  // `short_at`: set to the time whenever a connection is turned away.
  SlotQueue(size_t slots, std::atomic<int64_t>& short_at)
      : slots_(std::max<size_t>(slots, 1)), short_at_(short_at) {
    rejecter_ = std::thread([this] { reject_loop(); });
  }
  ~SlotQueue() override = default;

  void enqueue(std::function<void()> fn) override {
    std::unique_lock lk(mu_);
    if (busy_ < slots_) {
      ++busy_;
      // A thread that is idle but already woken for an earlier job does not
      // count: every queued job needs an idle thread of its own.
      const bool idle_thread = idle_ > jobs_.size();
      jobs_.push_back(std::move(fn));
      if (idle_thread) {
        lk.unlock();
        work_.notify_one();
      } else {
        try {
          threads_.emplace_back([this] { work_loop(); });
        } catch (const std::system_error&) {
          // No thread to be had: the job is taken back and closed unanswered.
          std::function<void()> job = std::move(jobs_.back());
          jobs_.pop_back();
          --busy_;
          lk.unlock();
          run(job, SlotMode::Drop);
        }
      }
      return;
    }
    short_at_.store(steady_now_ms(), std::memory_order_relaxed);
    if (rejects_.size() < kMaxRejectsQueued) {
      rejects_.push_back(std::move(fn));
      lk.unlock();
      reject_.notify_one();
      return;
    }
    // Even the rejecting thread is backed up: close unanswered, here.
    lk.unlock();
    run(fn, SlotMode::Drop);
  }

  void shutdown() override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    work_.notify_all();
    reject_.notify_all();
    for (std::thread& t : threads_) t.join();
    rejecter_.join();
  }

 private:
  static constexpr size_t kMaxRejectsQueued = 4096;

  // Nothing may escape a connection's thread (it would end the process).
  static void run(const std::function<void()>& fn, SlotMode mode) {
    t_mode = mode;
    try {
      fn();
    } catch (...) {
    }
    t_mode = SlotMode::Serve;
  }

  void work_loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      ++idle_;
      work_.wait(lk, [&] { return !jobs_.empty() || stopping_; });
      --idle_;
      if (jobs_.empty()) return;  // stopping, nothing left
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      run(fn, SlotMode::Serve);
      lk.lock();
      --busy_;
    }
  }

  void reject_loop() {
    std::unique_lock lk(mu_);
    for (;;) {
      reject_.wait(lk, [&] { return !rejects_.empty() || stopping_; });
      if (rejects_.empty()) return;
      std::function<void()> fn = std::move(rejects_.front());
      rejects_.pop_front();
      // Stopping: what still waits for its 503 is closed at once.
      const SlotMode mode = stopping_ ? SlotMode::Drop : SlotMode::Busy;
      lk.unlock();
      run(fn, mode);
      lk.lock();
    }
  }

  const size_t slots_;
  std::atomic<int64_t>& short_at_;
  std::mutex mu_;
  std::condition_variable work_, reject_;
  std::deque<std::function<void()>> jobs_, rejects_;
  std::vector<std::thread> threads_;  // joined at shutdown (guarded by mu_ while adding)
  std::thread rejecter_;
  size_t busy_ = 0, idle_ = 0;
  bool stopping_ = false;
};

// A connection's socket as the library's Stream, with the limits applied to
// what is read. Bytes are read in blocks and handed over as asked (the
// library reads a request line and headers byte by byte); while a request's
// head is being handed over its bytes and lines are counted, then its body's
// bytes. Every read waits at most until the request's deadline.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(socket_t sock, const HttpLimits& limits, const std::atomic<socket_t>& listening,
                   const std::atomic<int64_t>& slots_short_at_ms)
      : sock_(sock), limits_(limits), listening_(listening), slots_short_at_ms_(slots_short_at_ms) {
    // The body bound is on the bytes as sent: a chunked body's framing (a
    // size line and CRLF per chunk) is allowed for on top of the limit. The
    // handlers check the decoded size exactly.
    body_cap_ = limits_.max_body_bytes + limits_.max_body_bytes / 2 + 64 * 1024;
  }

  // A new request starts: its head is counted afresh, its bytes must all
  // arrive by `deadline`.
  void begin_request(Clock::time_point deadline) {
    deadline_ = deadline;
    in_head_ = true;
    head_bytes_ = head_lines_ = line_bytes_ = 0;
    prev_ = '\0';
    body_bytes_ = 0;
    violation_ = HttpViolation::None;
    wrote_ = false;
    head_.clear();
    head_seen_ = false;
  }
  HttpViolation violation() const { return violation_; }
  // The connection ends after the response being made (its request's body
  // was not read).
  void close_after() { close_after_ = true; }
  bool closing() const { return close_after_; }
  bool wrote() const { return wrote_; }
  bool buffered() const { return pos_ < len_; }

  // Waits up to `idle` for the next request's first byte; false when none
  // came (or the server is stopping, or the client closed). While the
  // server turns connections away, an idle one gives its slot back: at once
  // between requests, after `first_grace` before its first (whose bytes may
  // be on their way). *released says which.
  bool wait_next(std::chrono::milliseconds idle, bool first, bool* released) {
    *released = false;
    if (buffered()) return true;
    const auto start = Clock::now(), until = start + idle;
    while (!stopping()) {
      const auto now = Clock::now();
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now);
      if (left.count() <= 0) return false;
      if ((!first || now - start >= kFirstGrace) &&
          steady_now_ms() - slots_short_at_ms_.load(std::memory_order_relaxed) < kShortMemoryMs) {
        *released = true;
        return false;
      }
      const int r = poll_for(POLLIN, std::min<int64_t>(left.count(), kSliceMs));
      if (r < 0) return false;
      if (r > 0) return true;
    }
    return false;
  }

  bool is_readable() const override { return buffered() || poll_for(POLLIN, 0) > 0; }
  bool is_writable() const override {
    return poll_for(POLLOUT, static_cast<int>(limits_.write_timeout.count())) > 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (violation_ != HttpViolation::None) return -1;
    if (!buffered()) {
      const ssize_t n = fill();
      if (n <= 0) return n;
    }
    size_t n = std::min(size, len_ - pos_);
    if (in_head_) {
      // Handed over up to the end of the head at most, so the body is
      // counted from its first byte.
      size_t i = 0;
      while (i < n) {
        const char c = buf_[pos_ + i++];
        ++head_bytes_;
        const char before = prev_;
        prev_ = c;
        if (c != '\n') {
          ++line_bytes_;
          continue;
        }
        ++head_lines_;
        // (The CR may have come in an earlier read than the LF.)
        const bool blank = line_bytes_ == 1 && before == '\r';
        line_bytes_ = 0;
        if (blank) {
          in_head_ = false;
          break;
        }
      }
      n = i;
      // The request line is the first line; the blank line ends the head.
      if (head_bytes_ > limits_.max_header_bytes) return violate(HttpViolation::HeaderTooLarge);
      if (head_lines_ > limits_.max_header_lines + 2) return violate(HttpViolation::TooManyHeaders);
    } else {
      body_bytes_ += n;
      if (body_bytes_ > body_cap_) return violate(HttpViolation::BodyTooLarge);
    }
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  // A response whose length is known leaves in one send with its head (the
  // library writes the head, then the body): a server killed between the two
  // would leave a proxy holding a head it has passed on, unable to retry the
  // request elsewhere; killed before the send, the proxy sees no answer and
  // retries. A streamed (chunked) head goes at once so that the client
  // learns the stream has begun.
  ssize_t write(const char* ptr, size_t size) override {
    if (!head_seen_) {
      const std::string_view head(ptr, size);
      // An interim answer ("100 Continue") goes at once: the client waits
      // for it before sending its body; the final head follows.
      const bool interim = head.starts_with("HTTP/1.1 1");
      head_seen_ = !interim;
      if (!interim && head.starts_with("HTTP/") && !chunked(head)) {
        head_.assign(ptr, size);
        return static_cast<ssize_t>(size);
      }
    }
    if (!head_.empty()) {
      head_.append(ptr, size);
      return flush_head() ? static_cast<ssize_t>(size) : -1;
    }
    return send_some(ptr, size);
  }

  // Sends a head held back for a body that never came (no body, HEAD).
  bool flush_head() {
    std::string out;
    out.swap(head_);
    for (size_t sent = 0; sent < out.size();) {
      const ssize_t n = send_some(out.data() + sent, out.size() - sent);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(::getpeername, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(::getsockname, ip, port); }
  socket_t socket() const override { return sock_; }

 private:
  // Waits are cut in slices so that a stopping server (or one short of
  // slots) is noticed.
  static constexpr int64_t kSliceMs = 100;
  // Slots count as short for this long after a connection was turned away.
  static constexpr int64_t kShortMemoryMs = 1000;
  // A new connection's first request may be on its way this long.
  static constexpr std::chrono::milliseconds kFirstGrace{1000};

  bool stopping() const { return listening_.load() == INVALID_SOCKET; }

  ssize_t send_some(const char* ptr, size_t size) {
    if (!is_writable()) return -1;
    const ssize_t n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    if (n > 0) wrote_ = true;
    return n;
  }

  static bool chunked(std::string_view head) {
    std::string lower(head);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return lower.find("\r\ntransfer-encoding: chunked") != std::string::npos;
  }

  ssize_t violate(HttpViolation v) {
    violation_ = v;
    return -1;
  }

  int poll_for(short events, int timeout_ms) const {
    pollfd p{sock_, events, 0};
    for (;;) {
      const int r = ::poll(&p, 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r > 0 && (p.revents & (POLLERR | POLLNVAL))) return -1;
      return r;
    }
  }

  // Reads what has arrived into the buffer, waiting until the deadline.
  ssize_t fill() {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
      if (left.count() <= 0) return violate(HttpViolation::Timeout);
      if (stopping()) return -1;
      const int r = poll_for(POLLIN, static_cast<int>(std::min<int64_t>(left.count(), kSliceMs)));
      if (r < 0) return -1;
      if (r == 0) continue;
      const ssize_t n = ::recv(sock_, buf_, sizeof buf_, 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) return n;
      pos_ = 0;
      len_ = static_cast<size_t>(n);
      return n;
    }
  }

  template <typename F>
  void address(F get, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ip.clear();
    port = 0;
    if (get(sock_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
      ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
      ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
      port = ntohs(a->sin6_port);
    }
    ip = text;
  }

  socket_t sock_;
  const HttpLimits& limits_;
  const std::atomic<socket_t>& listening_;
  const std::atomic<int64_t>& slots_short_at_ms_;
  char buf_[16384];
  size_t pos_ = 0, len_ = 0;
  Clock::time_point deadline_{};
  bool in_head_ = true;
  char prev_ = '\0';  // the byte before, in the head
  size_t head_bytes_ = 0, head_lines_ = 0, line_bytes_ = 0, body_bytes_ = 0, body_cap_ = 0;
  HttpViolation violation_ = HttpViolation::None;
  bool wrote_ = false;
  bool close_after_ = false;
  std::string head_;  // a response head held back for its body
  bool head_seen_ = false;
};

thread_local ConnectionStream* t_stream = nullptr;

// Requests read from memory, answers written into memory: the library's
// request processing run once without a socket (build_library_statics).
class MemoryStream : public httplib::Stream {
 public:
  explicit MemoryStream(std::string in) : in_(std::move(in)) {}
  bool is_readable() const override { return pos_ < in_.size(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size() - pos_);
    std::memcpy(ptr, in_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 0;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override { get_remote_ip_and_port(ip, port); }
  socket_t socket() const override { return INVALID_SOCKET; }
  bool answered() const { return out_.starts_with("HTTP/1.1 "); }

 private:
  std::string in_, out_;
  size_t pos_ = 0;
};

// Closes a connection the server is done with while the client may still
// be sending: closing with unread bytes would reset the connection and the
// client could lose the response, so stop sending, then read and discard
// what comes for a moment (bounded in time and bytes).
void lingering_close(socket_t sock, std::chrono::milliseconds linger) {
  ::shutdown(sock, SHUT_WR);
  const auto until = Clock::now() + linger;
  char sink[16384];
  size_t drained = 0;
  while (Clock::now() < until && drained < (size_t{4} << 20)) {
    pollfd in{sock, POLLIN, 0};
    if (::poll(&in, 1, 10) <= 0) continue;
    const ssize_t n = ::recv(sock, sink, sizeof sink, MSG_DONTWAIT);
    if (n <= 0) break;
    drained += static_cast<size_t>(n);
  }
  ::close(sock);
}

// A whole response written directly (no request was parsed, or the library
// gave up on it), then the connection closed.
void write_and_close(socket_t sock, int status, const char* reason, const ApiError& error,
                     std::chrono::milliseconds linger) {
  const std::string body = error_body(error).dump();
  const std::string head = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
      status, reason, body.size(), status == 503 ? "Retry-After: 1\r\n" : "");
  const std::string out = head + body;
  pollfd p{sock, POLLOUT, 0};
  if (::poll(&p, 1, 100) > 0) (void)::send(sock, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  lingering_close(sock, linger);
}

// While a connection is served: counted, and its stream the one the
// handlers on this thread see.
struct ServingConnection {
  std::atomic<int64_t>& open;
  ServingConnection(std::atomic<int64_t>& o, ConnectionStream* s) : open(o) {
    open.fetch_add(1, std::memory_order_relaxed);
    t_stream = s;
  }
  ~ServingConnection() {
    t_stream = nullptr;
    open.fetch_sub(1, std::memory_order_relaxed);
  }
};

// A request the connection layer cut short, counted under its reason.
void count_violation(HttpRejections& rejections, HttpViolation v) {
  switch (v) {
    case HttpViolation::Timeout:
      rejections.timeout.fetch_add(1, std::memory_order_relaxed);
      break;
    case HttpViolation::BodyTooLarge:
      rejections.body_too_large.fetch_add(1, std::memory_order_relaxed);
      break;
    default:
      rejections.header_too_large.fetch_add(1, std::memory_order_relaxed);
  }
}

const char* reason_phrase(int status) {
  switch (status) {
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Bad Request";
  }
}

}  // namespace

std::optional<ApiError> framing_error(const httplib::Request& req) {
  if (req.get_header_value_count("Content-Length") > 1 || req.get_header_value_count("Transfer-Encoding") > 1)
    return ApiError(400, "a request carries one Content-Length or one Transfer-Encoding header");
  if (!req.has_header("Transfer-Encoding")) return std::nullopt;
  if (req.has_header("Content-Length"))
    return ApiError(400, "a request carries Content-Length or Transfer-Encoding, not both");
  const std::string te = req.get_header_value("Transfer-Encoding");
  const bool chunked = std::ranges::equal(
      te, std::string_view("chunked"), [](unsigned char a, unsigned char b) { return std::tolower(a) == b; });
  if (!chunked)
    return ApiError(501, fmt::format("Transfer-Encoding '{}' is not accepted (only chunked)", te));
  return std::nullopt;
}

int violation_status(HttpViolation v) {
  switch (v) {
    case HttpViolation::Timeout:
      return 408;
    case HttpViolation::HeaderTooLarge:
    case HttpViolation::TooManyHeaders:
      return 431;
    case HttpViolation::BodyTooLarge:
      return 413;
    case HttpViolation::None:
      break;
  }
  return 400;
}

const char* violation_message(HttpViolation v) {
  switch (v) {
    case HttpViolation::Timeout:
      return "the request was not received in time (--request-timeout)";
    case HttpViolation::HeaderTooLarge:
      return "the request line and headers are larger than the server accepts (--max-header-bytes)";
    case HttpViolation::TooManyHeaders:
      return "the request has more header lines than the server accepts (--max-headers)";
    case HttpViolation::BodyTooLarge:
      return "the request body is larger than the server accepts (--max-body)";
    case HttpViolation::None:
      break;
  }
  return "bad request";
}

GuardedHttpServer::GuardedHttpServer(const HttpLimits& limits) : limits_(limits) {
  const size_t slots = limits_.max_connections;
  new_task_queue = [this, slots] { return new SlotQueue(slots, slots_short_at_ms_); };
  set_payload_max_length(limits_.max_body_bytes);
  // What the library announces in its Keep-Alive header.
  set_keep_alive_timeout(std::max<time_t>(1, limits_.keep_alive_timeout.count() / 1000));
  set_keep_alive_max_count(limits_.max_requests_per_connection);
  // The sockets' own send timeout (the library sets it on each connection):
  // a send into a full buffer blocks no longer than this.
  set_write_timeout(std::chrono::milliseconds(limits_.write_timeout));
  build_library_statics();
}

void GuardedHttpServer::build_library_statics() {
  // No handler is set yet: each is answered (404) by the library alone, into
  // memory, and counted nowhere.
  static constexpr std::string_view kBoundary = "depcache-boundary";
  const std::string body = fmt::format(
      "--{0}\r\nContent-Disposition: form-data; name=\"a\"; filename=\"a.txt\"\r\n"
      "Content-Type: text/plain\r\n\r\na\r\n--{0}--\r\n",
      kBoundary);
  const std::string requests[] = {
      "GET / HTTP/1.1\r\nHost: localhost\r\nRange: bytes=0-1, 2-3\r\n\r\n",
      fmt::format("POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary={}\r\n"
                  "Content-Length: {}\r\n\r\n{}",
                  kBoundary, body.size(), body),
  };
  for (const std::string& request : requests) {
    MemoryStream stream(request);
    bool closed = false;
    process_request(stream, true, closed, nullptr);
    if (!stream.answered())
      throw std::logic_error("the HTTP library did not answer a request read from memory");
  }
}

bool ChunkWriter::write(std::string_view data) {
  if (data.empty()) return true;
  std::string chunk = fmt::format("{:x}\r\n", data.size());
  chunk.reserve(chunk.size() + data.size() + 2);
  chunk.append(data);
  chunk.append("\r\n");
  return sink_.write(chunk.data(), chunk.size());
}

bool ChunkWriter::finish() {
  static constexpr std::string_view kLast = "0\r\n\r\n";
  if (!sink_.write(kLast.data(), kLast.size())) return false;
  sink_.done();
  return true;
}

void set_chunked_body(httplib::Response& res, const std::string& content_type,
                      std::function<bool(ChunkWriter&)> produce, std::function<void(bool)> released) {
  // The library passes a body without a length through unframed; the
  // header tells the client how it is framed.
  res.set_header("Transfer-Encoding", "chunked");
  res.set_content_provider(
      content_type,
      [produce = std::move(produce)](size_t, httplib::DataSink& sink) {
        ChunkWriter writer(sink);
        return produce(writer);
      },
      std::move(released));
}

std::string render_http_metrics(const GuardedHttpServer& server) {
  const HttpRejections& r = server.rejections();
  std::string out =
      "# HELP depcache_http_rejected_total Connections and requests the HTTP layer refused or closed: "
      "busy (every connection slot taken: 503), peer_limit (as many from that address as it may hold: "
      "503), idle_released (idle while slots were short: closed), timeout (not received in time: 408), "
      "header_too_large (431), body_too_large (413), failed (a fault while answering)\n"
      "# TYPE depcache_http_rejected_total counter\n";
  const std::pair<const char*, const std::atomic<int64_t>*> rows[] = {
      {"busy", &r.busy},
      {"peer_limit", &r.peer_limit},
      {"idle_released", &r.idle_released},
      {"timeout", &r.timeout},
      {"header_too_large", &r.header_too_large},
      {"body_too_large", &r.body_too_large},
      {"failed", &r.failed}};
  for (const auto& [reason, n] : rows)
    out += fmt::format("depcache_http_rejected_total{{reason=\"{}\"}} {}\n", reason, n->load());
  out += fmt::format(
      "# HELP depcache_http_open_connections Connections being served now\n"
      "# TYPE depcache_http_open_connections gauge\ndepcache_http_open_connections {}\n",
      server.open_connections());
  return out;
}

bool GuardedHttpServer::client_gone() {
  if (!t_stream) return false;
  pollfd p{t_stream->socket(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

void GuardedHttpServer::close_after_response() {
  if (t_stream) t_stream->close_after();
}

HttpViolation GuardedHttpServer::current_violation() {
  return t_stream ? t_stream->violation() : HttpViolation::None;
}

bool GuardedHttpServer::answer_violation(httplib::Response& res) {
  const HttpViolation v = current_violation();
  if (v == HttpViolation::None) return false;
  res.status = violation_status(v);
  res.set_content(error_body(ApiError(res.status, violation_message(v))).dump(), "application/json");
  res.set_header("Connection", "close");
  return true;
}

void GuardedHttpServer::reject_busy(socket_t sock) {
  rejections_.busy.fetch_add(1, std::memory_order_relaxed);
  write_and_close(sock, 503, reason_phrase(503),
                  ApiError(503,
                           fmt::format("the server is serving as many connections as it takes ({}); retry "
                                       "shortly (--http-threads)",
                                       limits_.max_connections),
                           "server_error", {}, "server_busy"),
                  std::chrono::milliseconds(50));
}

void GuardedHttpServer::reject_peer(socket_t sock, const std::string& ip) {
  rejections_.peer_limit.fetch_add(1, std::memory_order_relaxed);
  write_and_close(sock, 503, reason_phrase(503),
                  ApiError(503,
                           fmt::format("{} holds as many connections as one address may ({}); retry shortly "
                                       "(--max-connections-per-peer)",
                                       ip, per_peer_limit(limits_)),
                           "server_error", {}, "server_busy"),
                  std::chrono::milliseconds(50));
}

size_t GuardedHttpServer::per_peer_limit(const HttpLimits& l) {
  return l.max_connections_per_peer > 0 ? l.max_connections_per_peer
                                        : std::max<size_t>(1, l.max_connections / 2);
}

bool GuardedHttpServer::hold_peer(const std::string& ip) {
  std::unique_lock lk(peers_mu_);
  // A client that closes a connection and opens the next at once (a load
  // generator at the limit) may arrive before the old one is counted out:
  // a moment's wait tells that from a peer holding its share.
  const bool under = peers_cv_.wait_for(lk, std::chrono::milliseconds(20), [&] {
    const auto it = peers_.find(ip);
    return it == peers_.end() || it->second < per_peer_limit(limits_);
  });
  if (!under) return false;
  ++peers_[ip];
  return true;
}

void GuardedHttpServer::release_peer(const std::string& ip) {
  std::lock_guard lk(peers_mu_);
  const auto it = peers_.find(ip);
  if (it != peers_.end() && --it->second == 0) peers_.erase(it);
  peers_cv_.notify_all();
}

bool GuardedHttpServer::refuse_without_slot(socket_t sock) {
  if (t_mode == SlotMode::Drop) {
    rejections_.busy.fetch_add(1, std::memory_order_relaxed);
    ::close(sock);
    return true;
  }
  if (t_mode == SlotMode::Busy) {
    reject_busy(sock);
    return true;
  }
  return false;
}

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  if (refuse_without_slot(sock)) return false;
  ConnectionStream stream(sock, limits_, svr_sock_, slots_short_at_ms_);
  std::string ip;
  int port = 0;
  stream.get_remote_ip_and_port(ip, port);
  if (!hold_peer(ip)) {
    reject_peer(sock, ip);
    return false;
  }
  // Released when the connection's last response is sent, before the
  // lingering close: a client that reconnects at once is not counted twice.
  struct PeerHold {
    GuardedHttpServer& server;
    const std::string& ip;
    bool held = true;
    void release() {
      if (std::exchange(held, false)) server.release_peer(ip);
    }
    ~PeerHold() { release(); }
  } peer{*this, ip};
  const ServingConnection serving(open_, &stream);
  bool ok = true;
  for (size_t served = 0; served < limits_.max_requests_per_connection; ++served) {
    // A connection that sends nothing (a probe, a preconnect) is closed
    // after the idle time, unanswered; a request, once begun, must arrive
    // whole within the request timeout.
    bool released = false;
    if (!stream.wait_next(limits_.keep_alive_timeout, served == 0, &released)) {
      if (released) rejections_.idle_released.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    stream.begin_request(Clock::now() + limits_.request_timeout);
    const bool last = served + 1 == limits_.max_requests_per_connection || svr_sock_ == INVALID_SOCKET;
    bool closed = false;
    try {
      ok = process_request(stream, last, closed, nullptr);
      ok = stream.flush_head() && ok;
    } catch (...) {
      // The handlers answer their own errors; this is a fault in writing one.
      rejections_.failed.fetch_add(1, std::memory_order_relaxed);
      ok = false;
    }
    if (const HttpViolation v = stream.violation(); v != HttpViolation::None) {
      count_violation(rejections_, v);
      if (!stream.wrote()) {
        // The library gave up before answering (the request line itself
        // was cut off): the client still learns why.
        const int status = violation_status(v);
        peer.release();
        write_and_close(sock, status, reason_phrase(status), ApiError(status, violation_message(v)),
                        std::chrono::milliseconds(200));
        return false;
      }
      break;
    }
    if (!ok || closed || stream.closing()) break;
  }
  peer.release();
  lingering_close(sock, std::chrono::milliseconds(200));
  return ok;
}

}  // namespace depcache

#pragma once
// The HTTP server's connection handling, with the limits a server facing
// untrusted clients needs and cpp-httplib 0.11 does not enforce itself:
//  - a bounded number of connections served at once, one thread each; a
//    connection beyond them gets an immediate 503 with Retry-After instead
//    of waiting unseen in a queue;
//  - a bounded number of them from one address, so one peer's unfinished
//    requests cannot hold every slot; and while connections are being
//    turned away, those idle between requests give their slots back;
//  - a deadline for receiving a whole request (request line, headers, body),
//    so slow senders are cut off (408), and an idle keep-alive timeout;
//  - the request line and headers bounded in bytes and lines (431), and the
//    body bounded whatever its transfer encoding (413), checked as the bytes
//    arrive, on every path;
//  - no exception escapes a connection's thread.
// The library still parses HTTP: requests are read through a stream of ours
// (the library's documented Stream interface) that counts what it hands over
// and enforces the deadline, and each connection runs the library's own
// request processing in a loop of ours.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "server/openai.h"

namespace depcache {

struct HttpLimits {
  size_t max_connections = 256;         // served at once, one thread each; more: 503
  size_t max_connections_per_peer = 0;  // from one IP address at once; more: 503 (0: half the slots)
  size_t max_body_bytes = size_t{1} << 20;
  size_t max_header_bytes = 32 * 1024;                 // request line and headers together
  size_t max_header_lines = 100;                       // header lines (the request line not counted)
  std::chrono::milliseconds request_timeout{30000};    // a request's first byte to its last
  std::chrono::milliseconds keep_alive_timeout{5000};  // idle between requests of a connection
  std::chrono::milliseconds write_timeout{10000};      // a client not reading the response
  size_t max_requests_per_connection = 1000;
};

// Why the connection layer cut a request short.
enum class HttpViolation { None, Timeout, HeaderTooLarge, TooManyHeaders, BodyTooLarge };

// What the connection layer refused, for /metrics.
struct HttpRejections {
  std::atomic<int64_t> busy{0}, peer_limit{0}, idle_released{0}, timeout{0}, header_too_large{0},
      body_too_large{0}, failed{0};
};

class GuardedHttpServer : public httplib::Server {
 public:
  explicit GuardedHttpServer(const HttpLimits& limits);
  const HttpLimits& limits() const { return limits_; }
  // Connections one address may hold: the limit, or half the slots.
  static size_t per_peer_limit(const HttpLimits& l);
  const HttpRejections& rejections() const { return rejections_; }
  // The violation of the request being processed on this thread (None
  // outside a connection): what the error handler turns into its status.
  static HttpViolation current_violation();
  // Answers that violation, if there is one (true): its status and an
  // OpenAI error body, the connection closed after it (the library saw a
  // read fail and would answer a bare 400).
  static bool answer_violation(httplib::Response& res);
  // The connection being served on this thread closes after the response
  // being made: a request refused before its body was read leaves the body
  // unread on the connection.
  static void close_after_response();
  // The client of the connection served on this thread has closed it (or
  // it failed): nobody will read the response.
  static bool client_gone();
  // Connections being served now.
  int64_t open_connections() const { return open_.load(std::memory_order_relaxed); }

 private:
  bool process_and_close_socket(socket_t sock) override;
  // A connection the accept loop found no slot for: closed at once while the
  // server stops, else answered 503 (true); false: it is served.
  bool refuse_without_slot(socket_t sock);
  // A connection beyond the limit: 503 and close, without reading its request.
  void reject_busy(socket_t sock);
  // One beyond its address's limit: the same, naming that limit.
  void reject_peer(socket_t sock, const std::string& ip);
  // Counts a connection from `ip` while it is served; false (nothing
  // counted) when that address holds its limit already.
  bool hold_peer(const std::string& ip);
  void release_peer(const std::string& ip);
  // Runs the library's request parsing once, in memory, on requests that
  // reach each of its function-local statics on the server's paths (the
  // method names, the Range and multipart regexes), so that they are built
  // before any worker thread runs: their first use is otherwise published
  // by guards ThreadSanitizer cannot see in the uninstrumented library.
  void build_library_statics();

  HttpLimits limits_;
  HttpRejections rejections_;
  std::atomic<int64_t> open_{0};
  // When a connection was last turned away for want of a slot (steady
  // clock, ms): connections idle since then give theirs back.
  std::atomic<int64_t> slots_short_at_ms_{std::numeric_limits<int64_t>::min() / 2};
  std::mutex peers_mu_;
  std::condition_variable peers_cv_;               // a connection counted out
  std::unordered_map<std::string, size_t> peers_;  // connections served per address
};

// The body of a streamed response, written as HTTP/1.1 chunks by this layer
// rather than by the library: each write is one chunk (size line, data,
// CRLF) handed to the connection in one piece, finish() the last chunk.
// (Debian's cpp-httplib 0.11 writes its final chunk from a function-local
// static string; its first use is published by a guard that
// ThreadSanitizer cannot see in the uninstrumented library, so two streams
// ending at once were reported as a race: docs/serving.md, "The HTTP
// library".)
class ChunkWriter {
 public:
  explicit ChunkWriter(httplib::DataSink& sink) : sink_(sink) {}
  // One chunk; nothing for empty data (a chunk of size 0 ends the body).
  // False: the client is gone.
  bool write(std::string_view data);
  // The last chunk; the body is complete.
  bool finish();

 private:
  httplib::DataSink& sink_;
};

// Sets `res` to stream a body of `content_type` in chunks: `produce` is
// called until it has called finish() (true) or fails (false: the client is
// gone, or the stream was abandoned); `released(success)` runs once the
// response is over, as the library's resource releaser.
void set_chunked_body(httplib::Response& res, const std::string& content_type,
                      std::function<bool(ChunkWriter&)> produce, std::function<void(bool)> released);

// The connection layer's counters in the Prometheus text format:
// depcache_http_rejected_total{reason} and depcache_http_open_connections.
std::string render_http_metrics(const GuardedHttpServer& server);

// A request whose body could be read in more than one way: Content-Length
// and Transfer-Encoding together, either twice, or an encoding other than
// chunked. A proxy in front may read it another way than this server, and
// pass bytes this server would read as the next request (request
// smuggling, RFC 9112 6.1): it is refused (400, 501 for an unknown
// encoding) and its connection closed, its body unread.
std::optional<ApiError> framing_error(const httplib::Request& req);

// The HTTP status of a violation, and the message a client gets.
int violation_status(HttpViolation v);
const char* violation_message(HttpViolation v);

}  // namespace depcache

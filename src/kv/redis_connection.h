#pragma once
// One connection to one Redis server (a standalone Redis or one node of a
// cluster), through hiredis, where every exchange has a deadline for the
// whole of it: sending, and reading every reply. Not thread-safe: the store
// that owns it serialises its calls.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/remote_store.h"
#include "util/timing.h"

struct redisContext;  // hiredis
struct redisReader;

namespace depcache {

using RedisCommand = std::vector<std::string_view>;

// The most elements one array of a reply may announce. hiredis allocates an
// array's element slots when it reads the count, before any element has
// arrived, so a hostile server's `*2000000000` would cost 16 GB at once. Our
// largest legitimate array is one value per key of a fetch, or one range per
// slot of a cluster map: far below.
inline constexpr int64_t kMaxRespArrayElements = int64_t{1} << 20;

// What a reader of replies from a server refuses: an array longer than
// kMaxRespArrayElements, and a reply whose strings together pass max_bytes
// (the strings of a reply are counted as the reader makes them; what is
// still buffered is counted by RedisConnection as it reads). Reading then
// stops with a reader error, and the guard says which.
struct RespGuard {
  size_t max_bytes = kDefaultMaxValueBytes;
  size_t bytes = 0;            // the strings of the reply being read, so far
  int64_t refused_array = 0;   // the count an array announced, when refused
  bool refused_bytes = false;  // the reply passed max_bytes
  void next_reply() { bytes = 0; }
};
// Puts `guard` (which must outlive the reader) on `reader`. Every reader of
// replies from a server goes through this.
void guard_resp_reader(redisReader* reader, RespGuard* guard);

class RedisConnection {
 public:
  // From `o`: the credentials (AUTH after every connect when a password is
  // set) and the deadline messages name (o.timeout_ms).
  RedisConnection(std::string host, int port, const RedisOptions& o);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Connects and authenticates unless open. False (closed, error() says why,
  // auth_refused() whether the server refused the credentials) on failure.
  bool open(int64_t deadline_ms);
  bool is_open() const { return ctx_ != nullptr; }
  void close();

  // Sends every command, then reads one reply per command, in order, all
  // before the deadline (steady clock, steady_now_ms()). Empty on a broken
  // connection or a missed deadline: the connection is then closed (a
  // context that saw an error cannot be reused) and error() says why.
  // Error replies are replies, not failures.
  std::vector<RedisReply> exchange(std::span<const RedisCommand> commands, int64_t deadline_ms,
                                   size_t max_reply_bytes = kDefaultMaxValueBytes);
  // exchange() in its two halves, so that several servers work on their
  // commands at once: send() writes every command (false: the connection
  // broke and is closed), replies() then reads `n` replies (empty as
  // exchange()'s).
  bool send(std::span<const RedisCommand> commands, int64_t deadline_ms);
  // Every reply may hold at most max_reply_bytes (more: the connection
  // breaks, as for a missed deadline).
  std::vector<RedisReply> replies(size_t n, int64_t deadline_ms,
                                  size_t max_reply_bytes = kDefaultMaxValueBytes);
  RedisReply command(const RedisCommand& command, int64_t deadline_ms,
                     size_t max_reply_bytes = kDefaultMaxValueBytes);
  // The next reply the server pushes (a subscription's messages) by the
  // deadline; null when none came (*timed_out set, the connection still
  // open) or the connection broke (closed, error() says why).
  RedisReply receive(int64_t deadline_ms, bool* timed_out, size_t max_reply_bytes = kDefaultMaxValueBytes);

  const std::string& error() const { return error_; }
  bool auth_refused() const { return auth_refused_; }
  const std::string& host() const { return host_; }
  int port() const { return port_; }
  std::string address() const;

 private:
  bool broke(std::string why);

  std::string host_;
  int port_;
  std::string user_, password_;
  int timeout_ms_;
  redisContext* ctx_ = nullptr;
  RespGuard guard_;  // on the reader (guard_resp_reader)
  std::string error_;
  bool auth_refused_ = false;
};

}  // namespace depcache

#include "kv/redis_connection.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <poll.h>

#include <cerrno>
#include <chrono>

namespace depcache {
namespace {

// Waits until fd is ready for `events` or the deadline passes (false).
bool wait_fd(int fd, short events, int64_t deadline_ms) {
  for (;;) {
    const int64_t left = deadline_ms - steady_now_ms();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

// The protocol's own bytes around a reply's strings (lengths, CRLFs, one
// read's worth of the next reply) allowed beyond its bound.
constexpr size_t kRespSlack = 64 << 10;

// hiredis's own reply builders, which the guard forwards to; captured from
// a fresh reader because hiredis does not export them.
const redisReplyObjectFunctions& hiredis_builders() {
  static const redisReplyObjectFunctions fns = [] {
    redisReader* r = redisReaderCreate();
    const redisReplyObjectFunctions f = *r->fn;
    redisReaderFree(r);
    return f;
  }();
  return fns;
}

void* create_limited_array(const redisReadTask* task, int elements) {
  // hiredis itself refuses counts below -1 (the null array) and past INT_MAX.
  if (elements < 0 || elements > kMaxRespArrayElements) {
    if (task->privdata) static_cast<RespGuard*>(task->privdata)->refused_array = elements;
    return nullptr;  // the reader stops with an error
  }
  return hiredis_builders().createArray(task, elements);
}

// Strings, status lines and errors alike.
void* create_limited_string(const redisReadTask* task, char* str, size_t len) {
  if (auto* g = static_cast<RespGuard*>(task->privdata)) {
    g->bytes += len;
    if (g->bytes > g->max_bytes) {
      g->refused_bytes = true;
      return nullptr;
    }
  }
  return hiredis_builders().createString(task, str, len);
}

redisReplyObjectFunctions limited_builders() {
  redisReplyObjectFunctions f = hiredis_builders();
  f.createArray = create_limited_array;
  f.createString = create_limited_string;
  return f;
}

}  // namespace

void guard_resp_reader(redisReader* reader, RespGuard* guard) {
  static redisReplyObjectFunctions fns = limited_builders();
  reader->fn = &fns;
  reader->privdata = guard;
  *guard = RespGuard{guard->max_bytes};
}

void RedisReplyDeleter::operator()(redisReply* r) const { freeReplyObject(r); }

RedisConnection::RedisConnection(std::string host, int port, const RedisOptions& o)
    : host_(std::move(host)), port_(port), user_(o.user), password_(o.password), timeout_ms_(o.timeout_ms) {}

RedisConnection::~RedisConnection() { close(); }

std::string RedisConnection::address() const { return fmt::format("{}:{}", host_, port_); }

void RedisConnection::close() {
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
}

bool RedisConnection::broke(std::string why) {
  error_ = std::move(why);
  close();
  return false;
}

bool RedisConnection::open(int64_t deadline_ms) {
  if (ctx_) return true;
  auth_refused_ = false;
  const int64_t left = std::max<int64_t>(1, deadline_ms - steady_now_ms());
  const timeval tv{static_cast<time_t>(left / 1000), static_cast<suseconds_t>((left % 1000) * 1000)};
  redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, tv);
  if (!c || c->err) {
    const std::string why = c ? c->errstr : "out of memory";
    if (c) redisFree(c);
    return broke(fmt::format("cannot connect to Redis at {}: {}", address(), why));
  }
  // Non-blocking from here: exchange() bounds a whole exchange by poll()ing
  // against its deadline, which a per-call socket timeout cannot.
  const int flags = ::fcntl(c->fd, F_GETFL);
  if (flags < 0 || ::fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    redisFree(c);
    return broke(fmt::format("cannot set up the connection to Redis at {}", address()));
  }
  c->flags &= ~REDIS_BLOCK;
  guard_resp_reader(c->reader, &guard_);
  ctx_ = c;
  if (!password_.empty()) {
    const RedisReply r = user_.empty() ? command({"AUTH", password_}, deadline_ms)
                                       : command({"AUTH", user_, password_}, deadline_ms);
    if (!r) return false;
    if (r->type == REDIS_REPLY_ERROR) {
      auth_refused_ = true;
      return broke(fmt::format("Redis at {} refused AUTH{}: {}", address(),
                               user_.empty() ? "" : fmt::format(" as user '{}'", user_),
                               std::string_view(r->str, r->len)));
    }
  }
  return true;
}

bool RedisConnection::send(std::span<const RedisCommand> commands, int64_t deadline_ms) {
  if (!ctx_) {
    error_ = fmt::format("no connection to Redis at {}", address());
    return false;
  }
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const RedisCommand& c : commands) {
    argv.clear();
    lens.clear();
    for (const std::string_view a : c) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK)
      return broke(ctx_->errstr);
  }
  for (int done = 0; !done;) {
    if (redisBufferWrite(ctx_, &done) != REDIS_OK) return broke(ctx_->errstr);
    if (!done && !wait_fd(ctx_->fd, POLLOUT, deadline_ms))
      return broke(fmt::format("no room to send within {} ms", timeout_ms_));
  }
  return true;
}

std::vector<RedisReply> RedisConnection::replies(size_t n, int64_t deadline_ms, size_t max_reply_bytes) {
  std::vector<RedisReply> out;
  out.reserve(n);
  while (out.size() < n) {
    bool timed_out = false;
    RedisReply r = receive(deadline_ms, &timed_out, max_reply_bytes);
    if (timed_out) broke(fmt::format("no whole reply within {} ms", timeout_ms_));
    if (!r) return {};
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<RedisReply> RedisConnection::exchange(std::span<const RedisCommand> commands, int64_t deadline_ms,
                                                  size_t max_reply_bytes) {
  if (!send(commands, deadline_ms)) return {};
  return replies(commands.size(), deadline_ms, max_reply_bytes);
}

RedisReply RedisConnection::receive(int64_t deadline_ms, bool* timed_out, size_t max_reply_bytes) {
  *timed_out = false;
  if (!ctx_) {
    error_ = fmt::format("no connection to Redis at {}", address());
    return {};
  }
  guard_.max_bytes = max_reply_bytes;
  const auto too_big = [&] {
    broke(fmt::format("Redis at {} sent a reply of more than {} bytes (the most this read expects)",
                      address(), max_reply_bytes));
    return RedisReply();
  };
  for (;;) {
    void* reply = nullptr;
    if (redisGetReplyFromReader(ctx_, &reply) != REDIS_OK) {
      if (guard_.refused_array != 0)
        broke(fmt::format("Redis at {} announced an array of {} elements (a reply's arrays may have 0 to {})",
                          address(), guard_.refused_array, kMaxRespArrayElements));
      else if (guard_.refused_bytes)
        return too_big();
      else
        broke(ctx_->errstr);
      return {};
    }
    if (reply) {
      guard_.next_reply();
      return RedisReply(static_cast<redisReply*>(reply));
    }
    // What is buffered and not yet made into strings counts too: a value is
    // refused while it arrives, not once it is whole.
    const redisReader* rd = ctx_->reader;
    if (guard_.bytes + (rd->len - rd->pos) > max_reply_bytes + kRespSlack) return too_big();
    if (!wait_fd(ctx_->fd, POLLIN, deadline_ms)) {
      *timed_out = true;
      return {};
    }
    if (redisBufferRead(ctx_) != REDIS_OK) {
      broke(ctx_->errstr);
      return {};
    }
  }
}

RedisReply RedisConnection::command(const RedisCommand& command, int64_t deadline_ms,
                                    size_t max_reply_bytes) {
  std::vector<RedisReply> r = exchange(std::span(&command, 1), deadline_ms, max_reply_bytes);
  return r.empty() ? RedisReply() : std::move(r.front());
}

}  // namespace depcache

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
    if (task->privdata) *static_cast<int64_t*>(task->privdata) = elements;
    return nullptr;  // the reader stops with an error
  }
  return hiredis_builders().createArray(task, elements);
}

redisReplyObjectFunctions limited_builders() {
  redisReplyObjectFunctions f = hiredis_builders();
  f.createArray = create_limited_array;
  return f;
}

}  // namespace

void limit_resp_arrays(redisReader* reader, int64_t* refused) {
  static redisReplyObjectFunctions fns = limited_builders();
  reader->fn = &fns;
  reader->privdata = refused;
  *refused = 0;
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
  limit_resp_arrays(c->reader, &refused_array_);
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

std::vector<RedisReply> RedisConnection::replies(size_t n, int64_t deadline_ms) {
  std::vector<RedisReply> out;
  out.reserve(n);
  while (out.size() < n) {
    bool timed_out = false;
    RedisReply r = receive(deadline_ms, &timed_out);
    if (timed_out) broke(fmt::format("no whole reply within {} ms", timeout_ms_));
    if (!r) return {};
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<RedisReply> RedisConnection::exchange(std::span<const RedisCommand> commands,
                                                  int64_t deadline_ms) {
  if (!send(commands, deadline_ms)) return {};
  return replies(commands.size(), deadline_ms);
}

RedisReply RedisConnection::receive(int64_t deadline_ms, bool* timed_out) {
  *timed_out = false;
  if (!ctx_) {
    error_ = fmt::format("no connection to Redis at {}", address());
    return {};
  }
  for (;;) {
    void* reply = nullptr;
    if (redisGetReplyFromReader(ctx_, &reply) != REDIS_OK) {
      if (refused_array_ != 0)
        broke(fmt::format("Redis at {} announced an array of {} elements (a reply's arrays may have 0 to {})",
                          address(), refused_array_, kMaxRespArrayElements));
      else
        broke(ctx_->errstr);
      return {};
    }
    if (reply) return RedisReply(static_cast<redisReply*>(reply));
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

RedisReply RedisConnection::command(const RedisCommand& command, int64_t deadline_ms) {
  std::vector<RedisReply> r = exchange(std::span(&command, 1), deadline_ms);
  return r.empty() ? RedisReply() : std::move(r.front());
}

}  // namespace depcache

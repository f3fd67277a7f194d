#include <fcntl.h>
#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <poll.h>

#include <chrono>
#include <cstdio>

#include "kv/remote_store.h"
#include "util/error.h"

namespace depcache {
namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

timeval to_timeval(int ms) { return {ms / 1000, static_cast<suseconds_t>((ms % 1000) * 1000)}; }

// Waits until fd is ready for `events` or the deadline passes (false).
bool wait_fd(int fd, short events, int64_t deadline_ms) {
  for (;;) {
    const int64_t left = deadline_ms - now_ms();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

void RedisStore::ReplyDeleter::operator()(void* r) const { freeReplyObject(r); }

RedisOptions parse_redis_address(const std::string& address) {
  RedisOptions o;
  const size_t colon = address.rfind(':');
  std::string port = address;
  if (colon != std::string::npos) {
    if (colon > 0) o.host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p <= 0 || p > 65535)
    fail(ErrorKind::InvalidInput, "bad Redis address '{}' (expected host:port or port)", address);
  o.port = static_cast<int>(p);
  return o;
}

RedisStore::RedisStore(RedisOptions options) : o_(std::move(options)) {
  std::lock_guard lk(mu_);
  if (!ready()) {
    if (auth_refused_)
      fail(ErrorKind::InvalidInput, "{} (check --redis-password-file and --redis-user)", last_error_);
    started_ = true;
    return;  // unreachable: warned, retried later
  }
  // A server that wants credentials we lack, or refuses ours, will refuse
  // every command: that is a configuration error, said once, now.
  const Reply r = command({"PING"}, "PING");
  if (r && r->type == REDIS_REPLY_ERROR) {
    const std::string why(r->str, r->len);
    // A constructor that throws runs no destructor: the connection is freed here.
    redisFree(ctx_);
    ctx_ = nullptr;
    fail(ErrorKind::InvalidInput, "Redis at {}:{} refuses commands: {}{}", o_.host, o_.port, why,
         o_.password.empty() ? " (give its password with --redis-password-file)" : "");
  }
  started_ = true;
}

RedisStore::~RedisStore() {
  if (ctx_) redisFree(ctx_);
}

std::string RedisStore::key_of(uint64_t key) const { return fmt::format("{}{:016x}", o_.prefix, key); }

bool RedisStore::ready() {
  if (ctx_) return true;
  if (now_ms() < retry_at_ms_) return false;
  redisContext* c = redisConnectWithTimeout(o_.host.c_str(), o_.port, to_timeval(o_.timeout_ms));
  if (!c || c->err) {
    const std::string why = c ? c->errstr : "out of memory";
    if (c) redisFree(c);
    failed(fmt::format("cannot connect to Redis at {}:{}: {}", o_.host, o_.port, why));
    return false;
  }
  // Non-blocking from here: command() bounds a whole command by poll()ing
  // against its deadline, which a per-call socket timeout cannot.
  const int flags = ::fcntl(c->fd, F_GETFL);
  if (flags < 0 || ::fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    redisFree(c);
    failed(fmt::format("cannot set up the connection to Redis at {}:{}", o_.host, o_.port));
    return false;
  }
  c->flags &= ~REDIS_BLOCK;
  ctx_ = c;
  if (!o_.password.empty()) {
    const Reply r = o_.user.empty() ? command({"AUTH", o_.password}, "AUTH")
                                    : command({"AUTH", o_.user, o_.password}, "AUTH");
    if (!r) return false;
    if (r->type == REDIS_REPLY_ERROR) {
      const std::string why(r->str, r->len);
      auth_refused_ = true;
      failed(fmt::format("Redis at {}:{} refused AUTH{}: {}", o_.host, o_.port,
                         o_.user.empty() ? "" : fmt::format(" as user '{}'", o_.user), why));
      return false;
    }
  }
  if (warned_) fmt::print(stderr, "warning: Redis at {}:{} is reachable again\n", o_.host, o_.port);
  warned_ = false;
  return true;
}

void RedisStore::failed(const std::string& what) {
  ++n_failures_;
  last_error_ = what;
  if (ctx_) {
    redisFree(ctx_);  // a context that saw an error cannot be reused
    ctx_ = nullptr;
  }
  retry_at_ms_ = now_ms() + o_.retry_after_ms;
  if (!warned_ && !(auth_refused_ && !started_))  // refused at startup: the constructor says why
    fmt::print(stderr, "warning: {}; the remote KV tier is skipped (requests are computed locally)\n", what);
  warned_ = true;
}

RedisStore::Reply RedisStore::command(std::span<const std::string_view> args, const char* what) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  const int64_t deadline = now_ms() + o_.timeout_ms;
  const auto broke = [&](const std::string& why) {
    failed(fmt::format("Redis {} failed: {}", what, why));
    return Reply();
  };
  if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK)
    return broke(ctx_->errstr);
  for (int done = 0; !done;) {
    if (redisBufferWrite(ctx_, &done) != REDIS_OK) return broke(ctx_->errstr);
    if (!done && !wait_fd(ctx_->fd, POLLOUT, deadline))
      return broke(fmt::format("no room to send within {} ms", o_.timeout_ms));
  }
  for (;;) {
    void* reply = nullptr;
    if (redisGetReplyFromReader(ctx_, &reply) != REDIS_OK) return broke(ctx_->errstr);
    if (reply) return Reply(static_cast<redisReply*>(reply));
    if (!wait_fd(ctx_->fd, POLLIN, deadline))
      return broke(fmt::format("no whole reply within {} ms", o_.timeout_ms));
    if (redisBufferRead(ctx_) != REDIS_OK) return broke(ctx_->errstr);
  }
}

std::optional<std::vector<uint8_t>> RedisStore::get(uint64_t key) {
  std::lock_guard lk(mu_);
  if (!ready()) return std::nullopt;
  const std::string k = key_of(key);
  const Reply r = command({"GET", k}, "GET");
  if (!r) return std::nullopt;
  if (r->type == REDIS_REPLY_STRING)
    return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(r->str),
                                reinterpret_cast<const uint8_t*>(r->str) + r->len);
  if (r->type == REDIS_REPLY_ERROR) failed(fmt::format("Redis GET: {}", r->str));
  return std::nullopt;
}

std::vector<std::optional<std::vector<uint8_t>>> RedisStore::get_many(std::span<const uint64_t> keys) {
  std::vector<std::optional<std::vector<uint8_t>>> out(keys.size());
  if (keys.empty()) return out;
  std::lock_guard lk(mu_);
  if (!ready()) return out;
  std::vector<std::string> names;
  for (uint64_t key : keys) names.push_back(key_of(key));
  std::vector<std::string_view> args{"MGET"};
  for (const std::string& n : names) args.push_back(n);
  const Reply r = command(args, "MGET");
  if (!r) return out;
  if (r->type == REDIS_REPLY_ERROR) {
    failed(fmt::format("Redis MGET: {}", r->str));
    return out;
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements != keys.size()) {
    failed("Redis MGET: a reply that is not one value per key");
    return out;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const redisReply* e = r->element[i];
    if (e && e->type == REDIS_REPLY_STRING)
      out[i] = std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(e->str),
                                    reinterpret_cast<const uint8_t*>(e->str) + e->len);
  }
  return out;
}

void RedisStore::put(uint64_t key, std::span<const uint8_t> record) {
  std::lock_guard lk(mu_);
  if (!ready()) return;
  const std::string k = key_of(key);
  const std::string_view value(reinterpret_cast<const char*>(record.data()), record.size());
  const std::string ttl = std::to_string(o_.ttl_seconds);
  // NX: a block another process published first is the same KV; keep it.
  const Reply r = o_.ttl_seconds > 0 ? command({"SET", k, value, "NX", "EX", ttl}, "SET")
                                     : command({"SET", k, value, "NX"}, "SET");
  if (!r) return;
  // An error reply (e.g. OOM under maxmemory-policy noeviction) loses only this block.
  if (r->type == REDIS_REPLY_ERROR) {
    ++n_failures_;
    last_error_ = r->str;
  }
}

void RedisStore::remove(uint64_t key) {
  std::lock_guard lk(mu_);
  if (!ready()) return;
  const std::string k = key_of(key);
  command({"DEL", k}, "DEL");
}

}  // namespace depcache

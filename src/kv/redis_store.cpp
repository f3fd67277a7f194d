#include <fmt/format.h>
#include <hiredis/hiredis.h>

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

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace

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

RedisStore::RedisStore(RedisOptions options) : o_(std::move(options)) { ready(); }

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
  redisSetTimeout(c, to_timeval(o_.timeout_ms));
  ctx_ = c;
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
  if (!warned_)
    fmt::print(stderr, "warning: {}; the remote KV tier is skipped (requests are computed locally)\n", what);
  warned_ = true;
}

std::optional<std::vector<uint8_t>> RedisStore::get(uint64_t key) {
  if (!ready()) return std::nullopt;
  const std::string k = key_of(key);
  Reply r(static_cast<redisReply*>(redisCommand(ctx_, "GET %b", k.data(), k.size())));
  if (!r) {
    failed(fmt::format("Redis GET failed: {}", ctx_->errstr));
    return std::nullopt;
  }
  if (r->type == REDIS_REPLY_STRING)
    return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(r->str),
                                reinterpret_cast<const uint8_t*>(r->str) + r->len);
  if (r->type == REDIS_REPLY_ERROR) failed(fmt::format("Redis GET: {}", r->str));
  return std::nullopt;
}

void RedisStore::put(uint64_t key, std::span<const uint8_t> record) {
  if (!ready()) return;
  const std::string k = key_of(key);
  // NX: a block another process published first is the same KV; keep it.
  Reply r(static_cast<redisReply*>(
      o_.ttl_seconds > 0
          ? redisCommand(ctx_, "SET %b %b NX EX %lld", k.data(), k.size(), record.data(), record.size(),
                         static_cast<long long>(o_.ttl_seconds))
          : redisCommand(ctx_, "SET %b %b NX", k.data(), k.size(), record.data(), record.size())));
  if (!r) {
    failed(fmt::format("Redis SET failed: {}", ctx_->errstr));
    return;
  }
  // An error reply (e.g. OOM under maxmemory-policy noeviction) loses only this block.
  if (r->type == REDIS_REPLY_ERROR) {
    ++n_failures_;
    last_error_ = r->str;
  }
}

void RedisStore::remove(uint64_t key) {
  if (!ready()) return;
  const std::string k = key_of(key);
  Reply r(static_cast<redisReply*>(redisCommand(ctx_, "DEL %b", k.data(), k.size())));
  if (!r) failed(fmt::format("Redis DEL failed: {}", ctx_->errstr));
}

}  // namespace depcache

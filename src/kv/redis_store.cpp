#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <cstdio>

#include "kv/redis_connection.h"
#include "kv/remote_store.h"
#include "util/error.h"

namespace depcache {

std::string redis_key(const std::string& prefix, uint64_t key) {
  return fmt::format("{}{:016x}", prefix, key);
}

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
  const RedisReply r = command({"PING"}, "PING");
  if (r && r->type == REDIS_REPLY_ERROR) {
    const std::string why(r->str, r->len);
    fail(ErrorKind::InvalidInput, "Redis at {}:{} refuses commands: {}{}", o_.host, o_.port, why,
         o_.password.empty() ? " (give its password with --redis-password-file)" : "");
  }
  started_ = true;
}

RedisStore::~RedisStore() = default;

bool RedisStore::connected() {
  std::lock_guard lk(mu_);
  return conn_ && conn_->is_open();
}

bool RedisStore::ready() {
  if (!conn_) conn_ = std::make_unique<RedisConnection>(o_.host, o_.port, o_);
  if (conn_->is_open()) return true;
  if (steady_now_ms() < retry_at_ms_) return false;
  if (!conn_->open(steady_now_ms() + o_.timeout_ms)) {
    auth_refused_ = conn_->auth_refused();
    failed(conn_->error());
    return false;
  }
  if (warned_) fmt::print(stderr, "warning: Redis at {}:{} is reachable again\n", o_.host, o_.port);
  warned_ = false;
  return true;
}

void RedisStore::failed(const std::string& what) {
  ++n_failures_;
  last_error_ = what;
  if (conn_) conn_->close();  // a context that saw an error cannot be reused
  retry_at_ms_ = steady_now_ms() + o_.retry_after_ms;
  if (!warned_ && !(auth_refused_ && !started_))  // refused at startup: the constructor says why
    fmt::print(stderr, "warning: {}; the remote KV tier is skipped (requests are computed locally)\n", what);
  warned_ = true;
}

RedisReply RedisStore::command(std::vector<std::string_view> args, const char* what, size_t max_reply_bytes) {
  RedisReply r = conn_->command(args, steady_now_ms() + o_.timeout_ms, max_reply_bytes);
  if (!r) failed(fmt::format("Redis {} failed: {}", what, conn_->error()));
  return r;
}

std::optional<std::vector<uint8_t>> RedisStore::get(uint64_t key) {
  std::lock_guard lk(mu_);
  if (!ready()) return std::nullopt;
  const std::string k = redis_key(o_.prefix, key);
  const RedisReply r = command({"GET", k}, "GET");
  if (!r) return std::nullopt;
  if (r->type == REDIS_REPLY_STRING)
    return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(r->str),
                                reinterpret_cast<const uint8_t*>(r->str) + r->len);
  if (r->type == REDIS_REPLY_ERROR) failed(fmt::format("Redis GET: {}", r->str));
  return std::nullopt;
}

std::vector<std::optional<std::vector<uint8_t>>> RedisStore::get_many(std::span<const uint64_t> keys,
                                                                      size_t max_value_bytes) {
  std::vector<std::optional<std::vector<uint8_t>>> out(keys.size());
  if (keys.empty()) return out;
  std::lock_guard lk(mu_);
  if (!ready()) return out;
  std::vector<std::string> names;
  for (uint64_t key : keys) names.push_back(redis_key(o_.prefix, key));
  std::vector<std::string_view> args{"MGET"};
  for (const std::string& n : names) args.push_back(n);
  const RedisReply r = command(args, "MGET", keys.size() * max_value_bytes);
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
  const std::string k = redis_key(o_.prefix, key);
  const std::string_view value(reinterpret_cast<const char*>(record.data()), record.size());
  const std::string ttl = std::to_string(o_.ttl_seconds);
  // NX: a block another process published first is the same KV; keep it.
  const RedisReply r = o_.ttl_seconds > 0 ? command({"SET", k, value, "NX", "EX", ttl}, "SET")
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
  const std::string k = redis_key(o_.prefix, key);
  command({"DEL", k}, "DEL");
}

}  // namespace depcache

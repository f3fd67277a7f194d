#pragma once
// The remote tier: a key-value store shared by several depcache processes,
// holding span records (kv/span_record.h) under their content keys. A
// remote store never fails a request: when it cannot answer, a get is a
// miss and a put is dropped, and the store reports the trouble once.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

struct redisContext;  // hiredis

namespace depcache {

class RemoteStore {
 public:
  virtual ~RemoteStore() = default;
  virtual std::optional<std::vector<uint8_t>> get(uint64_t key) = 0;
  virtual void put(uint64_t key, std::span<const uint8_t> record) = 0;
  virtual void remove(uint64_t key) = 0;
};

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string prefix = "depcache:";  // key prefix, so one Redis can serve other uses too
  int timeout_ms = 200;              // connect and per-command
  int retry_after_ms = 2000;         // after a failure, calls are misses until then
  int64_t ttl_seconds = 0;           // 0: no expiry (Redis's maxmemory policy bounds the tier)
};

// Redis through hiredis. Not thread-safe (the index serializes its calls).
class RedisStore final : public RemoteStore {
 public:
  explicit RedisStore(RedisOptions options);
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  std::optional<std::vector<uint8_t>> get(uint64_t key) override;
  void put(uint64_t key, std::span<const uint8_t> record) override;
  void remove(uint64_t key) override;

  bool connected() const { return ctx_ != nullptr; }
  int64_t n_failures() const { return n_failures_; }  // commands lost to errors or timeouts
  const std::string& last_error() const { return last_error_; }

 private:
  bool ready();  // connects if needed and allowed
  void failed(const std::string& what);
  std::string key_of(uint64_t key) const;

  RedisOptions o_;
  ::redisContext* ctx_ = nullptr;
  int64_t n_failures_ = 0;
  std::string last_error_;
  int64_t retry_at_ms_ = 0;
  bool warned_ = false;  // one warning per outage
};

// "host:port" (host optional) into options; throws InvalidInput when malformed.
RedisOptions parse_redis_address(const std::string& address);

}  // namespace depcache

#pragma once
// The remote tier: a key-value store shared by several depcache processes,
// holding span records (kv/span_record.h) under their content keys. A
// remote store never fails a request: when it cannot answer, a get is a
// miss and a put is dropped, and the store reports the trouble once. Its
// calls may come from several threads (the index reads it without holding
// its own lock, and publishes from a thread of its own).
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct redisReply;  // hiredis

namespace depcache {

struct RedisReplyDeleter {
  void operator()(redisReply* r) const;
};
using RedisReply = std::unique_ptr<redisReply, RedisReplyDeleter>;

// The most bytes a value read back may hold unless the caller knows better
// (a record of the running model's shape, RemoteBlocks): a reply past its
// bound is refused as it arrives, before it is held whole (a hostile or
// confused server could otherwise send gigabytes for a key).
inline constexpr size_t kDefaultMaxValueBytes = size_t{64} << 20;

class RemoteStore {
 public:
  virtual ~RemoteStore() = default;
  virtual std::optional<std::vector<uint8_t>> get(uint64_t key) = 0;
  // Several keys in one exchange where the store can (one deadline for all);
  // one result per key, in order; a value may hold at most max_value_bytes.
  virtual std::vector<std::optional<std::vector<uint8_t>>> get_many(std::span<const uint64_t> keys,
                                                                    size_t max_value_bytes) {
    (void)max_value_bytes;
    std::vector<std::optional<std::vector<uint8_t>>> out;
    for (uint64_t k : keys) out.push_back(get(k));
    return out;
  }
  std::vector<std::optional<std::vector<uint8_t>>> get_many(std::span<const uint64_t> keys) {
    return get_many(keys, kDefaultMaxValueBytes);
  }
  virtual void put(uint64_t key, std::span<const uint8_t> record) = 0;
  virtual void remove(uint64_t key) = 0;
};

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string prefix = "depcache:";  // key prefix, so one Redis can serve other uses too
  // Deadline of a whole command (send and reply; also of a connect), not of
  // each system call: a server that answers slowly, byte by byte, still
  // costs at most this much.
  int timeout_ms = 200;
  int retry_after_ms = 2000;  // after a failure, calls are misses until then
  int64_t ttl_seconds = 0;    // 0: no expiry (Redis's maxmemory policy bounds the tier)
  // AUTH after every connect when a password is set (with `user`, Redis 6
  // ACLs, when that is set too).
  std::string user, password;
};

class RedisConnection;

// Redis through hiredis; thread-safe (one command at a time). Construction
// connects: a server that refuses the password, or wants one that was not
// given, is an InvalidInput error then (a configuration mistake); one that
// cannot be reached is a warning, and the tier a miss until it can.
class RedisStore final : public RemoteStore {
 public:
  explicit RedisStore(RedisOptions options);
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  std::optional<std::vector<uint8_t>> get(uint64_t key) override;
  // MGET: the whole fetch within one --remote-timeout-ms.
  using RemoteStore::get_many;
  std::vector<std::optional<std::vector<uint8_t>>> get_many(std::span<const uint64_t> keys,
                                                            size_t max_value_bytes) override;
  void put(uint64_t key, std::span<const uint8_t> record) override;
  void remove(uint64_t key) override;

  bool connected();
  int64_t n_failures() {  // commands lost to errors or timeouts
    std::lock_guard lk(mu_);
    return n_failures_;
  }
  std::string last_error() {
    std::lock_guard lk(mu_);
    return last_error_;
  }

 private:
  bool ready();  // connects if needed and allowed; mu_ held
  void failed(const std::string& what);
  // One command and its reply within the deadline; null (after failed())
  // when the connection broke or the deadline passed.
  RedisReply command(std::vector<std::string_view> args, const char* what,
                     size_t max_reply_bytes = kDefaultMaxValueBytes);

  RedisOptions o_;
  std::mutex mu_;
  std::unique_ptr<RedisConnection> conn_;
  int64_t n_failures_ = 0;
  std::string last_error_;
  int64_t retry_at_ms_ = 0;
  bool warned_ = false;        // one warning per outage
  bool auth_refused_ = false;  // the last connect's AUTH was refused
  bool started_ = false;       // the constructor is done
};

// The key a span record is filed under: the prefix, then its stored name
// (kv/span_record.h) in hex.
std::string redis_key(const std::string& prefix, uint64_t key);

// "host:port" (host optional) into options; throws InvalidInput when malformed.
RedisOptions parse_redis_address(const std::string& address);

}  // namespace depcache

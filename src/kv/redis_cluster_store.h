#pragma once
// The remote tier over a Redis Cluster: keys are spread over the masters by
// hash slot (CRC16 of the key, or of its {hash tag}, mod 16384), so the tier
// holds the sum of the masters' memory and loses only a node's share of it,
// for as long as its failover takes, when one goes down. Debian's hiredis has
// no cluster client; this is the cluster protocol's client side on top of
// it: the slot map read with CLUSTER SLOTS, MOVED (the map changed: follow
// and refresh) and ASK (a slot in migration: ASKING, once) redirects, and a
// refresh of the map while any node fails, which is how a failover (a
// replica promoted) is found. A fetch of many keys sends each node its GETs
// as one pipeline, every node within the one deadline.
//
// Like RedisStore it never fails a request: a node that cannot answer makes
// its keys misses (and drops their puts) until it, or its replacement, can.
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kv/remote_store.h"

namespace depcache {

class RedisConnection;
using RedisCommand = std::vector<std::string_view>;

struct RedisAddress {
  std::string host;
  int port = 0;
  bool operator==(const RedisAddress&) const = default;
};
// "host:port[,host:port...]" into addresses; throws InvalidInput when any is malformed.
std::vector<RedisAddress> parse_redis_addresses(const std::string& list);

inline constexpr int kRedisClusterSlots = 16384;
// The slot a key belongs to, as the cluster specification defines it.
int redis_cluster_slot(std::string_view key);

// Which master serves each slot, as a CLUSTER SLOTS reply gives it.
struct RedisSlotRange {
  int first = 0, last = 0;  // inclusive
  RedisAddress master;
};
// Parses a CLUSTER SLOTS reply; `asked` is the node asked, whose address an
// empty host in the reply stands for. Nullopt (with *why) when the reply is
// not a well-formed map (ranges out of bounds or overlapping, a bad port).
std::optional<std::vector<RedisSlotRange>> parse_cluster_slots(const redisReply& reply,
                                                               const RedisAddress& asked, std::string* why);

class RedisClusterStore final : public RemoteStore {
 public:
  // `seeds`: nodes to ask for the slot map (any of the cluster's nodes; the
  // rest are learnt from the map). `o`: prefix, deadline, retry interval, TTL
  // and credentials (its host and port are unused). Construction reads the
  // map: a cluster that refuses the credentials is an InvalidInput error;
  // one that cannot be reached is a warning, and the tier a miss until it can.
  RedisClusterStore(std::vector<RedisAddress> seeds, RedisOptions o);
  ~RedisClusterStore() override;
  RedisClusterStore(const RedisClusterStore&) = delete;
  RedisClusterStore& operator=(const RedisClusterStore&) = delete;

  std::optional<std::vector<uint8_t>> get(uint64_t key) override;
  // One pipeline of GETs per node, all nodes within one --remote-timeout-ms.
  using RemoteStore::get_many;
  std::vector<std::optional<std::vector<uint8_t>>> get_many(std::span<const uint64_t> keys,
                                                            size_t max_value_bytes) override;
  void put(uint64_t key, std::span<const uint8_t> record) override;
  void remove(uint64_t key) override;

  struct Stats {
    int64_t failures = 0;   // exchanges lost to errors or timeouts
    int64_t moved = 0;      // MOVED redirects followed
    int64_t asked = 0;      // ASK redirects followed
    int64_t refreshes = 0;  // slot maps read
    int64_t unserved = 0;   // keys skipped: their slot had no reachable master
  };
  Stats stats();
  std::string last_error();
  // The master serving `key` in the current map, if any.
  std::optional<RedisAddress> owner(uint64_t key);
  // Reads the slot map now (false when no node gave one).
  bool refresh();

 private:
  struct Node;
  struct Op;
  // Runs one command per key at the key's master, following redirects;
  // returns the final reply per key (null where none came).
  // Each reply holds at most max_reply_bytes.
  std::vector<RedisReply> run(std::span<const uint64_t> keys, const std::vector<RedisCommand>& commands,
                              const char* what, size_t max_reply_bytes = kDefaultMaxValueBytes);
  // run()'s steps: the keys' first destinations; one round's pipelines sent
  // (none in the last round: its keys go unserved); one pipeline's replies
  // read into `out`, its redirected keys into `next`.
  struct Batch;
  std::vector<Op> ops_by_owner(const std::vector<RedisCommand>& commands, size_t n_keys);
  std::vector<Batch> send_round(const std::vector<Op>& pending, const std::vector<RedisCommand>& commands,
                                const char* what, bool last_round, int64_t deadline);
  void read_batch(const Batch& batch, const char* what, int64_t deadline, size_t max_reply_bytes,
                  std::vector<RedisReply>& out, std::vector<Op>& next);
  // Follows a MOVED or ASK error (queueing the key in `next`); false for any other error.
  bool follow_redirect(std::string_view error, const Node& n, size_t key, std::vector<Op>& next);
  void pipeline_failed(Node& n, const char* what, size_t n_keys);
  int16_t node_id(const RedisAddress& a);  // finds or adds
  bool reachable(Node& n, int64_t deadline);
  void node_failed(Node& n, const std::string& why);
  bool refresh_locked(int64_t deadline);
  void refresh_if_due();

  std::vector<RedisAddress> seeds_;
  RedisOptions o_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Node>> nodes_;         // every node met; indexes stable
  std::array<int16_t, kRedisClusterSlots> owner_{};  // node index, -1: unknown
  bool stale_ = true;                                // the map must be read again
  int64_t refresh_at_ms_ = 0;
  Stats stats_;
  std::string last_error_;
  bool warned_ = false;  // one warning per outage
  bool started_ = false;
};

}  // namespace depcache

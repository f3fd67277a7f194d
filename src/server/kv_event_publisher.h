#pragma once
// Publishes a replica's KV events (kv/kv_events.h) on a Redis channel, as
// JSON batches (docs/replicas.md): what its index stored and removed since
// the last batch, with its load, every `interval` while there is news (events,
// or a change of load) and every `heartbeat` regardless (so a router sees it alive and how busy it
// is). On a Redis Cluster any node takes the PUBLISH and every node's
// subscribers get it. A Redis that is down loses batches, never requests:
// a router sees the gap in the numbers and reads the replica's summary.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kv/kv_events.h"
#include "kv/redis_cluster_store.h"

namespace depcache {

// A replica's load as its batches report it: requests running and waiting,
// and how many have ended so far. A request that starts and ends between two
// ticks leaves running and waiting as they were, yet is news: a router counts
// what it sent here until the next batch.
struct ReplicaLoad {
  int64_t running = 0, waiting = 0, ended = 0;
  bool operator==(const ReplicaLoad&) const = default;
};

struct KvEventPublisherOptions {
  std::vector<RedisAddress> nodes;  // one Redis, or nodes of a cluster (any takes the PUBLISH)
  RedisOptions redis;               // credentials and deadline
  std::string channel;
  KvEventHeader header;               // replica, epoch, block size (the load is filled in)
  std::shared_ptr<const MacKey> key;  // the deployment's (--cache-key-file): batches are sealed with it
  std::chrono::milliseconds interval{50}, heartbeat{1000};
};

class KvEventPublisher {
 public:
  // load(): the replica's running and waiting requests, from any thread.
  KvEventPublisher(std::shared_ptr<KvEventLog> log, KvEventPublisherOptions o,
                   std::function<ReplicaLoad()> load);
  ~KvEventPublisher();  // publishes what is left, then stops
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;
  int64_t published() const;  // batches sent
  int64_t lost() const;       // batches Redis did not take

 private:
  void run();
  bool send(const std::string& message);

  std::shared_ptr<KvEventLog> log_;
  KvEventPublisherOptions o_;
  std::function<ReplicaLoad()> load_;
  std::vector<std::unique_ptr<class RedisConnection>> conns_;
  size_t next_ = 0;  // the node to try first
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, warned_ = false;
  int64_t published_ = 0, lost_ = 0;
  std::thread thread_;
};

// A random epoch: tells a router that a replica of the same name restarted.
std::string new_epoch();

}  // namespace depcache

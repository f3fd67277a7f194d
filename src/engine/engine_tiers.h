#pragma once
// The index's lower tiers, set up as every front end that runs an engine
// asks for them (run, serve, chunks fuse): host memory, a disk directory
// kept across runs, a Redis server shared with other processes, and what
// keeps the shared ones honest: a deployment key that seals every record,
// Redis credentials, a deadline. EngineTiers also restores the strategies'
// state from the disk tier and persists both when asked.
#include <memory>
#include <string>

#include "engine/engine.h"
#include "kv/disk_store.h"
#include "kv/radix_index.h"
#include "kv/remote_store.h"

namespace depcache {

struct TierOptions {
  // Host tier budget (0: none; below 0: not set, a front end's default).
  double host_mib = 0, disk_mib = 4096;
  std::string cache_dir, redis;
  std::string redis_cluster;  // seeds of a Redis Cluster (host:port,...) instead of one Redis
  int64_t redis_block = 32;
  std::string cache_key_file;  // secret of >= 32 bytes; records are HMAC-SHA256 sealed with it
  std::string redis_password_file, redis_user;
  int remote_timeout_ms = 200;
  bool swap_out_once = false;
  std::string layer_preload = "off";  // auto, off or a number of layers
  bool remote() const { return !redis.empty() || !redis_cluster.empty(); }
  bool any() const { return host_mib > 0 || !cache_dir.empty() || remote(); }
};
// --layer-preload's value as the index takes it; throws InvalidInput.
RadixIndex::LayerPreload parse_layer_preload(const std::string& s);
// The Redis options of `o` (address unless a cluster, credentials, deadline); throws
// InvalidInput naming the file when the password file cannot be read.
RedisOptions redis_options(const TierOptions& o);

// The stores behind the tiers, attached to an engine's cache index (which
// must not use the disk store after this is gone; the remote store lives on
// with the index until what is queued for it was sent). Says on stderr,
// after `log_prefix`, what the disk tier adopted, and warns when a tier
// others may write to is used without a cache key.
class LowerTiers {
 public:
  LowerTiers(Engine& engine, const TierOptions& o, const std::string& log_prefix);
  ~LowerTiers();
  DiskSpanStore* disk() const { return disk_.get(); }

 private:
  std::unique_ptr<DiskSpanStore> disk_;
};

// An engine's lower tiers, with the strategies' state (Cache-Craft's
// variants) read back from the disk tier at the start.
class EngineTiers {
 public:
  EngineTiers(Engine& engine, const TierOptions& o, const std::string& log_prefix);
  DiskSpanStore* disk() const { return tiers_.disk(); }
  // With a disk tier: the index and the strategies' state written there, so
  // the next process starts from what this one computed. False without one.
  bool persist();

 private:
  Engine& engine_;
  LowerTiers tiers_;
  std::string cache_dir_;
};

}  // namespace depcache

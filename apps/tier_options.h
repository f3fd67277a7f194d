#pragma once
// The index's lower tiers as command-line options (run and serve share
// them): host memory, a disk directory kept across runs, a Redis server
// shared with other processes, and what keeps the shared ones honest: a
// deployment key that seals every record, Redis credentials, a deadline.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "kv/disk_store.h"
#include "kv/radix_index.h"
#include "kv/remote_store.h"

namespace depcache::cli {

struct TierOptions {
  double host_mib = 0, disk_mib = 4096;
  std::string cache_dir, redis;
  int64_t redis_block = 32;
  std::string cache_key_file;  // secret of >= 32 bytes; records are HMAC-SHA256 sealed with it
  std::string redis_password_file, redis_user;
  int remote_timeout_ms = 200;
  bool swap_out_once = false;
  std::string layer_preload = "off";  // auto, off or a number of layers
  bool any() const { return host_mib > 0 || !cache_dir.empty() || !redis.empty(); }
};
void add_tier_options(CLI::App& cmd, TierOptions& o);
// --layer-preload's value as the index takes it; throws InvalidInput.
RadixIndex::LayerPreload parse_layer_preload(const std::string& s);
// The Redis options of `o` (address, credentials, deadline); throws
// InvalidInput naming the file when the password file cannot be read.
RedisOptions redis_options(const TierOptions& o);

// The stores behind the tiers, attached to an index (which must not use the
// disk store after this is gone; the remote store lives on with the index
// until what is queued for it was sent). Says on stderr,
// after `log_prefix`, what the disk tier adopted, and warns when a tier
// others may write to is used without --cache-key-file.
class LowerTiers {
 public:
  LowerTiers(RadixIndex& index, const TierOptions& o, const std::string& log_prefix);
  ~LowerTiers();
  DiskSpanStore* disk() const { return disk_.get(); }

 private:
  std::unique_ptr<DiskSpanStore> disk_;
};

}  // namespace depcache::cli

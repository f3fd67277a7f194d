#pragma once
// The index's lower tiers as command-line options (run and serve share
// them): host memory, a disk directory kept across runs, a Redis server
// shared with other processes.
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
  bool swap_out_once = false;
  std::string layer_preload = "off";  // auto, off or a number of layers
  bool any() const { return host_mib > 0 || !cache_dir.empty() || !redis.empty(); }
};
void add_tier_options(CLI::App& cmd, TierOptions& o);
// --layer-preload's value as the index takes it; throws InvalidInput.
RadixIndex::LayerPreload parse_layer_preload(const std::string& s);

// The stores behind the tiers, attached to an index (which must not outlive
// them). Says on stderr, after `log_prefix`, what the disk tier adopted.
class LowerTiers {
 public:
  LowerTiers(RadixIndex& index, const TierOptions& o, const std::string& log_prefix);
  ~LowerTiers();
  DiskSpanStore* disk() const { return disk_.get(); }

 private:
  std::unique_ptr<DiskSpanStore> disk_;
  std::unique_ptr<RemoteStore> redis_;
};

}  // namespace depcache::cli

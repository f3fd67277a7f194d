#include "engine/engine_tiers.h"

#include <fmt/format.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "kv/redis_cluster_store.h"
#include "kv/remote_store.h"
#include "util/error.h"
#include "util/mac.h"

namespace depcache {

RedisOptions redis_options(const TierOptions& o) {
  if (!o.redis.empty() && !o.redis_cluster.empty())
    fail(ErrorKind::InvalidInput, "give either --redis or --redis-cluster, not both");
  RedisOptions r = o.redis.empty() ? RedisOptions() : parse_redis_address(o.redis);
  r.timeout_ms = o.remote_timeout_ms;
  r.user = o.redis_user;
  if (!o.redis_user.empty() && o.redis_password_file.empty())
    fail(ErrorKind::InvalidInput, "--redis-user needs --redis-password-file");
  if (!o.redis_password_file.empty()) {
    std::ifstream in(o.redis_password_file, std::ios::binary);
    if (!in.is_open() || std::filesystem::is_directory(o.redis_password_file))
      fail(ErrorKind::InvalidInput, "Redis password file {} cannot be read", o.redis_password_file);
    std::string password((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!password.empty() && (password.back() == '\n' || password.back() == '\r')) password.pop_back();
    if (password.empty())
      fail(ErrorKind::InvalidInput, "Redis password file {} is empty", o.redis_password_file);
    r.password = std::move(password);
  }
  return r;
}

RadixIndex::LayerPreload parse_layer_preload(const std::string& s) {
  using Mode = RadixIndex::LayerPreload::Mode;
  if (s == "auto") return {Mode::Auto, 0};
  if (s == "off") return {Mode::Off, 0};
  int depth = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), depth);
  if (ec != std::errc() || end != s.data() + s.size() || depth < 0 || depth > 100000)
    fail(ErrorKind::InvalidInput, "--layer-preload takes auto, off or a number of layers, not '{}'", s);
  return {Mode::Fixed, depth};
}

LowerTiers::LowerTiers(Engine& engine, const TierOptions& o, const std::string& log_prefix) {
  RadixIndex& index = engine.index_;
  std::shared_ptr<const MacKey> key;
  if (!o.cache_key_file.empty()) key = std::make_shared<const MacKey>(MacKey::from_file(o.cache_key_file));
  // Options and credentials are checked before anything is attached.
  const std::optional<RedisOptions> redis = o.remote() ? std::optional(redis_options(o)) : std::nullopt;
  if (!key && (!o.cache_dir.empty() || redis)) {
    const std::string where = !o.cache_dir.empty() && redis ? fmt::format("{} or that Redis", o.cache_dir)
                              : redis                       ? std::string("that Redis")
                                                            : o.cache_dir;
    fmt::print(
        stderr,
        "{}warning: no --cache-key-file: tier records are only checksummed, so anyone who can write to "
        "{} can plant K/V this process will serve\n",
        log_prefix, where);
  }
  if (o.host_mib > 0) index.attach_host(static_cast<size_t>(o.host_mib * 1048576.0), o.swap_out_once);
  if (!o.cache_dir.empty()) {
    disk_ = std::make_unique<DiskSpanStore>(o.cache_dir, static_cast<size_t>(o.disk_mib * 1048576.0), key);
    index.attach_disk(*disk_);
    // Demoted spans are sealed and written on the store's thread, not the
    // engine's; up to this much of them waits in memory.
    disk_->write_behind(size_t{256} << 20);
    index.set_layer_preload(parse_layer_preload(o.layer_preload));
    if (disk_->n_files() > 0)
      fmt::print(stderr, "{}disk tier: {} spans ({:.1f} MiB) adopted from {}\n", log_prefix, disk_->n_files(),
                 disk_->bytes() / 1048576.0, o.cache_dir);
  }
  if (redis && !o.redis_cluster.empty())
    index.attach_remote(std::make_shared<RedisClusterStore>(parse_redis_addresses(o.redis_cluster), *redis),
                        o.redis_block, key);
  else if (redis)
    index.attach_remote(std::make_shared<RedisStore>(*redis), o.redis_block, key);
}

LowerTiers::~LowerTiers() = default;

EngineTiers::EngineTiers(Engine& engine, const TierOptions& o, const std::string& log_prefix)
    : engine_(engine), tiers_(engine, o, log_prefix), cache_dir_(o.cache_dir) {
  if (tiers_.disk())
    if (const size_t dropped = engine.load_strategy_state(cache_dir_); dropped > 0)
      fmt::print(stderr, "{}warning: {} unreadable strategy records in {} dropped\n", log_prefix, dropped,
                 cache_dir_);
}

bool EngineTiers::persist() {
  if (!tiers_.disk()) return false;
  engine_.persist_cache();
  engine_.save_strategy_state(cache_dir_);
  return true;
}

}  // namespace depcache

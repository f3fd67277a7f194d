#include "tier_options.h"

#include <fmt/format.h>

#include <charconv>

#include "util/error.h"

namespace depcache::cli {
namespace {

// An option check that runs the value's parser: its error is the message.
template <typename Parse>
std::function<std::string(const std::string&)> parses_with(Parse parse) {
  return [parse](const std::string& s) {
    try {
      parse(s);
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
}

}  // namespace

void add_tier_options(CLI::App& cmd, TierOptions& o) {
  cmd.add_option("--host-mib", o.host_mib, "Host tier budget in MiB (0: none; hot spans evicted go here)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1048576.0));
  cmd.add_flag("--swap-out-once", o.swap_out_once,
               "Host tier: a span brought back to the hot tier keeps its host copy, so evicting it again "
               "copies nothing (RAGCache); the copies count against --host-mib");
  cmd.add_option("--cache-dir", o.cache_dir,
                 "Disk tier directory: spans evicted from memory are kept here across runs");
  cmd.add_option("--disk-mib", o.disk_mib, "Disk tier budget in MiB")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1048576.0));
  cmd.add_option("--layer-preload", o.layer_preload,
                 "Disk tier: a span found on disk is read layer by layer while the prompt is computed; "
                 "'auto' reads first as many layers as keep the pass from waiting (from the measured read "
                 "and compute rates), a number reads that many first, 'off' reads spans whole before")
      ->capture_default_str()
      ->check(parses_with(parse_layer_preload));
  cmd.add_option(
         "--redis", o.redis,
         "Remote tier shared with other processes: Redis at host:port (down or slow: computed locally)")
      ->check(parses_with(parse_redis_address));
  cmd.add_option("--redis-block", o.redis_block, "Tokens per remote block")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
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

LowerTiers::LowerTiers(RadixIndex& index, const TierOptions& o, const std::string& log_prefix) {
  if (o.host_mib > 0) index.attach_host(static_cast<size_t>(o.host_mib * 1048576.0), o.swap_out_once);
  if (!o.cache_dir.empty()) {
    disk_ = std::make_unique<DiskSpanStore>(o.cache_dir, static_cast<size_t>(o.disk_mib * 1048576.0));
    index.attach_disk(*disk_);
    index.set_layer_preload(parse_layer_preload(o.layer_preload));
    if (disk_->n_files() > 0)
      fmt::print(stderr, "{}disk tier: {} spans ({:.1f} MiB) adopted from {}\n", log_prefix, disk_->n_files(),
                 disk_->bytes() / 1048576.0, o.cache_dir);
  }
  if (!o.redis.empty()) {
    redis_ = std::make_unique<RedisStore>(parse_redis_address(o.redis));
    index.attach_remote(*redis_, o.redis_block);
  }
}

LowerTiers::~LowerTiers() = default;

}  // namespace depcache::cli

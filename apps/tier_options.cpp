#include "tier_options.h"

#include <fmt/format.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "util/error.h"
#include "util/mac.h"

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
  cmd.add_option("--cache-key-file", o.cache_key_file,
                 "Secret of at least 32 bytes (e.g. head -c 32 /dev/urandom), the same for every replica: "
                 "records in --cache-dir and Redis are sealed with HMAC-SHA256 under it, and records that "
                 "fail it are refused. Without it, anyone who can write to the tier can plant K/V");
  cmd.add_option("--redis-password-file", o.redis_password_file,
                 "File holding the Redis password, sent with AUTH on every connect (a trailing newline is "
                 "ignored)");
  cmd.add_option("--redis-user", o.redis_user, "Redis ACL user for AUTH (with --redis-password-file)");
  cmd.add_option("--remote-timeout-ms", o.remote_timeout_ms,
                 "Deadline of a whole Redis command (connect, GET, SET), after which it is a miss and Redis "
                 "is skipped for a while")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
}

RedisOptions redis_options(const TierOptions& o) {
  RedisOptions r = parse_redis_address(o.redis);
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

LowerTiers::LowerTiers(RadixIndex& index, const TierOptions& o, const std::string& log_prefix) {
  std::shared_ptr<const MacKey> key;
  if (!o.cache_key_file.empty()) key = std::make_shared<const MacKey>(MacKey::from_file(o.cache_key_file));
  // Options and credentials are checked before anything is attached.
  const std::optional<RedisOptions> redis = o.redis.empty() ? std::nullopt : std::optional(redis_options(o));
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
  if (redis) index.attach_remote(std::make_shared<RedisStore>(*redis), o.redis_block, key);
}

LowerTiers::~LowerTiers() = default;

}  // namespace depcache::cli

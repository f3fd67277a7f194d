#include "tier_options.h"

#include <fmt/format.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "cli_common.h"
#include "kv/redis_cluster_store.h"
#include "util/error.h"
#include "util/mac.h"

namespace depcache::cli {

void add_tier_options(CLI::App& cmd, TierOptions& o) {
  cmd.add_option("--host-mib", o.host_mib,
                 "Host tier budget in MiB (0: none; hot spans evicted go here; -1 in run and serve: the "
                 "strategy's own, "
                 "4x --cache-mib for ragcache, none for the others)")
      ->capture_default_str()
      ->check(CLI::Range(-1.0, 1048576.0));
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
  cmd.add_option("--redis-cluster", o.redis_cluster,
                 "Remote tier on a Redis Cluster: some of its nodes as host:port,host:port (the rest are "
                 "learnt from the cluster); keys spread over the masters by hash slot, and a node down or "
                 "failing over makes only its keys misses")
      ->check(parses_with(parse_redis_addresses))
      ->excludes("--redis");
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

}  // namespace depcache::cli

#include "engine_options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli_common.h"
#include "compute/dot.h"
#include "compute/packed_matrix.h"
#include "kv/policy.h"
#include "strategy/profile.h"
#include "strategy/scheduler.h"
#include "util/timing.h"

namespace depcache::cli {

void add_kv_storage_options(CLI::App& cmd, std::string& kv_type, double& cache_mib, TierOptions& tiers) {
  add_kv_type_option(cmd, kv_type);
  cmd.add_option("--cache-mib", cache_mib, "Byte budget of the KV index's hot tier in MiB")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1048576.0));
  add_tier_options(cmd, tiers);
}

void add_starvation_bound_option(CLI::App& cmd, int& bound) {
  cmd.add_option("--starvation-bound", bound,
                 "A waiting request passed over this many times goes next (all orders but fifo)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
}

void add_window_option(CLI::App& cmd, size_t& window) {
  cmd.add_option("--window", window, "Queued requests LACR's lookahead and the scheduler see")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
}

void add_engine_options(CLI::App& cmd, EngineArgs& a) {
  add_kv_storage_options(cmd, a.kv_type, a.cache_mib, a.tiers);
  // The names come from the registries.
  cmd.add_option("--policy", a.policy,
                 fmt::format("Replacement policy of the index: auto (each strategy's own: lacr for depcache, "
                             "pgdsf for ragcache, cachecraft for cachecraft, lru for the others), {}",
                             fmt::join(policy_names(), ", ")))
      ->capture_default_str();
  cmd.add_option("--scheduler", a.scheduler,
                 fmt::format("Order of admission among the first --window waiting requests: auto (ragcache's "
                             "cache-aware order for ragcache, fifo for the others), {}",
                             fmt::join(scheduler_names(), ", ")))
      ->capture_default_str()
      ->check(CLI::IsMember([] {
        std::vector<std::string> names = scheduler_names();
        names.insert(names.begin(), "auto");
        return names;
      }()));
  add_starvation_bound_option(cmd, a.starvation_bound);
  add_window_option(cmd, a.window);
  cmd.add_option("--prefetch", a.prefetch,
                 "Waiting requests whose spans are loaded into the hot tier while a step computes")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd.add_option("--batch-tokens", a.batch_tokens,
                 "Tokens computed in one forward pass: a decode token of every running request, the rest "
                 "prefill (longer prompts are split over several passes)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd.add_option("--max-running", a.max_running,
                 "Requests in flight at most, the others queueing (default 0: as many as the pool holds; 1: "
                 "one at a time)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd.add_flag("--no-wait-for-shared", a.no_wait_for_shared,
               "Admit a request beside a prefill under way that computes some of its tokens (by default it "
               "waits for that prefill and reuses them)");
  add_threads_option(cmd, a.threads);
  cmd.add_option("--scheme", a.scheme,
                 "depcache positions: auto (the model's depcache.position_scheme, else sequential), "
                 "sequential or stacked (closer to full attention; moved subtrees reused approximately), "
                 "depth (exact reuse, further from full attention)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "depth", "sequential", "stacked"}));
  cmd.add_option("--tree-context", a.tree_context,
                 "depcache: what a context tree sees besides itself: auto (the model's "
                 "depcache.tree_context, else system), system (the system text, as DepCache lays it out) or "
                 "none (for a model trained so: a moved tree is then reused exactly)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "system", "none"}));
  cmd.add_flag("--int8-activations", a.int8_activations,
               "Approximate: Q8_0/Q4_K/Q4_0/Q6_K matmuls on activations quantized per token to int8 "
               "(AVX-512 VNNI or AVX2); faster, not exact (run --fidelity measures it against exact)");
  cmd.add_flag("--no-reuse", a.no_reuse, "Never look up or insert KV (depcache: dependency attention alone)");
  cmd.add_flag("--no-realign", a.no_realign,
               "depcache and the chunk strategies: reuse cached KV at the positions it was computed at, "
               "without re-encoding the keys at their new positions (an ablation: what position alignment "
               "is worth)");
  add_chunk_options(&cmd, a.chunk);
}

ResolvedEngine resolve_engine(const EngineArgs& a, std::string_view strategy, const ModelConfig& config,
                              int64_t pool_rows, bool dependency) {
  const SystemProfile profile = system_profile(strategy);
  ResolvedEngine r;
  EngineOptions& eo = r.engine;
  eo.pool_rows = pool_rows;
  eo.kv_type = parse_kv_type(a.kv_type);
  eo.cache_bytes = static_cast<size_t>(a.cache_mib * 1048576.0);
  eo.policy = a.policy == "auto" ? profile.policy : a.policy;
  make_policy(eo.policy);  // a bad name fails here, before anything runs
  eo.strategy = a.chunk;
  eo.strategy.scheme = a.scheme != "auto" ? *parse_position_scheme(a.scheme)
                       : dependency       ? default_position_scheme(config)
                                          : kDefaultPositionScheme;
  eo.strategy.tree_context = a.tree_context != "auto" ? *parse_tree_context(a.tree_context)
                             : dependency             ? default_tree_context(config)
                                                      : TreeContext::System;
  eo.strategy.reuse = !a.no_reuse;
  eo.strategy.realign = !a.no_realign;
  eo.batch_tokens = a.batch_tokens;
  eo.max_running = a.max_running;
  eo.wait_for_shared = !a.no_wait_for_shared;
  eo.threads = a.threads;
  eo.window = a.window;
  eo.prefetch = a.no_reuse ? 0 : a.prefetch;
  eo.scheduler = {a.scheduler == "auto" ? profile.scheduler : a.scheduler, a.starvation_bound};
  r.tiers = a.tiers;
  if (r.tiers.host_mib < 0) r.tiers.host_mib = a.no_reuse ? 0 : profile.host_tier_ratio * a.cache_mib;
  r.tiers.swap_out_once = a.tiers.swap_out_once || (a.tiers.host_mib < 0 && profile.swap_out_once);
  std::string tiers = fmt::format("hot {:.0f} MiB", a.cache_mib);
  if (r.tiers.host_mib > 0)
    tiers +=
        fmt::format(", host {:.0f} MiB{}", r.tiers.host_mib, r.tiers.swap_out_once ? " (swap-out-once)" : "");
  if (!r.tiers.cache_dir.empty()) tiers += fmt::format(", disk {:.0f} MiB", r.tiers.disk_mib);
  if (!r.tiers.redis.empty()) tiers += ", remote " + r.tiers.redis;
  if (!r.tiers.redis_cluster.empty()) tiers += ", remote cluster " + r.tiers.redis_cluster;
  r.summary = a.no_reuse ? "no reuse"
                         : fmt::format("policy {}{}, scheduler {}, tiers {}", eo.policy,
                                       a.policy == "auto" ? "" : " (--policy)", eo.scheduler.order, tiers);
  return r;
}

std::string apply_matmul_mode(const EngineArgs& a) {
  if (a.int8_activations) set_int8_activations(true);
  if (!int8_activations()) return "";
  return fmt::format("matmuls: approximate, int8 activations for Q8_0/Q4_K/Q4_0/Q6_K weights ({} kernels{})",
                     isa_name(current_isa()), has_int8_panels(DType::Q8_0) ? "" : ": none here, exact");
}

void profile_costs_if_needed(Engine& engine, const ResolvedEngine& r, const std::string& log_prefix) {
  if (r.engine.policy != "pgdsf" || !r.engine.strategy.reuse) return;
  // PGDSF's cost of a node: the measured time to recompute its tokens after its context.
  const auto t0 = Clock::now();
  const PrefillCostTable table = engine.profile_prefill_cost(std::min<int64_t>(r.engine.pool_rows, 4096));
  fmt::print(stderr, "{}PGDSF prefill cost table ({:.1f} s to measure):\n{}", log_prefix, seconds_since(t0),
             table.to_string());
  engine.index().set_cost_model(table);
}

}  // namespace depcache::cli

#include "engine/engine_args.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "compute/dot.h"
#include "compute/kv_format.h"
#include "compute/packed_matrix.h"
#include "kv/policy.h"
#include "strategy/profile.h"
#include "util/timing.h"

namespace depcache {

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
  if (a.bf16_products) set_bf16_products(true);
  std::vector<std::string> modes;
  if (int8_activations())
    modes.push_back(fmt::format("int8 activations for Q8_0/Q4_K/Q4_0/Q6_K weights ({} kernels{})",
                                isa_name(current_isa()),
                                has_int8_panels(DType::Q8_0) ? "" : ": none here, exact"));
  if (bf16_products())
    modes.push_back(
        fmt::format("bfloat16 products for BF16/F16 weights ({})",
                    has_bf16_panels(DType::BF16) ? "AVX512-BF16" : "this CPU has no AVX512-BF16: exact"));
  if (modes.empty()) return "";
  return fmt::format("matmuls: approximate, {}", fmt::join(modes, "; "));
}

void profile_costs_if_needed(Engine& engine, const ResolvedEngine& r, const std::string& log_prefix) {
  if (r.engine.policy != "pgdsf" || !r.engine.strategy.reuse) return;
  // PGDSF's cost of a node: the measured time to recompute its tokens after its context.
  const auto t0 = Clock::now();
  const PrefillCostTable table = engine.profile_prefill_cost(std::min<int64_t>(r.engine.pool_rows, 4096));
  fmt::print(stderr, "{}PGDSF prefill cost table ({:.1f} s to measure):\n{}", log_prefix, seconds_since(t0),
             table.to_string());
  engine.set_cache_cost_model(table);
}

}  // namespace depcache

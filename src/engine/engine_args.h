#pragma once
// The engine's options as a command line or an experiment states them, with
// "auto" where a strategy's own profile (strategy/profile.h) decides, and
// their resolution into what a strategy's engine runs with.
#include <string>
#include <string_view>

#include "engine/engine.h"
#include "engine/engine_tiers.h"
#include "model/model_config.h"

namespace depcache {

struct EngineArgs {
  std::string kv_type = "f16";
  double cache_mib = 1024;
  std::string policy = "auto", scheduler = "auto";
  int starvation_bound = 32;
  size_t prefetch = 0, window = 32, max_running = 0;
  int64_t batch_tokens = 512;
  bool no_wait_for_shared = false;
  int threads = 0;
  std::string scheme = "auto", tree_context = "auto";
  bool no_reuse = false, no_realign = false;
  bool int8_activations = false;  // these two are set for the whole process by apply_matmul_mode
  bool bf16_products = false;
  StrategyOptions chunk;  // the chunk strategies' options (scheme, reuse and realignment set by resolve)
  TierOptions tiers;      // host_mib < 0: the profile's
  EngineArgs() { tiers.host_mib = -1; }
};

// What a strategy runs with: its profile under what the command line set.
struct ResolvedEngine {
  EngineOptions engine;
  TierOptions tiers;
  // One line for headers and start-up logs: policy, scheduler, tiers, positions.
  std::string summary;
};
// strategy: whose profile fills "auto" (for a server, its default
// strategy's); dependency: whether dependency attention runs, so that the
// model's position scheme and tree context are read (and checked).
ResolvedEngine resolve_engine(const EngineArgs& a, std::string_view strategy, const ModelConfig& config,
                              int64_t pool_rows, bool dependency);

// --int8-activations and --bf16-products (or DEPCACHE_INT8_ACTIVATIONS=1,
// DEPCACHE_BF16_PRODUCTS=1) for the whole process; "" when matmuls are
// exact, else a line saying what is approximate.
std::string apply_matmul_mode(const EngineArgs& a);

// PGDSF's cost model timed on this machine when the engine's policy is
// PGDSF and it reuses: the table goes to the index; said on stderr after
// `log_prefix`.
void profile_costs_if_needed(Engine& engine, const ResolvedEngine& r, const std::string& log_prefix);

}  // namespace depcache

#pragma once
// The engine's options, declared once for every command that runs an engine
// over a request stream (run, serve; some of them for chunks and simulate): KV storage, the index and its
// tiers, the replacement policy, the scheduler, batching, positions. A strategy's own defaults
// (strategy/profile.h) fill what the command line leaves on "auto"; what it sets applies to every strategy.
#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

#include "engine/engine_args.h"
#include "tier_options.h"

namespace depcache::cli {

// Declares them on `cmd` (run, serve).
void add_engine_options(CLI::App& cmd, EngineArgs& a);
// Groups of them, for commands that run an engine for one job (chunks fuse)
// or replay its index without a model (simulate): --kv-type, --cache-mib
// and the lower tiers; --window; --starvation-bound; -t/--threads.
void add_kv_storage_options(CLI::App& cmd, std::string& kv_type, double& cache_mib, TierOptions& tiers);
void add_window_option(CLI::App& cmd, size_t& window);
void add_starvation_bound_option(CLI::App& cmd, int& bound);

}  // namespace depcache::cli

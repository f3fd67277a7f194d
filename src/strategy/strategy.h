#pragma once
// Strategies are planners: each turns a request's prompt parts into a
// RequestPlan — the assembly's tokens and positions, the runs to look up and
// insert, the visibility of what is computed — and the executor
// (exec/plan_execution.h, inside the engine) carries out every plan: spans
// placed from the index, the rest computed by one sparse prefill, the new KV
// offered to the index. Planning reads and changes nothing. They
// differ only in the prompt they build, what they look up and the visibility
// they give.
//   full:     the flat prompt, causal, no reuse (the baseline)
//   prefix:   the flat prompt, longest cached prefix reused
//   ragcache: the flat prompt over RAGCache's knowledge tree: the system
//             prompt at the root, each document a node in the context of
//             the documents before it, reused only whole, the question
//             never stored
//   depcache: the DepPrompt under dependency attention, each subtree's KV
//             matched from its root and reused at its new positions
//   fullreuse, cacheblend, fusionrag: chunks reused at any position, some
//             of their tokens recomputed (strategy/chunk_reuse.h)
//   cachecraft: chunk variants chosen by context, fixed by their own
//             metadata (strategy/cache_craft.h)
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "exec/plan.h"
#include "exec/plan_execution.h"
#include "kv/radix_index.h"
#include "prompt/dep_prompt.h"
#include "prompt/prompt_parts.h"
#include "util/error.h"

namespace depcache {

// The namespace of a kind of run ("prefix", "depcache", "chunk", ...) for a
// model and KV type: KV computed by another model or stored in another type
// never matches.
uint64_t strategy_namespace(uint64_t model_fingerprint, DType kv_type, std::string_view kind);
std::vector<CacheRun> dependency_runs(const DepPrompt& prompt, uint64_t ns, PositionScheme scheme);

class Strategy {
 public:
  explicit Strategy(bool reuse) : reuse_(reuse) {}
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;
  virtual RequestPlan plan(const PromptParts& parts) const = 0;
  bool reuse() const { return reuse_; }
  // What a strategy keeps beside the KV it stores (Cache-Craft's variant
  // metadata), saved into and loaded from a persistent tier's directory so
  // the next process finds it with the KV. Load returns the records dropped
  // as unreadable. Default: nothing to keep.
  virtual void save_state(const std::filesystem::path& /*dir*/) const {}
  virtual size_t load_state(const std::filesystem::path& /*dir*/) { return 0; }

 private:
  bool reuse_;
};

// The position scheme dependency attention uses when none is asked for: the
// one the model says it was trained for (depcache.position_scheme), else
// kDefaultPositionScheme, the scheme measured closest to full attention on
// a model not trained for dependency attention (docs/fidelity.md).
inline constexpr PositionScheme kDefaultPositionScheme = PositionScheme::Sequential;
PositionScheme default_position_scheme(const ModelConfig& config);
// Likewise what trees see: the model's depcache.tree_context, else System.
TreeContext default_tree_context(const ModelConfig& config);

struct StrategyOptions {
  PositionScheme scheme = kDefaultPositionScheme;  // depcache
  bool reuse = true;                               // prefix, depcache: look up and insert
  bool realign = true;                             // depcache, chunk strategies: see RequestPlan::realign
  TreeContext tree_context = TreeContext::System;  // depcache
  double recompute_ratio = 0.15;                   // cacheblend, fusionrag: chunk tokens recomputed
  // cachecraft (strategy/cache_craft.h): alpha scales the cache-fix
  // overhead; variants kept per chunk; layers the focused chunks must hold
  // before the others stop being fixed (0: never stop early).
  double cachecraft_alpha = 1.0;
  int chunk_variants = 5;
  int focus_window = 3;
};

// name: one of strategy_names() (chunk strategies: strategy/chunk_reuse.h).
// A strategy only plans; one index may serve several, whose keys never
// collide except where the same KV is meant (the system prompt as a prefix).
std::unique_ptr<Strategy> make_strategy(std::string_view name, const Model& model, DType kv_type,
                                        const StrategyOptions& options = {});
// The same keyed by a model fingerprint alone (what the simulator plans with).
std::unique_ptr<Strategy> make_strategy(std::string_view name, uint64_t model_fingerprint, DType kv_type,
                                        const StrategyOptions& options = {});
std::vector<std::string> strategy_names();

}  // namespace depcache

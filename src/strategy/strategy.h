#pragma once
// Strategies (planners): each turns a request's prompt parts into a KV
// assembly — spans placed from the index, the rest computed by one sparse
// prefill — and afterwards offers the new KV to the index. They differ only
// in the prompt they build, what they look up and the visibility they give.
//   full:     the flat prompt, causal, no reuse (the baseline)
//   prefix:   the flat prompt, longest cached prefix reused
//   depcache: the DepPrompt under dependency attention, each subtree's KV
//             matched from its root and reused at its new positions
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "kv/radix_index.h"
#include "prompt/dep_prompt.h"
#include "strategy/prompt_parts.h"

namespace depcache {

struct PrefillReport {
  int64_t prompt_tokens = 0;                     // tokens in the assembly
  int64_t computed_tokens = 0;                   // tokens run through the model
  int64_t reused_tokens = 0;                     // tokens placed from the index
  int64_t attention_pairs = 0;                   // (query, key) pairs per layer
  int64_t flat_tokens = 0;                       // tokens of the flat serialization, for reference
  int64_t reused_from[RadixIndex::kTiers] = {};  // reused tokens by the tier they were found in
  double load_ms = 0;                            // bringing them to the hot tier (part of TTFT)
  std::vector<float> logits;                     // of the last prompt token
};

// A sequence a strategy will look up for a request: what schedulers and
// prefetchers peek at before it runs.
struct Lookup {
  uint64_t ns = 0;
  std::vector<int32_t> tokens;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;
  // Clears `kv`, builds the assembly of the prompt, runs the prefill, leaves
  // kv.n_past() at the prompt's end (ready to decode) and stores new KV in
  // the index (when the strategy reuses).
  virtual PrefillReport prefill(const PromptParts& parts, KvCache& kv, Forward& fwd) = 0;
  // The sequences prefill will look up (none without reuse).
  virtual std::vector<Lookup> lookups(const PromptParts& parts) const = 0;
};

// A cacheable run of a DepPrompt under depcache: tokens matched from the
// root of namespace `ns` (which holds everything their KV depends on besides
// themselves) and the prompt rows they fill. segment: the tree segment, or
// -1 for the leading linear run (system prompt, plain text).
struct CacheRun {
  uint64_t ns = 0;
  std::vector<int32_t> tokens;
  std::vector<int64_t> rows;
  int32_t segment = -1;
};
std::vector<CacheRun> dependency_runs(const DepPrompt& prompt, uint64_t ns, PositionScheme scheme);

// The position scheme dependency attention uses when none is asked for: the
// one the model says it was trained for (depcache.position_scheme), else
// kDefaultPositionScheme, the scheme measured closest to full attention on
// a model not trained for dependency attention (README, "Fidelity").
inline constexpr PositionScheme kDefaultPositionScheme = PositionScheme::Sequential;
PositionScheme default_position_scheme(const ModelConfig& config);

struct StrategyOptions {
  PositionScheme scheme = kDefaultPositionScheme;  // depcache
  bool reuse = true;                               // prefix, depcache: look up and insert
};

// name: full, prefix or depcache. The index may be shared by several
// strategies; their keys never collide.
std::unique_ptr<Strategy> make_strategy(std::string_view name, RadixIndex& index, const Model& model,
                                        DType kv_type, const StrategyOptions& options = {});
std::vector<std::string> strategy_names();

}  // namespace depcache

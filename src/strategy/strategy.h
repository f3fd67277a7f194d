#pragma once
// Strategies are planners: each turns a request's prompt parts into a
// RequestPlan — the assembly's tokens and positions, the runs to look up and
// insert, the visibility of what is computed — and one apply step
// (apply_plan) carries out every plan: spans placed from the index, the rest
// computed by one sparse prefill, the new KV offered to the index. They
// differ only in the prompt they build, what they look up and the visibility
// they give.
//   full:     the flat prompt, causal, no reuse (the baseline)
//   prefix:   the flat prompt, longest cached prefix reused
//   depcache: the DepPrompt under dependency attention, each subtree's KV
//             matched from its root and reused at its new positions
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "kv/pin_lease.h"
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

// What a strategy decides for a request before anything is looked up: the
// assembly's tokens and RoPE positions by row, the cacheable runs to match
// (and to insert once computed; none without reuse), and the visibility of
// whichever rows end up computed. Planning reads nothing and changes
// nothing; apply_plan does both.
struct RequestPlan {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<CacheRun> runs;
  std::function<Visibility(std::span<const int64_t> computed)> visibility;
  int64_t flat_tokens = 0;  // of the flat serialization, for reference
  // Reused keys are re-encoded (RoPE) at the plan's positions; false keeps
  // them at the positions they were computed at, an ablation (DepCache's
  // reuse without position alignment) that shows what alignment is worth.
  bool realign = true;

  // The sequences it will look up (none without reuse): what schedulers,
  // LACR's lookahead and prefetchers peek at before it runs.
  std::vector<Lookup> lookups() const;
};

// The one place a plan takes effect, in two halves around the forward pass
// (which the engine batches with other requests, possibly over several
// steps). The constructor matches every run (one access per node for the
// request), places what is cached in `kv` at rows row0 + plan row, at the
// plan's positions, and pins it; prefill() is the rest to compute, in plan
// rows (the caller shifts them to where the assembly sits when it runs).
// finish() inserts the runs from `kv`, the assembly now at row0 (it may have
// moved in between), and releases the pins; the lease releases them on
// every other way out too (an exception, a cancel). The plan must outlive
// the execution.
class PlanExecution {
 public:
  PlanExecution(const RequestPlan& plan, RadixIndex& index, KvCache& kv, int64_t row0);
  const PrefillPlan& prefill() const { return prefill_; }
  // logits: of the last prompt token; attention_pairs: per layer.
  PrefillReport finish(const KvCache& kv, int64_t row0, std::vector<float> logits, int64_t attention_pairs,
                       double ms_per_token);

 private:
  const RequestPlan& plan_;
  RadixIndex& index_;
  PinLease lease_;
  std::vector<int64_t> computed_;  // plan rows computed
  PrefillPlan prefill_;
  PrefillReport report_;
};

// The plan of a sequence resumed after preemption: its prompt, then the
// tokens it generated, which see what they saw when they were decoded
// (every earlier row of the sequence) at the positions they had. The last
// one's logits give the next token.
RequestPlan with_generated(const RequestPlan& plan, std::span<const int32_t> generated);

// A whole plan on its own assembly: clears `kv`, runs PlanExecution with one
// forward pass, and leaves kv.n_past() at the prompt's end (ready to decode).
PrefillReport apply_plan(const RequestPlan& plan, RadixIndex& index, KvCache& kv, Forward& fwd);

class Strategy {
 public:
  Strategy(RadixIndex& index, bool reuse) : index_(index), reuse_(reuse) {}
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;
  virtual RequestPlan plan(const PromptParts& parts) const = 0;
  // plan + apply_plan.
  PrefillReport prefill(const PromptParts& parts, KvCache& kv, Forward& fwd);
  bool reuse() const { return reuse_; }

 private:
  RadixIndex& index_;
  bool reuse_;
};

// The position scheme dependency attention uses when none is asked for: the
// one the model says it was trained for (depcache.position_scheme), else
// kDefaultPositionScheme, the scheme measured closest to full attention on
// a model not trained for dependency attention (README, "Fidelity").
inline constexpr PositionScheme kDefaultPositionScheme = PositionScheme::Sequential;
PositionScheme default_position_scheme(const ModelConfig& config);

struct StrategyOptions {
  PositionScheme scheme = kDefaultPositionScheme;  // depcache
  bool reuse = true;                               // prefix, depcache: look up and insert
  bool realign = true;                             // depcache: see RequestPlan::realign
};

// name: full, prefix or depcache. The index may be shared by several
// strategies; their keys never collide.
std::unique_ptr<Strategy> make_strategy(std::string_view name, RadixIndex& index, const Model& model,
                                        DType kv_type, const StrategyOptions& options = {});
std::vector<std::string> strategy_names();

}  // namespace depcache

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

#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "kv/pin_lease.h"
#include "kv/radix_index.h"
#include "prompt/dep_prompt.h"
#include "strategy/prompt_parts.h"
#include "util/error.h"

namespace depcache {

struct PrefillReport {
  int64_t prompt_tokens = 0;  // tokens in the assembly
  // Tokens run through the model, in whole-model equivalents ((token, layer)
  // pairs over the layers), summed over passes: a token recomputed is
  // counted again, one computed in 2 of 24 layers as 1/12.
  int64_t computed_tokens = 0;
  int64_t reused_tokens = 0;    // tokens placed from the index
  int64_t attention_pairs = 0;  // (query, key) pairs per layer
  int64_t flat_tokens = 0;      // tokens of the flat serialization, for reference
  // Reused tokens by the tier their KV was found in: each placed row once
  // (rows placed by several runs, to the first), so they sum to reused_tokens.
  int64_t reused_from[RadixIndex::kTiers] = {};
  double load_ms = 0;  // bringing them to the hot tier (part of TTFT)
  // Layer-wise preload: time the pass waited for layers still being read
  // (the part of the disk read not hidden behind computation; in TTFT too).
  double layer_wait_ms = 0;
  std::vector<float> logits;  // of the last prompt token
};

// A sequence a strategy will look up for a request: what schedulers and
// prefetchers peek at before it runs.
struct Lookup {
  uint64_t ns = 0;
  std::vector<int32_t> tokens;
  std::vector<int64_t> stops{};  // CacheRun::stops
};

// The longest prefix of `length` tokens that ends at a stop (length itself
// when there are none).
int64_t whole_stops(std::span<const int64_t> stops, int64_t length);
// What a lookup would find cached now (peek: no access, nothing moves), in
// whole stops.
int64_t cached_length(const RadixIndex& index, const Lookup& lookup);

// A cacheable run of a plan: tokens matched from the root of namespace `ns`
// (which holds everything their KV depends on besides themselves) and the
// prompt rows they fill. segment: the context item the run belongs to (under
// depcache its tree segment, for chunks the chunk), or -1 (system prompt,
// plain text, a whole flat prompt).
// When: after the fill pass of a multi-pass plan (or at the end of a
// one-pass plan), at the end, or never (looked up only). A run is not
// inserted when a run of another namespace placed any of its rows: a
// namespace holds only what was computed or found for it.
// whole: placed only when every token is cached and none of its rows was
// placed by an earlier run; otherwise not looked up at all (alternative
// versions of the same rows, such as Cache-Craft's chunk variants).
// fix_overhead: Cache-Craft's CFO of reusing it, told to the replacement
// policy before the access (negative: none).
// stops: token counts (ascending) at which a match of the run may end, and
// at which its insert ends a node (RAGCache's documents: a node per
// document, reused only whole); empty: anywhere, one node for what is new.
enum class RunInsert { AfterFill, AtEnd, Never };
struct CacheRun {
  uint64_t ns = 0;
  std::vector<int32_t> tokens;
  std::vector<int64_t> rows;
  int32_t segment = -1;
  RunInsert insert = RunInsert::AfterFill;
  bool whole = false;
  double fix_overhead = -1;
  std::vector<int64_t> stops{};
};

// A namespace confined to a cache scope (a tenant: an API key's namespace,
// a request's cache_salt); scope 0 is the shared one and leaves ns as it is.
uint64_t scoped_namespace(uint64_t ns, uint64_t scope);

// A run's match and insert, as every caller of the index makes them (the
// executor and the simulator): the match ends at a stop, the insert puts a
// node end at each.
// fresh_tokens, remote: RadixIndex::match's.
RadixIndex::Match match_run(RadixIndex& index, const CacheRun& run, uint64_t request_tick,
                            int64_t fresh_tokens = 0, bool remote = true);
// Inserts run.tokens (a span maker for real KV, or bytes_per_token > 0 for
// virtual nodes); *path receives the nodes holding the run.
void insert_run(RadixIndex& index, const CacheRun& run, const RadixIndex::SpanMaker* make_span,
                size_t bytes_per_token, double cost_per_token, RadixIndex::Match* path);

// The namespace of a kind of run ("prefix", "depcache", "chunk", ...) for a
// model and KV type: KV computed by another model or stored in another type
// never matches.
uint64_t strategy_namespace(uint64_t model_fingerprint, DType kv_type, std::string_view kind);
std::vector<CacheRun> dependency_runs(const DepPrompt& prompt, uint64_t ns, PositionScheme scheme);

// One forward pass over part of an assembly, in plan rows: a pass of a
// strategy that computes in several (chunk reuse).
struct PassPlan {
  std::vector<int64_t> rows;  // ascending
  Visibility visibility;      // of `rows`
  LayerHook hook;             // optional; its batch indices index `rows`
  // Attention to measure (none without queries): from each query (plan rows
  // of this pass) to each target (plan row ranges, sorted and disjoint), per
  // layer from from_layer (-1: the last layer only). The hook sees the
  // layers done so far; the next pass (or RequestPlan::learn) all of it.
  struct Probe {
    std::vector<int64_t> queries;
    std::vector<RowRange> targets;
    int from_layer = -1;
  } probe;
  bool last = false;  // its last row is the prompt's last, whose logits start the answer
};

// What the passes so far left, for choosing the next.
struct PassState {
  const KvCache& kv;
  int64_t row0 = 0;                     // the assembly's first row in kv
  const std::vector<bool>& placed;      // plan rows placed from the index
  const std::vector<uint64_t>& source;  // the namespace each placed row came from
  int done = 0;                         // passes made by next_pass so far
  // The previous pass's probe: [layer][query][target] in its order (layers
  // before from_layer empty); null when it had none.
  const AttentionMass* mass = nullptr;
  uint64_t scope = 0;  // RequestPlan::scope: `source` holds namespaces scoped by it
};

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
  // Strategies that compute in several passes (chunk reuse). The first pass
  // fills rows [0, fill_end) not placed, at fill_positions (where each run
  // sits when computed alone), seeing what `visibility` says; placed rows
  // sit at fill_positions too. Then the runs are inserted, every row is
  // re-encoded at `positions`, and next_pass gives each further pass until
  // one is the last.
  int64_t fill_end = 0;
  std::vector<int32_t> fill_positions;  // empty: `positions`
  std::function<PassPlan(const PassState&)> next_pass;
  // The cache scope (tenant) the runs' namespaces were confined to by
  // scope_plan; 0: the shared scope.
  uint64_t scope = 0;
  // Optional, after the final pass: what a strategy keeps of the request's
  // computation (Cache-Craft's attention metadata of the chunks it computed).
  std::function<void(const PassState&)> learn;

  // The sequences it will look up (none without reuse): what schedulers,
  // LACR's lookahead and prefetchers peek at before it runs.
  std::vector<Lookup> lookups() const;
};

// Confines every run of a plan to `scope`, after the strategy planned it:
// whatever runs a strategy asks for (Cache-Craft's variants learned from
// other requests included), the index is only ever read and written inside
// the request's scope.
void scope_plan(RequestPlan& plan, uint64_t scope);

// A span read layer by layer (RadixIndex::set_layer_preload) failed a layer's
// checksum during the pass that placed it: what the pass computed is void.
// The caller releases the execution, drops the node (drop_bad_load) and runs
// the request again, which then computes those tokens.
class LayerLoadError : public Error {
 public:
  LayerLoadError(RadixIndex::NodeId node, uint64_t disk_key, int layer);
  RadixIndex::NodeId node() const { return node_; }
  uint64_t disk_key() const { return disk_key_; }

 private:
  RadixIndex::NodeId node_;
  uint64_t disk_key_;
};

// What a forward pass of an execution measured.
struct PassResult {
  const AttentionMass& attention_mass;  // PrefillResult's
  int64_t attention_pairs = 0;          // per layer
  double ms_per_token = 0;
};

// The one place a plan takes effect, around the forward passes (which the
// engine batches with other requests, possibly over several steps). The
// constructor matches every run (one access per node for the request),
// places what is cached in `kv` at rows row0 + plan row, at the plan's
// positions, and pins it; prefill() is the pass to compute, in plan rows
// (the caller shifts them to where the assembly sits when it runs). After a
// pass that is not the final one, next_pass() inserts the runs and makes the
// second pass. finish() inserts the runs from `kv` (unless done), the
// assembly now at row0 (it may have moved in between), and releases the
// pins; the lease releases them on every other way out too (an exception, a
// cancel). The plan must outlive the execution.
// Pieces the index is still reading from disk layer by layer are placed
// from the first pass's layer hook, each layer just before its attention
// (the pass then runs whole), and become their nodes' when it ends; a bad
// layer throws LayerLoadError from the pass, next_pass or finish.
class PlanExecution {
 public:
  // read_remote: false when the request's spans were fetched ahead
  // (RadixIndex::prefetch): the remote store is not read again on the way in.
  PlanExecution(const RequestPlan& plan, RadixIndex& index, KvCache& kv, int64_t row0,
                bool read_remote = true);
  const PrefillPlan& prefill() const { return prefill_; }
  // The current pass gives the answer's first logits (and is the last).
  bool final_pass() const { return last_; }
  // A pass with a layer hook or attention statistics runs whole, in one
  // forward pass.
  bool whole_pass() const { return prefill_.hook || !prefill_.stats_queries.empty(); }
  // The current pass places pieces still being read from disk.
  bool loading() const { return !loads_.empty(); }
  // After a pass that is not the final one: makes the next.
  void next_pass(KvCache& kv, int64_t row0, const PassResult& done);
  // logits: of the last prompt token.
  PrefillReport finish(KvCache& kv, int64_t row0, std::vector<float> logits, const PassResult& done);
  // A one-pass prefill stopped after its first n_computed queries (cancelled
  // or preempted): the runs' leading tokens whose rows are all computed or
  // placed, cut at a stop, go into the index as finish() would put them, so
  // what was computed is found again. Returns the tokens inserted (counted
  // per run, placed ones included); 0 for multi-pass plans and passes with
  // hooks, whose rows are not final before the end.
  int64_t keep_computed(const KvCache& kv, int64_t row0, int64_t n_computed, double ms_per_token);

 private:
  // A run's match, placed at rows row0 + plan row (pieces in memory now,
  // pieces still loading recorded in layered_).
  void place_match(const RadixIndex::Match& match, const CacheRun& run, int64_t row0,
                   std::span<const int32_t> positions, KvCache& kv);
  // Places layers [layers_placed_, layer_end) of the loading pieces, waiting
  // for them.
  void place_layers(KvCache& kv, int64_t row0, int layer_end);
  // The first pass places the loading pieces' layers from its hook.
  void hook_layered_placement();
  // After the first pass: every layer placed, the loads adopted by the
  // index. Returns the time the pass waited for layers.
  double settle_layered(KvCache& kv, int64_t row0);
  // What every pass's end does first: settles the loads, tells the index
  // the pass's time per token.
  void after_pass(KvCache& kv, int64_t row0, const PassResult& done);
  void insert_runs(const KvCache& kv, int64_t row0, double ms_per_token, RunInsert when);
  void set_pass(PassPlan pass, std::span<const int32_t> positions);
  void after_fill(KvCache& kv, int64_t row0, double ms_per_token);
  const AttentionMass* probed(const PassResult& done) const;

  const RequestPlan& plan_;
  RadixIndex& index_;
  PinLease lease_;
  std::vector<bool> placed_;         // plan rows placed from the index
  std::vector<uint64_t> placed_ns_;  // the namespace each placed row came from
  std::vector<int8_t> placed_tier_;  // the Tier each placed row's KV was found in
  int done_ = 0;                     // passes made by plan.next_pass
  bool filling_ = false;             // the current pass fills the runs (plan.next_pass follows)
  bool last_ = false;
  int n_layer_ = 0;
  int64_t layer_tokens_ = 0;  // (token, layer) pairs computed by passes done and by hooks so far
  PrefillPlan prefill_;
  PrefillReport report_;
  struct LayeredPlacement {
    std::shared_ptr<LayerLoader> loader;
    RadixIndex::NodeId node = -1;
    int64_t from = 0, n = 0, row = 0;  // span tokens [from, from + n) at plan rows row...
    std::vector<int32_t> positions;
  };
  std::vector<LayeredPlacement> layered_;
  struct LayeredLoad {
    std::shared_ptr<LayerLoader> loader;
    RadixIndex::NodeId node = -1;
  };
  std::vector<LayeredLoad> loads_;  // every load of the matches, in match order
  int layers_placed_ = 0;
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
  // What a strategy keeps beside the KV it stores (Cache-Craft's variant
  // metadata), saved into and loaded from a persistent tier's directory so
  // the next process finds it with the KV. Load returns the records dropped
  // as unreadable. Default: nothing to keep.
  virtual void save_state(const std::filesystem::path& /*dir*/) const {}
  virtual size_t load_state(const std::filesystem::path& /*dir*/) { return 0; }

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
// The index may be shared by several strategies; their keys never collide,
// except where the same KV is meant (the system prompt as a prefix).
std::unique_ptr<Strategy> make_strategy(std::string_view name, RadixIndex& index, const Model& model,
                                        DType kv_type, const StrategyOptions& options = {});
// The same keyed by a model fingerprint alone (what the simulator plans with).
std::unique_ptr<Strategy> make_strategy(std::string_view name, RadixIndex& index, uint64_t model_fingerprint,
                                        DType kv_type, const StrategyOptions& options = {});
std::vector<std::string> strategy_names();

}  // namespace depcache

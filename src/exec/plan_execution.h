#pragma once
// The executor: the one place a plan takes effect (PlanExecution, inside the
// engine's batches).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "exec/forward.h"
#include "exec/kv_assembly.h"
#include "exec/plan.h"
#include "kv/pin_lease.h"
#include "kv/radix_index.h"
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
  PlanExecution(const RequestPlan& plan, RadixIndex& index, KvAssembly& kv, int64_t row0,
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
  void next_pass(KvAssembly& kv, int64_t row0, const PassResult& done);
  // logits: of the last prompt token.
  PrefillReport finish(KvAssembly& kv, int64_t row0, std::vector<float> logits, const PassResult& done);
  // A one-pass prefill stopped after its first n_computed queries (cancelled
  // or preempted): the runs' leading tokens whose rows are all computed or
  // placed, cut at a stop, go into the index as finish() would put them, so
  // what was computed is found again. Returns the tokens inserted (counted
  // per run, placed ones included); 0 for multi-pass plans and passes with
  // hooks, whose rows are not final before the end.
  int64_t keep_computed(const KvAssembly& kv, int64_t row0, int64_t n_computed, double ms_per_token);

 private:
  // A run's match, placed at rows row0 + plan row (pieces in memory now,
  // pieces still loading recorded in layered_).
  void place_match(const RadixIndex::Match& match, const CacheRun& run, int64_t row0,
                   std::span<const int32_t> positions, KvAssembly& kv);
  // Places layers [layers_placed_, layer_end) of the loading pieces, waiting
  // for them.
  void place_layers(KvAssembly& kv, int64_t row0, int layer_end);
  // The first pass places the loading pieces' layers from its hook.
  void hook_layered_placement();
  // After the first pass: every layer placed, the loads adopted by the
  // index. Returns the time the pass waited for layers.
  double settle_layered(KvAssembly& kv, int64_t row0);
  // What every pass's end does first: settles the loads, tells the index
  // the pass's time per token.
  void after_pass(KvAssembly& kv, int64_t row0, const PassResult& done);
  void insert_runs(const KvAssembly& kv, int64_t row0, double ms_per_token, RunInsert when);
  void set_pass(PassPlan pass, std::span<const int32_t> positions);
  void after_fill(KvAssembly& kv, int64_t row0, double ms_per_token);
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

}  // namespace depcache

#pragma once
// A request's plan: what a planner (strategy/) decides and the executor
// (exec/plan_execution.h) carries out — the assembly's tokens and positions,
// the cacheable runs to look up and insert, the visibility of what is
// computed, and the passes of plans that compute in several. Also the one
// protocol between runs and the index (match_run, insert_run) that the
// executor and the simulator share.
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "compute/attention.h"
#include "exec/forward.h"
#include "exec/kv_assembly.h"
#include "kv/radix_index.h"

namespace depcache {

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
  const KvAssembly& kv;
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
// nothing; the engine's PlanExecution does both.
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

// The plan of a sequence resumed after preemption: its prompt, then the
// tokens it generated, which see what they saw when they were decoded
// (every earlier row of the sequence) at the positions they had. The last
// one's logits give the next token.
RequestPlan with_generated(const RequestPlan& plan, std::span<const int32_t> generated);

}  // namespace depcache

#pragma once
// The cache simulator: replays a request stream through the real radix index
// and replacement policies with virtual nodes (token counts, no K/V and no
// model), keyed exactly as a strategy keys them (depcache by default), with an optional
// cache-aware scheduler over a pending-request window.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "prompt/dep_prompt.h"
#include "prompt/prompt_parts.h"
#include "strategy/scheduler.h"
#include "strategy/strategy.h"

namespace depcache {

struct SimulationOptions {
  std::string policy = "lru";  // see make_policy
  // fifo, lpm (longest prefix match first), lsp (longest shared prefix
  // groups), ragcache (highest cached / to-compute ratio first); the
  // starvation bound: a request passed over this often goes next.
  SchedulerOptions scheduler;
  int64_t capacity_tokens = 0;  // index budget (the hot tier), in tokens of KV
  int64_t host_tokens = 0;      // a host tier below it (0: none)
  bool swap_out_once = false;   // the host tier keeps copies (RAGCache)
  size_t window = 32;           // pending requests the scheduler and LACR's lookahead see (Admission)
  double lacr_alpha = 0.2;
  PositionScheme scheme = PositionScheme::Depth;
  // PGDSF's T(cached, fresh): the prefill cost table profiled on the engine
  // (required by pgdsf, which ranks by it; unused by the other policies).
  std::function<double(int64_t cached, int64_t fresh)> cost_model;
};

struct SimulationResult {
  size_t n_requests = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  // Token-level hit rate, DepCache's definition: cached / prompt tokens per
  // request, averaged over requests.
  double token_hit_rate = 0;
  // Document (item) hit rate, RAGCache's: context items whose every token was
  // cached, over all context items served.
  double item_hit_rate = 0;
  int64_t evicted_nodes = 0;
  int64_t swapped_out_tokens = 0;  // copied from the hot tier to the host tier
  int64_t swap_outs_saved = 0;     // hot evictions that found a host copy
  std::vector<size_t> order;       // requests in the order served
};

// A request as the simulator replays it: the runs its strategy looks up and
// inserts (a run's segment names the context item it belongs to, -1 none)
// and its prompt length.
struct SimulatedRequest {
  std::vector<CacheRun> runs;
  int64_t tokens = 0;
  // Rows [begin, end) of each context item in a flat prompt; empty: the
  // items are the runs' segments.
  std::vector<std::pair<int64_t, int64_t>> item_rows{};
};

// Each request as `strategy` (one of strategy_names()) plans it, keyed as the
// engine keys it for one model.
std::vector<SimulatedRequest> simulated_requests(const std::vector<PromptParts>& parts,
                                                 std::string_view strategy, PositionScheme scheme);

SimulationResult simulate(const std::vector<SimulatedRequest>& requests, const SimulationOptions& options);
// The depcache strategy's requests (options.scheme).
SimulationResult simulate(const std::vector<DepPrompt>& prompts, const SimulationOptions& options);

// Tokens of KV a cache must hold to keep every distinct run of the stream
// (the merged tries of all requests): the base for relative capacities.
int64_t distinct_kv_tokens(const std::vector<SimulatedRequest>& requests);
int64_t distinct_kv_tokens(const std::vector<DepPrompt>& prompts, PositionScheme scheme);

}  // namespace depcache

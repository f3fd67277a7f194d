#pragma once
// Chunk reuse: every context item of a request (a document, or an entity's
// relation paths) is a chunk whose KV is computed as if alone after the
// system prompt, stored by content (the index's namespace holds the model,
// the KV type and the system prompt; the chunk's tokens are the key) and
// placed at any position with its keys rotated there. What the cached rows
// never saw is attention to the chunks before them; the strategies differ in
// how much of it they restore:
//   fullreuse:  nothing (TurboRAG-style block-diagonal reuse), the lower bound
//   cacheblend: every chunk token in layers 0-1, then the fraction whose K/V
//               moved most at layer 1 (CacheBlend's deviation) to the end
//   fusionrag:  the fraction the question attends to most in the last layer
//               of a first pass over the placed chunks (FusionRAG's online
//               step), recomputed by sparse prefill
// A chunk missed by the lookup is computed alone in the first pass and
// stored before anything is recomputed, so what is stored never depends on
// the request it came with.
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "compute/attention.h"
#include "strategy/strategy.h"

namespace depcache {

// Where the parts sit in the flat prompt: the system prompt, one chunk per
// context item (its paths in order), and the rest (text, task).
struct ChunkLayout {
  RowRange system;
  std::vector<RowRange> chunks;
  RowRange tail;
  int64_t chunk_tokens() const;
};
ChunkLayout chunk_layout(const PromptParts& parts);

// Indices (ascending) of the ceil(ratio * n) highest scores; ties go to the
// earlier index, a NaN score counts as the highest.
std::vector<int64_t> top_fraction(std::span<const double> scores, double ratio);

// Helpers of the chunk planners.
std::vector<int64_t> rows_of(std::span<const RowRange> ranges);  // ascending
// One layer of a probe ([query][target]): each of n_targets targets' mass
// summed over the queries from first_query on (a query not computed in that
// layer adds nothing).
std::vector<double> summed_mass(const std::vector<std::vector<double>>& layer, size_t first_query,
                                size_t n_targets);
// A last pass (or not) over chunk rows `picked` (ascending) and the tail:
// each sees every row up to its own, the chunk rows not picked holding what
// was placed there and the picked ones what they compute now.
PassPlan recompute_pass(std::vector<int64_t> picked, RowRange tail, bool last);
// The run of prompt rows r (their tokens of the flat prompt `tokens`).
CacheRun run_of(const std::vector<int32_t>& tokens, uint64_t ns, RowRange r, int32_t item, RunInsert insert);
// Where a kind of chunk run lives: under the model, the KV type and the
// system prompt (what a chunk's KV depends on besides itself).
uint64_t chunk_namespace(const PromptParts& parts, uint64_t model_fingerprint, DType kv_type,
                         std::string_view kind);

enum class ChunkRecompute { None, CacheBlend, FusionRag };

// The layer whose K/V deviation CacheBlend ranks tokens by (every chunk token
// is recomputed up to and including it).
inline constexpr int kCacheBlendSelectLayer = 1;

// Options: reuse, realign (false: chunks keep the positions they were
// computed at, Cache-Craft's "no RoPE fix" ablation) and recompute_ratio.
// The system prompt is stored where prefix reuse stores it (it is the
// prefix of both). fusionrag looks up a chunk's fused cache first and, on a
// miss, its plain one (FusionRAG's alternative path).
std::unique_ptr<Strategy> make_chunk_strategy(std::string_view name, ChunkRecompute recompute,
                                              uint64_t model_fingerprint, DType kv_type,
                                              const StrategyOptions& options);

// FusionRAG's offline step as a plan: the system prompt, the neighbour
// chunks (parts.items but the last) each computed alone (and stored so),
// then the last item, the chunk to fuse, computed over all of them at the
// next positions; its rows are stored as its fused cache, which fusionrag
// finds before the plain one. parts.text and parts.task must be empty.
RequestPlan fusion_plan(const PromptParts& parts, uint64_t model_fingerprint, DType kv_type);

// The run a chunk's fused cache is looked up (and stored) as.
CacheRun fused_run(const PromptParts& parts, size_t item, uint64_t model_fingerprint, DType kv_type);

}  // namespace depcache

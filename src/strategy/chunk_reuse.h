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

enum class ChunkRecompute { None, CacheBlend, FusionRag };

// The layer whose K/V deviation CacheBlend ranks tokens by (every chunk token
// is recomputed up to and including it).
inline constexpr int kCacheBlendSelectLayer = 1;

// prefix_ns: the flat strategies' namespace (the system prompt is the prefix
// of both); chunk_ns: the namespace chunks are stored under, before the
// system prompt is mixed in. Options: reuse, realign (false: chunks keep the
// positions they were computed at, Cache-Craft's "no RoPE fix" ablation) and
// recompute_ratio.
std::unique_ptr<Strategy> make_chunk_strategy(std::string_view name, ChunkRecompute recompute,
                                              RadixIndex& index, uint64_t prefix_ns, uint64_t chunk_ns,
                                              const StrategyOptions& options);

}  // namespace depcache

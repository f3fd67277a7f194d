#pragma once
// FusionRAG's offline step over the chunks a request stream carries: each
// distinct chunk computed after its most similar chunks (BM25 with the
// chunk as the query) — from the corpus, as the paper does, or from the
// stream itself — and stored in the engine's index as its fused cache,
// which the fusionrag strategy finds before the chunk's plain cache.
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "retrieval/rag_request.h"

namespace depcache {

struct ChunkFusionOptions {
  size_t neighbours = 10;  // similar chunks each chunk is computed after
  size_t limit = 0;        // at most this many chunks, in order of first appearance (0: all)
  // Where neighbours are searched: the chunks of these requests (a corpus's
  // chunks, one request each); empty: the stream's own chunks. A chunk is
  // never its own neighbour (same text).
  std::vector<RagRequest> neighbour_pool;
};

struct ChunkFusionReport {
  size_t requests = 0, chunks = 0;  // distinct chunks of the stream
  size_t candidates = 0;            // distinct chunks neighbours were searched among
  size_t fused = 0, present = 0;    // computed now; found fused already
  size_t too_long = 0;              // alone longer than the context: not fused
  int64_t neighbours = 0;           // summed over the chunks fused
  int64_t computed_tokens = 0;
  double seconds = 0;  // computing
};

// Fuses the stream's chunks on `engine` (its model and KV type key them);
// progress(done, total) after each chunk.
ChunkFusionReport fuse_chunks(Engine& engine, const Model& model, DType kv_type,
                              const std::vector<RagRequest>& reqs, const Tokenizer& tok,
                              const ChunkFusionOptions& o,
                              const std::function<void(size_t done, size_t total)>& progress = {});

}  // namespace depcache

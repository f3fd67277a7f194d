#pragma once
// A request stream as `run` replays it: arrival times (the file's, scaled,
// or Poisson), SubGCache's clustered batches in the order they are served,
// the form the requests show their graph in, every request's prompt parts
// and the KV rows the largest needs.
#include <cstdint>
#include <string>
#include <vector>

#include "model/rag_wrapper.h"
#include "model/tokenizer.h"
#include "prompt/prompt_parts.h"
#include "retrieval/rag_request.h"
#include "strategy/subgcache.h"

namespace depcache {

struct StreamOptions {
  size_t limit = 0;        // at most this many requests (0: all)
  double rate = 0;         // > 0: Poisson arrivals at this many requests/s
  double rate_scale = 1;   // else the file's arrival times divided by this
  uint64_t seed = 1;       // of the Poisson arrivals
  bool subgcache = false;  // SubGCache is in the run: its batches are clustered
  SubgcacheOptions subgcache_options;
  // How requests with entities show their graph: paths, csv (the request's
  // subgraph as G-Retriever CSV, SubGCache's form) or auto (csv when
  // SubGCache is in the run, so every strategy sees the same form).
  std::string graph_format = "auto";
};

struct Stream {
  std::vector<RagRequest> requests;   // in arrival order
  std::vector<RagRequest> warmup;     // served first, unmeasured
  SubgcachePlan subgcache;            // with StreamOptions::subgcache
  std::vector<RagRequest> clustered;  // SubGCache's rewritten queries, in the order served
  std::vector<PromptParts> parts, clustered_parts, warmup_parts;
  // KV rows of the largest request (prompt, flat or merged, and the
  // generated tokens), which one, and the sum over the stream.
  int64_t largest_rows = 0, total_rows = 0;
  std::string largest;
};

Stream prepare_stream(std::vector<RagRequest> requests, std::vector<RagRequest> warmup,
                      const StreamOptions& o, const Tokenizer& tok, const RagWrapper& tmpl, int max_tokens);

// Rows of the KV pool a replay of `s` runs with: `ctx` when given (> 0),
// else every request's rows, at most 8x the largest request's and at least
// those. LimitExceeded when the largest request needs more than `ctx`.
int64_t pool_rows(const Stream& s, int64_t ctx, int max_tokens);

}  // namespace depcache

#pragma once
// FusionRAG's offline step, checked before it is stored: fusionrag serves a
// chunk's fused cache in place of its plain one, so a fused cache that moves
// the answers further from full attention than the plain one does must not
// be stored. The check fuses the chunks of the stream's first requests on an
// engine of its own, serves those requests with the fused caches and, on
// another engine, without them, and compares both with full attention.
#include <cstddef>
#include <memory>
#include <vector>

#include "engine/chunk_fusion.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "retrieval/rag_request.h"

namespace depcache {

struct FusionCheckOptions {
  size_t requests = 16;  // the stream's first requests
  int tokens = 8;        // greedy tokens compared per request
};

// One side's agreement with full attention over the checked requests.
struct FusionAgreement {
  size_t first_token = 0;  // greedy first tokens equal to full attention's
  size_t identical = 0;    // whole greedy continuations equal
  double kl = 0;           // mean KL(full || side) of the first-token distributions, nats
};

struct FusionCheck {
  size_t requests = 0;
  FusionAgreement fused, plain;
  // Fewer first tokens agree with full attention, or as many and fewer whole
  // continuations: the fused caches answer worse than the plain ones.
  bool fused_worse() const;
};

// engine: the options the fused caches are made and served with (its tiers
// are not used: the check stores nothing); fusion: the offline step's, its
// neighbour pool the stream itself when empty.
FusionCheck check_fusion(const std::shared_ptr<const Model>& model, const EngineOptions& engine,
                         const std::vector<RagRequest>& stream, const Tokenizer& tok,
                         const ChunkFusionOptions& fusion, const FusionCheckOptions& options);

}  // namespace depcache

#pragma once
// One strategy over a prepared request stream, on an engine of its own with
// the strategy's profile under the command line's options and its lower
// tiers: what `run` and `eval` replay.
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_args.h"
#include "eval/replay.h"
#include "eval/stream.h"
#include "model/model.h"

namespace depcache {

// reqs[i]'s prompt is parts[i]; full: full attention's answers (fidelity);
// warmup: served first, unmeasured. Prints the engine's summary line.
StrategyRun run_strategy(const std::string& name, const std::vector<RagRequest>& reqs,
                         const std::vector<PromptParts>& parts, const std::shared_ptr<const Model>& model,
                         const EngineArgs& args, const ReplayOptions& replay_options, int64_t pool_rows,
                         bool dependency, const std::vector<FullAnswer>* full = nullptr,
                         const std::vector<PromptParts>* warmup = nullptr);

// SubGCache: the stream's clustered queries served in cluster order (its
// warm-up first), the rows put back in the stream's order; prints the
// clustering's cost. full: in the stream's order.
StrategyRun run_clustered(const Stream& s, const std::shared_ptr<const Model>& model, const EngineArgs& args,
                          const ReplayOptions& replay_options, const SubgcacheOptions& clustering,
                          int64_t pool_rows, bool dependency, const std::vector<FullAnswer>* full = nullptr);

}  // namespace depcache

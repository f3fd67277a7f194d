#include "eval/strategy_run.h"

#include <fmt/format.h>

#include "engine/engine_tiers.h"
#include "strategy/strategy.h"
#include "strategy/subgcache.h"

namespace depcache {

StrategyRun run_strategy(const std::string& name, const std::vector<RagRequest>& reqs,
                         const std::vector<PromptParts>& parts, const std::shared_ptr<const Model>& model,
                         const EngineArgs& args, const ReplayOptions& replay_options, int64_t pool_rows,
                         bool dependency, const std::vector<FullAnswer>* full,
                         const std::vector<PromptParts>* warmup) {
  // SubGCache's queries arrive rewritten (their cluster's representative
  // subgraph as context, in cluster order): the engine reuses it as a prefix.
  const std::string_view strategy = engine_strategy(name);
  const ResolvedEngine re = resolve_engine(args, name, model->config(), pool_rows, dependency);
  fmt::print("[{}] {}\n", name, re.summary);
  Engine engine(model, re.engine);
  // Lower tiers: the stores outlive nothing but this run.
  EngineTiers tiers(engine, re.tiers, fmt::format("[{}] ", name));
  if (name != "full") profile_costs_if_needed(engine, re, fmt::format("[{}] ", name));
  StrategyRun run = replay(engine, name, strategy, reqs, parts, replay_options, full, warmup);
  run.tiered = re.tiers.any();
  if (tiers.persist()) run.stats = engine.index().stats();
  return run;
}

StrategyRun run_clustered(const Stream& s, const std::shared_ptr<const Model>& model, const EngineArgs& args,
                          const ReplayOptions& replay_options, const SubgcacheOptions& so, int64_t pool_rows,
                          bool dependency, const std::vector<FullAnswer>* full) {
  std::vector<FullAnswer> full_in_order;
  if (full)
    for (size_t i : s.subgcache.order) full_in_order.push_back((*full)[i]);
  StrategyRun run =
      run_strategy(std::string(kSubgcache), s.clustered, s.clustered_parts, model, args, replay_options,
                   pool_rows, dependency, full ? &full_in_order : nullptr, &s.warmup_parts);
  std::vector<RequestRow> rows(run.rows.size());
  for (size_t k = 0; k < s.subgcache.order.size(); ++k) rows[s.subgcache.order[k]] = std::move(run.rows[k]);
  run.rows = std::move(rows);
  const double clustering_s = s.subgcache.clustering_ms / 1000.0;
  fmt::print(
      "subgcache: {} queries in {} batches of up to {}, {} clusters ({} linkage, {} embedding); "
      "clustering {:.1f} ms ({:.2f}% of its run's {:.1f} s)\n",
      s.requests.size(), (s.requests.size() + so.batch - 1) / so.batch, so.batch, s.subgcache.n_clusters,
      linkage_name(so.linkage), so.embedding == SubgraphEmbedding::Text ? "text" : "ids",
      s.subgcache.clustering_ms, 100.0 * clustering_s / std::max(run.wall_s + clustering_s, 1e-9),
      run.wall_s);
  return run;
}

}  // namespace depcache

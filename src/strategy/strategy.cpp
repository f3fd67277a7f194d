#include "strategy/strategy.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "exec/visibility.h"
#include "strategy/cache_craft.h"
#include "strategy/chunk_reuse.h"
#include "strategy/dependency_visibility.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/timing.h"

namespace depcache {
namespace {

uint64_t hash_ints(uint64_t h, std::span<const int32_t> v) { return hash_bytes(v.data(), v.size_bytes(), h); }

// The flat prompt, causal, with the longest cached prefix placed; without
// reuse this is plain full prefill (the `full` strategy). As a knowledge
// tree (`ragcache`) the run is the system prompt and the documents, with a
// stop after each: the question is never stored and a document is reused
// whole or not at all.
class FlatStrategy final : public Strategy {
 public:
  FlatStrategy(std::string name, uint64_t ns, bool reuse, bool knowledge_tree)
      : Strategy(reuse), name_(std::move(name)), ns_(ns), knowledge_tree_(knowledge_tree) {}
  std::string_view name() const override { return name_; }
  RequestPlan plan(const PromptParts& parts) const override {
    RequestPlan p;
    p.tokens = parts.flat();
    const auto n = static_cast<int64_t>(p.tokens.size());
    p.flat_tokens = n;
    for (int64_t t = 0; t < n; ++t) p.positions.push_back(static_cast<int32_t>(t));
    CacheRun run{ns_, p.tokens, {}, -1};
    if (knowledge_tree_) {
      auto end = static_cast<int64_t>(parts.system.size());
      if (end > 0) run.stops.push_back(end);
      for (const auto& [begin, item_end] : parts.flat_item_ranges()) {
        end = item_end;
        if (run.stops.empty() || run.stops.back() < end) run.stops.push_back(end);
      }
      run.tokens.resize(static_cast<size_t>(end));
    }
    for (int64_t t = 0; t < static_cast<int64_t>(run.tokens.size()); ++t) run.rows.push_back(t);
    if (reuse() && !run.tokens.empty()) p.runs.push_back(std::move(run));
    // What is placed is a prefix: the rest is a causal chain after it.
    p.visibility = [](std::span<const int64_t> computed) {
      return causal_chain(static_cast<int64_t>(computed.size()), computed.front());
    };
    return p;
  }

 private:
  std::string name_;
  uint64_t ns_;
  bool knowledge_tree_;
};

class DepCacheStrategy final : public Strategy {
 public:
  DepCacheStrategy(uint64_t ns, const StrategyOptions& options)
      : Strategy(options.reuse),
        ns_(ns),
        scheme_(options.scheme),
        tree_context_(options.tree_context),
        realign_(options.realign) {}
  std::string_view name() const override { return "depcache"; }
  RequestPlan plan(const PromptParts& parts) const override {
    auto prompt = std::make_shared<const DepPrompt>(parts.dep_prompt(tree_context_));
    RequestPlan p;
    p.tokens = prompt->tokens();
    p.positions = prompt->positions(scheme_);
    p.flat_tokens = parts.n_flat_tokens();
    p.realign = realign_;
    if (reuse()) p.runs = dependency_runs(*prompt, ns_, scheme_);
    p.visibility = [prompt](std::span<const int64_t> computed) { return dependency_dag(*prompt, computed); };
    return p;
  }

 private:
  uint64_t ns_;
  PositionScheme scheme_;
  TreeContext tree_context_;
  bool realign_;
};

}  // namespace

uint64_t strategy_namespace(uint64_t fingerprint, DType kv_type, std::string_view kind) {
  uint64_t h = hash_bytes(&fingerprint, sizeof fingerprint);
  const auto t = static_cast<int32_t>(kv_type);
  h = hash_bytes(&t, sizeof t, h);
  return hash_string(kind, h);
}

std::vector<CacheRun> dependency_runs(const DepPrompt& prompt, uint64_t ns, PositionScheme scheme) {
  std::vector<CacheRun> runs;
  const auto& tokens = prompt.tokens();
  // The leading linear segments (system, and for plain-text requests the
  // text) are a causal prefix of the prompt: one run from its start.
  int32_t lead_end = 0;
  for (const PromptSegment& seg : prompt.segments()) {
    if (seg.kind != SegmentKind::Linear || seg.tokens.begin != lead_end) break;
    lead_end = seg.tokens.end;
  }
  if (lead_end > 0) {
    CacheRun run{hash_string("lead", ns), {tokens.begin(), tokens.begin() + lead_end}, {}, -1};
    for (int64_t r = 0; r < lead_end; ++r) run.rows.push_back(r);
    runs.push_back(std::move(run));
  }
  // Each root-to-leaf path of each tree, matched from the tree's root under
  // the segments the tree depends on and the scheme. Under the depth scheme
  // the root's position follows from those segments, so a match is exact
  // (up to float rounding); under the sequential and stacked schemes a
  // subtree is reused wherever it moves, its keys rotated to the new
  // positions — approximate by design unless the tree and its offset are
  // unchanged, or the tree sees nothing but itself (TreeContext::None) and
  // moved whole: its KV depends on distances inside it alone, so the
  // rotation is exact wherever the matched nodes kept theirs.
  std::vector<bool> has_child(prompt.nodes().size(), false);
  for (const PromptNode& node : prompt.nodes())
    if (node.parent >= 0) has_child[node.parent] = true;
  const auto scheme_id = static_cast<int32_t>(scheme);
  for (int32_t si = 0; si < static_cast<int32_t>(prompt.segments().size()); ++si) {
    const PromptSegment& seg = prompt.segments()[si];
    if (seg.kind != SegmentKind::Tree) continue;
    // What the tree saw keys it: the segments it depends on (none for a tree
    // alone, which keeps its keys apart from a tree that saw an empty one).
    uint64_t tree_ns = hash_bytes(&scheme_id, sizeof scheme_id, hash_string("tree", ns));
    for (int32_t dep : seg.depends_on) {
      const TokenRange d = prompt.segments()[dep].tokens;
      const int32_t size = d.size();
      tree_ns = hash_bytes(&size, sizeof size, tree_ns);  // keeps segment boundaries apart
      tree_ns = hash_ints(tree_ns, std::span<const int32_t>(tokens.data() + d.begin, d.size()));
    }
    for (int32_t node = seg.first_node; node < seg.first_node + seg.n_nodes; ++node) {
      if (has_child[node]) continue;
      CacheRun run{tree_ns, {}, {}, si};
      for (int32_t on_path : prompt.node_path(node)) {
        const TokenRange t = prompt.nodes()[on_path].tokens;
        for (int32_t r = t.begin; r < t.end; ++r) {
          run.tokens.push_back(tokens[r]);
          run.rows.push_back(r);
        }
      }
      runs.push_back(std::move(run));
    }
  }
  return runs;
}

PositionScheme default_position_scheme(const ModelConfig& config) {
  if (config.position_scheme.empty()) return kDefaultPositionScheme;
  const auto s = parse_position_scheme(config.position_scheme);
  if (!s)
    fail(ErrorKind::InvalidInput,
         "the model's {} is '{}', not a position scheme (depth, sequential, stacked)", kPositionSchemeKey,
         config.position_scheme);
  return *s;
}

TreeContext default_tree_context(const ModelConfig& config) {
  if (config.tree_context.empty()) return TreeContext::System;
  const auto c = parse_tree_context(config.tree_context);
  if (!c)
    fail(ErrorKind::InvalidInput, "the model's {} is '{}', not a tree context (system, none)",
         kTreeContextKey, config.tree_context);
  return *c;
}

std::vector<std::string> strategy_names() {
  return {"full", "prefix", "ragcache", "depcache", "fullreuse", "cacheblend", "fusionrag", "cachecraft"};
}

std::unique_ptr<Strategy> make_strategy(std::string_view name, const Model& model, DType kv_type,
                                        const StrategyOptions& options) {
  return make_strategy(name, model.fingerprint(), kv_type, options);
}

std::unique_ptr<Strategy> make_strategy(std::string_view name, uint64_t fp, DType kv_type,
                                        const StrategyOptions& options) {
  if (name == "full" || name == "prefix")
    return std::make_unique<FlatStrategy>(std::string(name), strategy_namespace(fp, kv_type, "prefix"),
                                          name == "prefix" && options.reuse, false);
  // Its own namespace: a knowledge tree's nodes end at documents, a prefix
  // tree's anywhere (sharing one tree would let either split the other's).
  if (name == "ragcache")
    return std::make_unique<FlatStrategy>(std::string(name), strategy_namespace(fp, kv_type, "ragcache"),
                                          options.reuse, true);
  if (name == "depcache")
    return std::make_unique<DepCacheStrategy>(strategy_namespace(fp, kv_type, "depcache"), options);
  if (name == "cachecraft") return make_cache_craft(fp, kv_type, options);
  const std::pair<std::string_view, ChunkRecompute> chunk[] = {{"fullreuse", ChunkRecompute::None},
                                                               {"cacheblend", ChunkRecompute::CacheBlend},
                                                               {"fusionrag", ChunkRecompute::FusionRag}};
  for (const auto& [chunk_name, recompute] : chunk)
    if (name == chunk_name) return make_chunk_strategy(name, recompute, fp, kv_type, options);
  fail(ErrorKind::InvalidInput, "unknown strategy '{}' (expected {})", name,
       fmt::join(strategy_names(), ", "));
}

}  // namespace depcache

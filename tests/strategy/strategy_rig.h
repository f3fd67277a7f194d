#pragma once
// What the planner tests run requests on: a model (random, with the built-in
// byte tokenizer, unless given) and an engine whose index the requests of a
// test share. Each request runs as production runs it: submitted to the
// engine, which plans it, places and computes it in its pool and offers its
// KV to the index, alone (run until it ends) and answering one token.
#include <memory>
#include <string>
#include <utility>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "exec/plan.h"
#include "kv/radix_index.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "strategy/strategy.h"
#include "test_support.h"

namespace depcache::test {

// An engine for the strategy tests: `rows` pool rows, a 64 MiB hot tier,
// strategies made with `strategy`.
inline EngineOptions strategy_engine_options(DType kv, const StrategyOptions& strategy, int64_t rows = 2048) {
  EngineOptions o = engine_options(kv);
  o.pool_rows = rows;
  o.cache_bytes = 64 << 20;
  o.strategy = strategy;
  return o;
}

struct StrategyRig {
  std::shared_ptr<const Model> model;
  Tokenizer tok;
  DType kv_type;
  StrategyOptions options;  // what the engine's strategies are made with
  Engine engine;
  RadixIndex& index;  // the engine's

  explicit StrategyRig(const std::string& preset = "tiny", DType kv = DType::F32,
                       const StrategyOptions& o = {})
      : StrategyRig(random_model(preset, DType::F32), Vocab::builtin_bytes(), kv, o) {}
  StrategyRig(std::shared_ptr<const Model> m, Vocab vocab, DType kv, const StrategyOptions& o,
              int64_t rows = 2048)
      : model(std::move(m)),
        tok(std::move(vocab)),
        kv_type(kv),
        options(o),
        engine(model, strategy_engine_options(kv, o, rows)),
        index(EngineTestPeer::index(engine)) {}

  // The request to its end; a failed one throws its error (Engine::wait).
  RequestResult finish(RequestId id) {
    RequestResult r = engine.wait(id);
    engine.forget(id);
    return r;
  }
  // `parts` under `strategy` with options `o`: the engine's own strategy
  // when `o` is what it was made with (CacheUse::None when only reuse is
  // off); otherwise (a ratio, an ablation) the strategy made with `o`,
  // planned as the engine plans and run as any other request.
  RequestResult answer(const std::string& strategy, const PromptParts& parts, const StrategyOptions& o,
                       const SamplingParams& sampling = greedy(1)) {
    if (same_options(o, options)) return finish(engine.submit(strategy, parts, sampling));
    StrategyOptions shared = o;
    shared.reuse = options.reuse;
    if (!o.reuse && options.reuse && same_options(shared, options))
      return finish(engine.submit(strategy, parts, sampling, {}, CacheUse::None));
    return answer(*make_strategy(strategy, engine.cache_fingerprint(), kv_type, o), parts, sampling);
  }
  // A strategy made outside the engine, planned as Engine::submit plans.
  RequestResult answer(const Strategy& strategy, const PromptParts& parts,
                       const SamplingParams& sampling = greedy(1)) {
    RequestPlan plan = strategy.plan(parts);
    scope_plan(plan, parts.cache_scope);
    return finish(engine.submit_plan(std::move(plan), sampling));
  }

  // The request under `strategy`, looking up and filling the shared index.
  PrefillReport run(const Strategy& strategy, const RagRequest& r, const RagWrapper& tmpl = {}) {
    return answer(strategy, make_prompt_parts(tok, r, tmpl)).report;
  }
  PrefillReport run(const std::string& strategy, const RagRequest& r, const StrategyOptions& o = {},
                    const RagWrapper& tmpl = {}) {
    return answer(strategy, make_prompt_parts(tok, r, tmpl), o).report;
  }
  // Full attention on the flat prompt, beside the shared index (nothing
  // looked up, nothing stored).
  PrefillReport full(const RagRequest& r) {
    return finish(engine.submit("full", make_prompt_parts(tok, r), greedy(1), {}, CacheUse::None)).report;
  }

  // Every field: which strategy options plan alike.
  static bool same_options(const StrategyOptions& a, const StrategyOptions& b) {
    return a.scheme == b.scheme && a.reuse == b.reuse && a.realign == b.realign &&
           a.tree_context == b.tree_context && a.recompute_ratio == b.recompute_ratio &&
           a.cachecraft_alpha == b.cachecraft_alpha && a.chunk_variants == b.chunk_variants &&
           a.focus_window == b.focus_window;
  }
};

}  // namespace depcache::test

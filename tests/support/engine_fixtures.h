#pragma once
// What the engine tests share: their engine settings, greedy sampling, and
// a request answered on an engine of its own (nothing reused from other
// requests), the reference batched runs are compared with.
#include <memory>
#include <optional>
#include <string_view>

#include "engine/engine.h"

namespace depcache {

// The engine's cache index as the engine's own code sees it: tests attach
// tiers and stores of their own making, and persist, through it.
struct EngineTestPeer {
  static RadixIndex& index(Engine& e) { return e.index_; }
  // A step's phases one by one (Engine::step runs them in this order).
  using StepBatch = Engine::StepBatch;
  using StepOutput = Engine::StepOutput;
  static Engine::StepBatch schedule(Engine& e) {
    e.prepare_step();
    return e.schedule();
  }
  static std::optional<Engine::StepOutput> run(Engine& e, const Engine::StepBatch& b) { return e.run(b); }
  static void commit(Engine& e, const Engine::StepBatch& b, const Engine::StepOutput& out) {
    e.commit(b, out);
  }
};

}  // namespace depcache

namespace depcache::test {

// A 2048-row pool, 2 threads, depth positions, reuse on.
inline EngineOptions engine_options(DType kv = DType::F32) {
  EngineOptions o;
  o.pool_rows = 2048;
  o.kv_type = kv;
  o.threads = 2;
  o.strategy = {PositionScheme::Depth, true};
  return o;
}

// n tokens exactly (no stop at end-of-generation), greedy.
inline SamplingParams greedy(int n) {
  SamplingParams s;
  s.max_tokens = n;
  s.stop_at_eog = false;
  return s;
}

inline RequestResult run_alone(const std::shared_ptr<const Model>& model, const EngineOptions& options,
                               std::string_view strategy, const PromptParts& parts,
                               const SamplingParams& sampling) {
  Engine e(model, options);
  const RequestId id = e.submit(strategy, parts, sampling);
  e.run_until_idle();
  return e.result(id);
}

}  // namespace depcache::test

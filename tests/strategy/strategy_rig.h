#pragma once
// What the planner tests run requests on: a random model with the built-in
// byte tokenizer, its forward pass, and one index the requests of a test
// share (each request on a fresh assembly, as apply_plan runs it).
#include <memory>
#include <string>

#include "exec/forward.h"
#include "exec/kv_assembly.h"
#include "kv/radix_index.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "strategy/strategy.h"
#include "test_support.h"
#include "util/thread_pool.h"

namespace depcache::test {

struct StrategyRig {
  std::shared_ptr<const Model> model;
  Tokenizer tok{Vocab::builtin_bytes()};
  ThreadPool pool{2};
  Forward fwd;
  RadixIndex index{64 << 20};
  DType kv_type;

  explicit StrategyRig(const std::string& preset = "tiny", DType kv = DType::F32)
      : model(random_model(preset, DType::F32)), fwd(model, pool), kv_type(kv) {}

  // The request under `strategy`, looking up and filling the shared index.
  PrefillReport run(const Strategy& strategy, const RagRequest& r, const PromptTemplate& tmpl = {}) {
    KvAssembly kv(model->config(), 2048, kv_type);
    return prefill(strategy, index, make_prompt_parts(tok, r, tmpl), kv, fwd);
  }
  PrefillReport run(const std::string& strategy, const RagRequest& r, const StrategyOptions& o = {},
                    const PromptTemplate& tmpl = {}) {
    return run(*make_strategy(strategy, *model, kv_type, o), r, tmpl);
  }
  // Full attention on the flat prompt, beside the shared index.
  PrefillReport full(const RagRequest& r) {
    KvAssembly kv(model->config(), 2048, kv_type);
    RadixIndex none(0);
    return prefill(*make_strategy("full", *model, kv_type), none, make_prompt_parts(tok, r), kv, fwd);
  }
};

}  // namespace depcache::test

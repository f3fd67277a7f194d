#include "eval/engine_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/engine.h"
#include "util/timing.h"

namespace depcache {

EngineBench::EngineBench(std::shared_ptr<const Model> model, const EngineBenchOptions& o)
    : model_(std::move(model)), o_(o), pick_(0, model_->config().n_vocab - 1) {}

double EngineBench::run(int64_t n_prompt, int n_tokens, int parallel) {
  EngineOptions eo;
  eo.pool_rows = (n_prompt + n_tokens) * parallel;
  eo.kv_type = o_.kv_type;
  eo.cache_bytes = 0;
  eo.batch_tokens = o_.ubatch;
  eo.threads = o_.threads;
  Engine engine(model_, eo);
  SamplingParams sampling;
  sampling.max_tokens = n_tokens;
  sampling.stop_at_eog = false;
  std::vector<RequestId> ids;
  for (int s = 0; s < parallel; ++s) {
    PromptParts parts;
    for (int64_t i = 0; i < n_prompt; ++i) parts.text.push_back(pick_(rng_));
    ids.push_back(engine.submit("full", std::move(parts), sampling));
  }
  Clock::time_point first = Clock::time_point::max(), last = Clock::time_point::min();
  for (RequestId id : ids) {
    const RequestResult& r = engine.wait(id);
    first = std::min(first, r.submitted);
    last = std::max(last, r.done);
  }
  return std::chrono::duration<double>(last - first).count();
}

std::string model_description(const Model& model) {
  const ModelConfig& c = model.config();
  std::vector<std::string_view> types;
  const LayerWeights& l0 = model.layers[0];
  for (const WeightMatrix* w : {&l0.wq, &l0.wk, &l0.wv, &l0.wo, &l0.w_gate, &l0.w_up, &l0.w_down})
    if (std::find(types.begin(), types.end(), dtype_info(w->type).name) == types.end())
      types.push_back(dtype_info(w->type).name);
  return fmt::format("{} {}L {}d {}", c.arch_name, c.n_layer, c.n_embd, fmt::join(types, "+"));
}

}  // namespace depcache

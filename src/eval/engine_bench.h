#pragma once
// Prompt-processing (pp) and generation (tg) runs through the engine, as
// `bench-model` times them and `eval` reports them.
#include <memory>
#include <random>
#include <string>

#include "compute/dtype.h"
#include "model/model.h"

namespace depcache {

struct EngineBenchOptions {
  DType kv_type = DType::F16;
  int ubatch = 512;  // prompt tokens per forward call
  int threads = 0;
};

// Each test runs through the engine, as every request does: one request of
// random tokens, computed without reuse, greedy. pp n: an n-token prompt in
// ubatch pieces, to its first token; tg n: a one-token prompt and n - 1
// more tokens, n forward passes of one token each; tg n with `parallel`
// sequences: that many such requests submitted together, decoding side by
// side (n forward passes of `parallel` tokens). Each returns seconds.
class EngineBench {
 public:
  EngineBench(std::shared_ptr<const Model> model, const EngineBenchOptions& o);
  double pp(int n) { return run(n, 1, 1); }
  double tg(int n, int parallel = 1) { return run(1, n, parallel); }

 private:
  double run(int64_t n_prompt, int n_tokens, int parallel);

  std::shared_ptr<const Model> model_;
  EngineBenchOptions o_;
  std::mt19937 rng_{1234};
  std::uniform_int_distribution<int32_t> pick_;
};

// The model as bench tables name it: architecture, layers, width and the
// matrix types of a layer (files that fall back to another type where rows
// do not fit the blocks show both, e.g. Q8_0+Q4_K).
std::string model_description(const Model& model);

}  // namespace depcache

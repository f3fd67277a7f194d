#pragma once
// The transformer forward pass of the Llama family (llama, qwen2): embed →
// per layer (norm, qkv, rope, attention, residual, norm, SwiGLU FFN,
// residual) → norm → logits. One pass serves batched prefill and decode.
#include <memory>
#include <span>
#include <vector>

#include "compute/ops.h"
#include "engine/kv_cache.h"
#include "model/model.h"

namespace depcache {

class ThreadPool;

enum class Logits { Last, All };

class Forward {
 public:
  Forward(std::shared_ptr<const Model> model, ThreadPool& pool);

  const Model& model() const { return *model_; }

  // Runs `tokens` at positions kv.n_past() onward, appends their K/V to `kv`
  // and writes logits ((1 or n_tokens) x n_vocab) to `logits`.
  void eval(std::span<const int32_t> tokens, KvCache& kv, Logits which, std::vector<float>& logits);

 private:
  void layer(int il, int64_t n, const int32_t* positions, KvCache& kv);

  std::shared_ptr<const Model> model_;
  ThreadPool& pool_;
  // Run state, grown to the largest batch seen.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_, proj_, matmul_scratch_;
  std::vector<int32_t> positions_;
  RopeTable rope_;  // angles of this batch's positions, shared by all layers
  std::vector<int64_t> n_visible_;
};

}  // namespace depcache

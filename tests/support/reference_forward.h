#pragma once
// A float64 forward pass written for clarity, not speed: every weight is
// dequantized with the float64 reference and every sum is in double. The
// engine is checked against it.
//
// Besides plain causal prompts it takes what dependency attention changes:
// each token's RoPE position and a rule for who sees whom, evaluated pair by
// pair. It shares no code with the engine's visibility lists, position
// schemes or attention kernels, so a test that builds the rule from a
// request's own structure checks those independently.
#include <cstdint>
#include <functional>
#include <vector>

#include "model/model.h"

namespace depcache::test {

// Whether token `query` attends to token `key` (indices into the prompt).
using SeesRule = std::function<bool(int64_t query, int64_t key)>;

struct ReferencePass {
  std::vector<double> logits;  // (n_tokens, n_vocab)
  // k[layer][token], v[layer][token]: the K (after RoPE) and V rows
  // (n_head_kv * head_dim) each token writes in each layer.
  std::vector<std::vector<std::vector<double>>> k, v;
};

// A model's weights in float64, row-major (n_out, n_in) as in GGUF: read
// from a loaded model, or set by a test (the trainer's gradient checks
// perturb them one at a time).
struct ReferenceWeights {
  ModelConfig config;
  struct Matrix {
    int64_t n_out = 0, n_in = 0;
    std::vector<double> w;
  };
  struct Layer {
    std::vector<double> attn_norm, ffn_norm, bq, bk, bv, q_norm, k_norm, attn_post_norm, ffn_post_norm;
    Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };
  Matrix tok_embd;  // (n_vocab, n_embd)
  std::vector<Layer> layers;
  std::vector<double> output_norm;
  Matrix output;  // (n_vocab, n_embd); a copy of tok_embd when tied

  static ReferenceWeights from_model(const Model& model);
};

ReferencePass reference_forward(const ReferenceWeights& weights, const std::vector<int32_t>& tokens,
                                const std::vector<int32_t>& positions, const SeesRule& sees);
ReferencePass reference_forward(const Model& model, const std::vector<int32_t>& tokens,
                                const std::vector<int32_t>& positions, const SeesRule& sees);

// Logits (n_tokens x n_vocab) for every position of `tokens`, causal.
std::vector<double> reference_logits(const Model& model, const std::vector<int32_t>& tokens);
// The same with the weights converted once (for several calls).
std::vector<double> reference_logits(const ReferenceWeights& weights, const std::vector<int32_t>& tokens);

}  // namespace depcache::test

#pragma once
// Forward and backward passes of a Llama model for training, under the same
// attention the engine serves with: each token has its RoPE position and a
// Visibility (the engine's lists of visible row ranges: a causal chain, or
// dependency attention built from a DepPrompt), so a model trained here is
// trained exactly as it is served.
//
// Matrix products go to BLAS (OpenBLAS, single-threaded, split over the
// thread pool), attention too (per sequence and head, dense with a mask);
// norms, RoPE and the loss run on the thread pool. Activations of every layer are kept for the
// backward pass, except the attention probabilities, which are recomputed
// from the saved log-sum-exp of each (query, head).
#include <cstdint>
#include <span>
#include <vector>

#include "compute/attention.h"
#include "compute/ops.h"
#include "train/params.h"

namespace depcache {

class ThreadPool;

// One sequence of a batch. Token i is query i and KV row i of `visibility`.
struct TrainSequence {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;  // RoPE position of each token
  Visibility visibility;
  // The token to predict from token i's output; -1: no loss at token i.
  std::vector<int32_t> targets;
};

// A causal sequence at positions 0..n-1 predicting each next token (the
// last token predicts nothing), with loss only where `loss` is true
// (empty: everywhere).
TrainSequence causal_sequence(std::vector<int32_t> tokens, const std::vector<bool>& loss = {});

struct LossSum {
  double sum = 0;         // cross-entropy summed over targets
  int64_t n_targets = 0;  // tokens with a target
  int64_t n_correct = 0;  // of them, whose highest logit is the target
  double mean() const { return n_targets ? sum / static_cast<double>(n_targets) : 0.0; }
};

class TrainGraph {
 public:
  explicit TrainGraph(ThreadPool& pool);

  // The batch's loss. With `grads` (the layout of `params`, which it adds
  // to), also the gradient of the mean loss over all of the batch's targets.
  LossSum run(const ParamSet& params, std::span<const TrainSequence> batch, ParamSet* grads);

  // Logits of every token of the last run, (n_tokens, n_vocab) in batch order.
  const std::vector<float>& logits() const { return logits_; }
  // Per token of the last run: whether its highest logit is its target
  // (false where it has none).
  const std::vector<char>& correct() const { return correct_; }

 private:
  struct LayerActs {
    std::vector<float> x_in, inv_rms1, xn1, q, k, v, attn, lse, x_mid, inv_rms2, xn2, gate, up;
  };
  // The backward pass's per-layer gradients, allocated once for all layers.
  struct BackwardBuffers {
    BackwardBuffers(const ModelShape& s, int64_t n, std::vector<float> dx_, std::vector<float> dxn_);
    std::vector<float> dx, dxn, dh, dgate, dup, h, sg, d_attn, dqv, dkv_k, dkv_v;
  };
  std::vector<int32_t> pack_batch(std::span<const TrainSequence> batch);
  void build_masks();
  void forward(const ParamSet& params);
  void forward_layer(const ParamSet& params, int il, std::vector<float>& x, std::vector<float>& tmp);
  LossSum compute_loss(bool gradient, std::vector<float>& dlogits);
  void backward(const ParamSet& params, std::vector<float>& dlogits, ParamSet& g);
  void backward_layer(const ParamSet& params, int il, ParamSet& g, BackwardBuffers& b);
  void attention_forward(LayerActs& a);
  void attention_backward(const LayerActs& a, const float* d_attn, float* dq, float* dk, float* dv);

  ThreadPool& pool_;
  // The batch in one: token t of sequence s is row seq_begin_[s] + t.
  ModelShape shape_;
  int64_t n_ = 0;
  std::vector<int64_t> seq_begin_;
  std::vector<int32_t> tokens_, targets_;
  Visibility vis_;
  // Per sequence, L x L: 0 where query i sees key j, −inf elsewhere.
  std::vector<float> masks_;
  std::vector<int64_t> mask_begin_;
  RopeTable rope_, unrope_;
  std::vector<LayerActs> acts_;
  std::vector<float> x_final_, inv_rms_final_, xn_final_, logits_;
  std::vector<char> correct_;
};

}  // namespace depcache

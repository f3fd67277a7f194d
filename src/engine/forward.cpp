#include "engine/forward.h"

#include "compute/attention.h"
#include "compute/ops.h"
#include "compute/quant.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {

Forward::Forward(std::shared_ptr<const Model> model, ThreadPool& pool)
    : model_(std::move(model)), pool_(pool) {}

void Forward::eval(std::span<const int32_t> tokens, KvCache& kv, Logits which, std::vector<float>& logits) {
  const ModelConfig& c = model_->config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) fail(ErrorKind::InvalidInput, "nothing to evaluate: empty token list");
  const int64_t pos0 = kv.n_past();
  if (pos0 + n > kv.n_ctx())
    fail(ErrorKind::LimitExceeded, "{} tokens after {} cached ones exceed the context size {}", n, pos0,
         kv.n_ctx());

  x_.resize(n * c.n_embd);
  xn_.resize(n * c.n_embd);
  q_.resize(n * c.n_head * c.head_dim);
  attn_.resize(q_.size());
  k_.resize(n * c.n_embd_kv());
  v_.resize(k_.size());
  gate_.resize(n * c.n_ff);
  up_.resize(gate_.size());
  proj_.resize(n * c.n_embd);
  positions_.resize(n);
  n_visible_.resize(n);

  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens[t];
    if (id < 0 || id >= c.n_vocab)
      fail(ErrorKind::InvalidInput, "token id {} is outside the vocabulary of {}", id, c.n_vocab);
    dequantize_row(model_->tok_embd.type, model_->tok_embd.row(id), x_.data() + t * c.n_embd, c.n_embd);
    positions_[t] = static_cast<int32_t>(pos0 + t);
    n_visible_[t] = pos0 + t + 1;  // causal: every earlier position and itself
  }

  rope_.build(positions_.data(), n, c.n_rot, c.rope_base);
  for (int il = 0; il < c.n_layer; ++il) layer(il, n, positions_.data(), kv);
  kv.set_n_past(pos0 + n);

  const int64_t first = which == Logits::Last ? n - 1 : 0;
  const int64_t n_out = n - first;
  rms_norm(x_.data() + first * c.n_embd, model_->output_norm.data(), xn_.data(), n_out, c.n_embd, c.rms_eps);
  logits.resize(n_out * c.n_vocab);
  matmul(model_->output, xn_.data(), n_out, logits.data(), pool_, matmul_scratch_);
}

void Forward::layer(int il, int64_t n, const int32_t* positions, KvCache& kv) {
  const ModelConfig& c = model_->config();
  const LayerWeights& w = model_->layers[il];
  const bool neox = c.rope_style == RopeStyle::Neox;

  // Attention block.
  rms_norm(x_.data(), w.attn_norm.data(), xn_.data(), n, c.n_embd, c.rms_eps);
  matmul(w.wq, xn_.data(), n, q_.data(), pool_, matmul_scratch_);
  matmul(w.wk, xn_.data(), n, k_.data(), pool_, matmul_scratch_);
  matmul(w.wv, xn_.data(), n, v_.data(), pool_, matmul_scratch_);
  if (c.qkv_bias) {
    add_bias(q_.data(), w.bq.data(), n, c.n_head * c.head_dim);
    add_bias(k_.data(), w.bk.data(), n, c.n_embd_kv());
    add_bias(v_.data(), w.bv.data(), n, c.n_embd_kv());
  }
  rope(q_.data(), n, c.n_head, c.head_dim, rope_, neox);
  rope(k_.data(), n, c.n_head_kv, c.head_dim, rope_, neox);
  kv.write(il, positions[0], k_.data(), v_.data(), n);
  attention(q_.data(), n, kv.layer(il), n_visible_.data(), c.n_head, c.n_head_kv, c.head_dim, attn_.data(),
            pool_);
  matmul(w.wo, attn_.data(), n, proj_.data(), pool_, matmul_scratch_);
  for (int64_t i = 0; i < n * c.n_embd; ++i) x_[i] += proj_[i];

  // Feed-forward block (SwiGLU).
  rms_norm(x_.data(), w.ffn_norm.data(), xn_.data(), n, c.n_embd, c.rms_eps);
  matmul(w.w_gate, xn_.data(), n, gate_.data(), pool_, matmul_scratch_);
  matmul(w.w_up, xn_.data(), n, up_.data(), pool_, matmul_scratch_);
  swiglu(gate_.data(), up_.data(), n * c.n_ff);
  matmul(w.w_down, gate_.data(), n, proj_.data(), pool_, matmul_scratch_);
  for (int64_t i = 0; i < n * c.n_embd; ++i) x_[i] += proj_[i];
}

}  // namespace depcache

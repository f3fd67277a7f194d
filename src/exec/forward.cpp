#include "exec/forward.h"

#include <algorithm>

#include "compute/attention.h"
#include "compute/dot.h"
#include "compute/ops.h"
#include "compute/quant.h"
#include "exec/visibility.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

// Keeps the rows of `x` (width w) whose batch index is in `keep`; both lists
// ascending and keep ⊆ from, so rows only move towards the front.
void compact_rows(std::vector<float>& x, int64_t w, const std::vector<int64_t>& from,
                  const std::vector<int64_t>& keep) {
  size_t j = 0;
  for (size_t i = 0; i < from.size() && j < keep.size(); ++i)
    if (from[i] == keep[j]) {
      if (i != j) std::copy_n(x.begin() + i * w, w, x.begin() + j * w);
      ++j;
    }
}

}  // namespace

Forward::Forward(std::shared_ptr<const Model> model, ThreadPool& pool)
    : model_(std::move(model)), pool_(pool) {}

PrefillResult Forward::prefill(const PrefillPlan& plan, KvAssembly& kv) {
  const ModelConfig& c = model_->config();
  const auto n = static_cast<int64_t>(plan.tokens.size());
  if (n == 0) fail(ErrorKind::InvalidInput, "nothing to evaluate: empty token list");
  if (static_cast<int64_t>(plan.positions.size()) != n || static_cast<int64_t>(plan.rows.size()) != n ||
      plan.visibility.n_queries() != n)
    fail(ErrorKind::Internal, "prefill plan: {} tokens, {} positions, {} rows, {} visibility queries", n,
         plan.positions.size(), plan.rows.size(), plan.visibility.n_queries());
  if (plan.visibility.max_row() > kv.n_ctx())
    fail(ErrorKind::LimitExceeded, "prefill plan reads KV row {} beyond the context size {}",
         plan.visibility.max_row() - 1, kv.n_ctx());
  if (!plan.last_layer.empty() && static_cast<int64_t>(plan.last_layer.size()) != n)
    fail(ErrorKind::Internal, "prefill plan: {} last layers for {} tokens", plan.last_layer.size(), n);
  const auto last_layer = [&](int64_t i) {
    return plan.last_layer.empty() ? c.n_layer - 1 : plan.last_layer[i];
  };
  for (int64_t i = 0; i < n; ++i) {
    if (plan.tokens[i] < 0 || plan.tokens[i] >= c.n_vocab)
      fail(ErrorKind::InvalidInput, "token id {} is outside the vocabulary of {}", plan.tokens[i], c.n_vocab);
    if (plan.rows[i] < 0 || plan.rows[i] >= kv.n_ctx())
      fail(ErrorKind::LimitExceeded, "KV row {} is outside the context size {}", plan.rows[i], kv.n_ctx());
    if (last_layer(i) < 0 || last_layer(i) >= c.n_layer)
      fail(ErrorKind::Internal, "prefill plan: token {} stops at layer {} of {}", i, last_layer(i),
           c.n_layer);
  }
  // Each group's queries must sit in the consecutive rows its causal run
  // reads, or they would write K/V to one row and attend from another.
  for (const QueryGroup& g : plan.visibility.groups())
    for (int64_t i = 0; i < g.count; ++i)
      if (plan.rows[g.first + i] != g.self_row + i)
        fail(ErrorKind::Internal,
             "prefill plan: token {} is at row {} but its visibility group expects row {}", g.first + i,
             plan.rows[g.first + i], g.self_row + i);
  for (int64_t i : plan.stats_queries)
    if (i < 0 || i >= n) fail(ErrorKind::Internal, "prefill plan: statistics asked for token {} of {}", i, n);
  for (int64_t i : plan.logits_for)
    if (i < 0 || i >= n || last_layer(i) != c.n_layer - 1)
      fail(ErrorKind::Internal, "prefill plan: logits asked for token {} that is not computed to the end", i);

  x_.resize(n * c.n_embd);
  for (int64_t t = 0; t < n; ++t)
    dequantize_row(model_->tok_embd.type, model_->tok_embd.row(plan.tokens[t]), x_.data() + t * c.n_embd,
                   c.n_embd);
  if (c.embd_scale != 1.0f)
    for (int64_t i = 0; i < n * c.n_embd; ++i) x_[i] *= c.embd_scale;
  active_.resize(n);
  for (int64_t t = 0; t < n; ++t) active_[t] = t;
  for (int64_t t = 0; t < n; ++t)
    kv.set_positions(plan.rows[t], std::span<const int32_t>(&plan.positions[t], 1));
  windowed_.reset();
  if (c.sliding_window > 0)
    windowed_ = within_window(plan.visibility, plan.positions, kv.positions(), c.sliding_window);

  PrefillResult result;
  result.active_per_layer.reserve(c.n_layer);
  if (!plan.stats_queries.empty()) result.attention_mass.assign(c.n_layer, {});
  for (int il = 0; il < c.n_layer; ++il) layer(il, plan, kv, result);

  // active_ now holds the tokens whose final hidden state was computed.
  const int64_t n_out = static_cast<int64_t>(plan.logits_for.size());
  xn_.resize(std::max<size_t>(xn_.size(), n_out * c.n_embd));
  for (int64_t r = 0; r < n_out; ++r) {
    const auto it = std::lower_bound(active_.begin(), active_.end(), plan.logits_for[r]);
    rms_norm(x_.data() + (it - active_.begin()) * c.n_embd, model_->output_norm.data(),
             xn_.data() + r * c.n_embd, 1, c.n_embd, c.rms_eps);
  }
  result.logits.resize(n_out * c.n_vocab);
  if (n_out > 0) matmul(model_->output, xn_.data(), n_out, result.logits.data(), pool_, matmul_scratch_);
  if (c.final_softcap > 0) softcap(result.logits.data(), n_out * c.n_vocab, c.final_softcap);
  return result;
}

void Forward::layer(int il, const PrefillPlan& plan, KvAssembly& kv, PrefillResult& result) {
  const ModelConfig& c = model_->config();
  const LayerWeights& w = model_->layers[il];
  const auto n = static_cast<int64_t>(active_.size());
  result.active_per_layer.push_back(n);
  size_buffers(plan, n);
  project_qkv(il, w, n);
  const Visibility& vis = c.windowed(il) && windowed_ ? *windowed_ : plan.visibility;
  std::vector<int64_t> next = tokens_going_on(il, plan, kv, result);
  write_kv(il, kv, n);
  if (!plan.stats_queries.empty() && il >= plan.stats_from_layer)
    score_attention_mass(il, plan, vis, kv, result);

  // Attention and the FFN for the tokens that go on only.
  const int64_t q_width = int64_t{c.n_head} * c.head_dim;
  compact_rows(q_, q_width, active_, next);
  compact_rows(x_, c.n_embd, active_, next);
  active_ = std::move(next);
  const auto m = static_cast<int64_t>(active_.size());
  if (m == 0) return;
  for (int64_t id : active_) result.attention_pairs += vis.n_visible(id);
  attention_block(il, w, vis, kv, m);
  feed_forward_block(w, m);
}

void Forward::size_buffers(const PrefillPlan& plan, int64_t n) {
  const ModelConfig& c = model_->config();
  const int64_t q_width = int64_t{c.n_head} * c.head_dim;
  xn_.resize(std::max<size_t>(xn_.size(), n * c.n_embd));
  q_.resize(n * q_width);
  attn_.resize(n * q_width);
  k_.resize(n * c.n_embd_kv());
  v_.resize(k_.size());
  gate_.resize(n * c.n_ff);
  up_.resize(gate_.size());
  proj_.resize(n * c.n_embd);
  active_rows_.resize(n);
  active_pos_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    active_rows_[i] = plan.rows[active_[i]];
    active_pos_[i] = plan.positions[active_[i]];
  }
}

// The row-wise steps between the matmuls (norms, biases, RoPE, SwiGLU,
// residuals) run on the pool too: serial, they left the other threads
// waiting, a share that grows with the thread count. A row's result does not
// depend on the split. Fewer elements than this run inline (a decode step,
// where a hand-out costs more than it saves).
template <class F>
void Forward::for_rows(int64_t n_rows, int64_t width, F&& fn) {
  constexpr int64_t kMinElements = 1 << 15;
  const int64_t n_tasks = std::min<int64_t>(n_rows, 4 * pool_.size());
  if (n_rows * width < kMinElements || n_tasks < 2) return fn(int64_t{0}, n_rows);
  pool_.parallel_for(n_tasks,
                     [&](int64_t task, int) { fn(task * n_rows / n_tasks, (task + 1) * n_rows / n_tasks); });
}

void Forward::project_qkv(int il, const LayerWeights& w, int64_t n) {
  const ModelConfig& c = model_->config();
  const bool neox = c.rope_style == RopeStyle::Neox;
  const int64_t q_width = int64_t{c.n_head} * c.head_dim, kv_width = c.n_embd_kv();
  for_rows(n, c.n_embd, [&](int64_t r0, int64_t r1) {
    rms_norm(x_.data() + r0 * c.n_embd, w.attn_norm.data(), xn_.data() + r0 * c.n_embd, r1 - r0, c.n_embd,
             c.rms_eps);
  });
  const MatmulOut qkv[] = {{&w.wq, q_.data()}, {&w.wk, k_.data()}, {&w.wv, v_.data()}};
  matmul(qkv, xn_.data(), n, pool_, matmul_scratch_);
  const bool rotates = c.rotates(il);
  if (rotates) rope_.build(active_pos_.data(), n, c.n_rot, c.layer_rope_base(il), c.layer_rope_divisors(il));
  for_rows(n, q_width + 2 * kv_width, [&](int64_t r0, int64_t r1) {
    const int64_t rows = r1 - r0;
    float* q = q_.data() + r0 * q_width;
    float* k = k_.data() + r0 * kv_width;
    if (c.qkv_bias) {
      add_bias(q, w.bq.data(), rows, q_width);
      add_bias(k, w.bk.data(), rows, kv_width);
      add_bias(v_.data() + r0 * kv_width, w.bv.data(), rows, kv_width);
    }
    if (c.qk_norm) {  // every head of every row, in place
      rms_norm(q, w.q_norm.data(), q, rows * c.n_head, c.head_dim, c.rms_eps);
      rms_norm(k, w.k_norm.data(), k, rows * c.n_head_kv, c.head_dim, c.rms_eps);
    }
    if (rotates) {
      rope(q, rows, c.n_head, c.head_dim, rope_, neox, r0);
      rope(k, rows, c.n_head_kv, c.head_dim, rope_, neox, r0);
    }
    // One factor per query: the model's query scale, and Mistral 3's
    // temperature (queries far past the original context attend more sharply).
    if (c.q_scale != 1.0f || c.attn_temp_scale != 0)
      for (int64_t i = r0; i < r1; ++i) {
        const float f = c.q_scale * attention_temperature(c, active_pos_[i]);
        if (f != 1.0f)
          for (int64_t j = 0; j < q_width; ++j) q_[i * q_width + j] *= f;
      }
  });
}

std::vector<int64_t> Forward::tokens_going_on(int il, const PrefillPlan& plan, KvAssembly& kv,
                                              PrefillResult& result) {
  const ModelConfig& c = model_->config();
  std::vector<int64_t> next = active_;
  if (plan.hook) {
    next = plan.hook(LayerKv{il, active_, k_.data(), v_.data(), &kv, plan.rows,
                             plan.stats_queries.empty() ? nullptr : &result.attention_mass});
    if (!std::is_sorted(next.begin(), next.end()) ||
        !std::includes(active_.begin(), active_.end(), next.begin(), next.end()))
      fail(ErrorKind::Internal,
           "layer hook at layer {} returned tokens that are not an ascending subset of the active ones", il);
  }
  if (il == c.n_layer - 1) {
    std::vector<int64_t> wanted = plan.logits_for;
    std::sort(wanted.begin(), wanted.end());
    wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
    if (!std::includes(next.begin(), next.end(), wanted.begin(), wanted.end()))
      fail(ErrorKind::Internal, "a layer hook dropped a token whose logits the plan asks for");
    next = std::move(wanted);
  } else if (!plan.last_layer.empty()) {
    std::erase_if(next, [&](int64_t i) { return plan.last_layer[i] <= il; });
  }
  return next;
}

void Forward::write_kv(int il, KvAssembly& kv, int64_t n) {
  const ModelConfig& c = model_->config();
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && active_rows_[j] == active_rows_[j - 1] + 1) ++j;
    kv.write(il, active_rows_[i], k_.data() + i * c.n_embd_kv(), v_.data() + i * c.n_embd_kv(), j - i);
    i = j;
  }
}

void Forward::score_attention_mass(int il, const PrefillPlan& plan, const Visibility& vis, KvAssembly& kv,
                                   PrefillResult& result) {
  const ModelConfig& c = model_->config();
  const int64_t q_width = int64_t{c.n_head} * c.head_dim;
  auto& mass = result.attention_mass[il];
  mass.assign(plan.stats_queries.size(), {});  // empty: not computed in this layer
  const auto n_stats = static_cast<int64_t>(plan.stats_queries.size());
  // The layer's keys made once for every query scored (each would decode
  // what it sees, over and over): rows up to the last any of them sees.
  int64_t n_rows = 0;
  for (int64_t query : plan.stats_queries)
    for (const RowRange& r : vis.visible(query)) n_rows = std::max(n_rows, r.end);
  mass_keys(kv.layer(il), n_rows, c.n_head_kv, c.head_dim, stats_keys_);
  constexpr int64_t kPerTask = 16;
  pool_.parallel_for((n_stats + kPerTask - 1) / kPerTask, [&](int64_t task, int) {
    for (int64_t s = task * kPerTask; s < std::min(n_stats, (task + 1) * kPerTask); ++s) {
      const int64_t query = plan.stats_queries[s];
      const auto it = std::lower_bound(active_.begin(), active_.end(), query);
      if (it == active_.end() || *it != query) continue;
      mass[s] = attention_mass(q_.data() + (it - active_.begin()) * q_width, vis.visible(query),
                               plan.stats_targets, stats_keys_, c.n_head, c.attn_softcap);
    }
  });
}

void Forward::attention_block(int il, const LayerWeights& w, const Visibility& vis, KvAssembly& kv,
                              int64_t m) {
  const ModelConfig& c = model_->config();
  attention(q_.data(), m, active_, vis, kv.layer(il), c.n_head, c.n_head_kv, c.head_dim, attn_.data(), pool_,
            c.attn_softcap);
  matmul(w.wo, attn_.data(), m, proj_.data(), pool_, matmul_scratch_);
  add_residual(w.attn_post_norm, m);
}

void Forward::add_residual(const std::vector<float>& post_norm, int64_t m) {
  const ModelConfig& c = model_->config();
  for_rows(m, c.n_embd, [&](int64_t r0, int64_t r1) {
    float* proj = proj_.data() + r0 * c.n_embd;
    if (c.post_norms) rms_norm(proj, post_norm.data(), proj, r1 - r0, c.n_embd, c.rms_eps);
    for (int64_t i = r0 * c.n_embd; i < r1 * c.n_embd; ++i) x_[i] += proj_[i];
  });
}

void Forward::feed_forward_block(const LayerWeights& w, int64_t m) {
  const ModelConfig& c = model_->config();
  for_rows(m, c.n_embd, [&](int64_t r0, int64_t r1) {
    rms_norm(x_.data() + r0 * c.n_embd, w.ffn_norm.data(), xn_.data() + r0 * c.n_embd, r1 - r0, c.n_embd,
             c.rms_eps);
  });
  const MatmulOut gate_up[] = {{&w.w_gate, gate_.data()}, {&w.w_up, up_.data()}};
  matmul(gate_up, xn_.data(), m, pool_, matmul_scratch_);
  for_rows(m, c.n_ff, [&](int64_t r0, int64_t r1) {
    float* gate = gate_.data() + r0 * c.n_ff;
    const float* up = up_.data() + r0 * c.n_ff;
    if (c.ffn_act == Activation::GeluTanh)
      geglu(gate, up, (r1 - r0) * c.n_ff);
    else
      swiglu(gate, up, (r1 - r0) * c.n_ff);
  });
  matmul(w.w_down, gate_.data(), m, proj_.data(), pool_, matmul_scratch_);
  add_residual(w.ffn_post_norm, m);
}

void Forward::eval(std::span<const int32_t> tokens, KvAssembly& kv, Logits which,
                   std::vector<float>& logits) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) fail(ErrorKind::InvalidInput, "nothing to evaluate: empty token list");
  const int64_t row0 = kv.n_past();
  if (row0 + n > kv.n_ctx())
    fail(ErrorKind::LimitExceeded, "{} tokens after {} cached ones exceed the context size {}", n, row0,
         kv.n_ctx());
  PrefillPlan plan;
  plan.tokens.assign(tokens.begin(), tokens.end());
  const int32_t pos0 = kv.next_position();
  for (int64_t t = 0; t < n; ++t) {
    plan.positions.push_back(static_cast<int32_t>(pos0 + t));
    plan.rows.push_back(row0 + t);
  }
  plan.visibility = causal_chain(n, row0);  // every earlier row, then causal
  if (which == Logits::Last)
    plan.logits_for = {n - 1};
  else
    for (int64_t t = 0; t < n; ++t) plan.logits_for.push_back(t);
  logits = prefill(plan, kv).logits;
  kv.set_n_past(row0 + n);
}

}  // namespace depcache

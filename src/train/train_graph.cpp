#include "train/train_graph.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compute/vec.h"
#include "exec/visibility.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

// Splits [0, n) into one slice per thread and runs fn(begin, end) on each.
template <class Fn>
void for_slices(ThreadPool& pool, int64_t n, const Fn& fn) {
  const int64_t parts = std::min<int64_t>(std::max(pool.size(), 1), std::max<int64_t>(n / 16, 1));
  pool.parallel_for(parts, [&](int64_t p, int) { fn(n * p / parts, n * (p + 1) / parts); });
}

void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// y (n, out) = x (n, in) · Wᵀ for W (out, in), as the engine applies weights.
void forward_product(ThreadPool& pool, const float* x, const float* w, float* y, int64_t n, int64_t in,
                     int64_t out) {
  for_slices(pool, n, [&](int64_t r0, int64_t r1) {
    sgemm(CblasNoTrans, CblasTrans, r1 - r0, out, in, 1.0f, x + r0 * in, in, w, in, 0.0f, y + r0 * out, out);
  });
}

// dx (n, in) = dy (n, out) · W, or += with accumulate.
void input_gradient(ThreadPool& pool, const float* dy, const float* w, float* dx, int64_t n, int64_t out,
                    int64_t in, bool accumulate) {
  for_slices(pool, n, [&](int64_t r0, int64_t r1) {
    sgemm(CblasNoTrans, CblasNoTrans, r1 - r0, in, out, 1.0f, dy + r0 * out, out, w, in,
          accumulate ? 1.0f : 0.0f, dx + r0 * in, in);
  });
}

// dW (out, in) += dyᵀ · x, each thread a slice of W's rows.
void weight_gradient(ThreadPool& pool, const float* dy, const float* x, float* dw, int64_t n, int64_t out,
                     int64_t in) {
  for_slices(pool, out, [&](int64_t r0, int64_t r1) {
    sgemm(CblasTrans, CblasNoTrans, r1 - r0, in, n, 1.0f, dy + r0, out, x, in, 1.0f, dw + r0 * in, in);
  });
}

// Rows in blocks for the pool: enough tasks to balance, few enough to be cheap.
template <class Fn>
void for_rows(ThreadPool& pool, int64_t n, const Fn& fn) {
  const int64_t block = std::max<int64_t>(16, n / (8 * std::max(pool.size(), 1)) + 1);
  pool.parallel_for((n + block - 1) / block, [&](int64_t b, int) {
    for (int64_t r = b * block, end = std::min(n, r + block); r < end; ++r) fn(r);
  });
}

// y = x / rms(x) * g per row; keeps 1/rms.
void rms_norm_forward(ThreadPool& pool, const float* x, const float* g, float* y, float* inv_rms, int64_t n,
                      int64_t d, float eps) {
  for_rows(pool, n, [&](int64_t r) {
    const float* xr = x + r * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    inv_rms[r] = inv;
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = xr[i] * inv * g[i];
  });
}

// Given dy of y = x·r·g: dx (+)= r·g·dy − x·r³/d·Σ(g·dy·x), and dg += Σ_rows dy·x·r.
void rms_norm_backward(ThreadPool& pool, const float* x, const float* g, const float* inv_rms,
                       const float* dy, float* dx, float* dg, int64_t n, int64_t d, bool accumulate) {
  for_rows(pool, n, [&](int64_t r) {
    const float* xr = x + r * d;
    const float* dyr = dy + r * d;
    const float inv = inv_rms[r];
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += double(g[i]) * dyr[i] * xr[i];
    const float c = static_cast<float>(dot) * inv * inv * inv / static_cast<float>(d);
    float* dxr = dx + r * d;
    for (int64_t i = 0; i < d; ++i) {
      const float v = inv * g[i] * dyr[i] - xr[i] * c;
      dxr[i] = accumulate ? dxr[i] + v : v;
    }
  });
  // The gain's gradient column by column: each sum runs over rows in order.
  const int64_t block = 16;
  pool.parallel_for((d + block - 1) / block, [&](int64_t b, int) {
    for (int64_t i = b * block, end = std::min(d, i + block); i < end; ++i) {
      double s = 0;
      for (int64_t r = 0; r < n; ++r) s += double(dy[r * d + i]) * x[r * d + i] * inv_rms[r];
      dg[i] += static_cast<float>(s);
    }
  });
}

// y = 1 / (1 + e^-x) over n values, 8 lanes at a time.
void sigmoid(const float* x, float* y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(
        y + i, _mm256_div_ps(one, _mm256_add_ps(one, vec::exp(_mm256_sub_ps(zero, vec::load8(x + i))))));
  for (; i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

// e^(x − m) over n values into y (y may be x); returns their sum.
float exp_shifted(const float* x, float m, float* y, int64_t n) {
  const __m256 mm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = vec::exp(_mm256_sub_ps(vec::load8(x + i), mm));
    _mm256_storeu_ps(y + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float z = vec::hsum(acc);
  for (; i < n; ++i) z += (y[i] = std::exp(x[i] - m));
  return z;
}

// The largest of n values (NaN may be dropped here: the exponentials keep it).
float max_of(const float* x, int64_t n) {
  __m256 acc = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(vec::load8(x + i), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float m = *std::max_element(lanes, lanes + 8);
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// h = silu(gate) · up = gate · σ(gate) · up, row r of (n, ff); sg gets σ(gate).
void swiglu_row(const float* gate, const float* up, float* sg, float* h, int64_t ff) {
  sigmoid(gate, sg, ff);
  for (int64_t i = 0; i < ff; ++i) h[i] = gate[i] * sg[i] * up[i];
}

}  // namespace

TrainSequence causal_sequence(std::vector<int32_t> tokens, const std::vector<bool>& loss) {
  TrainSequence s;
  const auto n = static_cast<int64_t>(tokens.size());
  s.positions.resize(tokens.size());
  s.targets.assign(tokens.size(), -1);
  for (int64_t i = 0; i < n; ++i) {
    s.positions[i] = static_cast<int32_t>(i);
    if (i + 1 < n && (loss.empty() || loss[i + 1])) s.targets[i] = tokens[i + 1];
  }
  s.visibility = causal_chain(n, 0);
  s.tokens = std::move(tokens);
  return s;
}

TrainGraph::TrainGraph(ThreadPool& pool) : pool_(pool) {
  // Every product runs single-threaded inside OpenBLAS, split over the pool's
  // threads here: OpenBLAS's own threads would spin (sched_yield) beside the
  // pool's and take ~14% of a step from it.
  openblas_set_num_threads(1);
}

// Attention runs per (sequence, head) on dense L x L blocks through BLAS,
// with the sequence's visibility as an additive mask (0 or −inf): computing
// the hidden half of a causal block costs less than visiting visible pairs one
// by one.
void TrainGraph::attention_forward(LayerActs& a) {
  const int H = shape_.n_head, Hkv = shape_.n_head_kv, hd = shape_.n_embd / H;
  const int64_t dq = int64_t{H} * hd, dkv = int64_t{Hkv} * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.attn.assign(n_ * dq, 0.0f);
  a.lse.assign(n_ * H, 0.0f);
  const auto n_seq = static_cast<int64_t>(seq_begin_.size()) - 1;
  pool_.parallel_for(n_seq * H, [&](int64_t task, int) {
    const int64_t seq = task / H, b = seq_begin_[seq], L = seq_begin_[seq + 1] - b;
    const int h = static_cast<int>(task % H), g = h / (H / Hkv);
    thread_local std::vector<float> p;
    p.resize(L * L);
    sgemm(CblasNoTrans, CblasTrans, L, L, hd, scale, a.q.data() + b * dq + int64_t{h} * hd, dq,
          a.k.data() + b * dkv + int64_t{g} * hd, dkv, 0.0f, p.data(), L);
    const float* mask = masks_.data() + mask_begin_[seq];
    for (int64_t i = 0; i < L; ++i) {
      float* row = p.data() + i * L;
      for (int64_t j = 0; j < L; ++j) row[j] += mask[i * L + j];
      const float m = max_of(row, L);
      const float z = exp_shifted(row, m, row, L);
      vec::scale(row, 1.0f / z, L);
      a.lse[(b + i) * H + h] = m + std::log(z);
    }
    sgemm(CblasNoTrans, CblasNoTrans, L, hd, L, 1.0f, p.data(), L, a.v.data() + b * dkv + int64_t{g} * hd,
          dkv, 0.0f, a.attn.data() + b * dq + int64_t{h} * hd, dq);
  });
}

void TrainGraph::attention_backward(const LayerActs& a, const float* d_attn, float* dq, float* dk,
                                    float* dv) {
  const int H = shape_.n_head, Hkv = shape_.n_head_kv, hd = shape_.n_embd / H;
  const int64_t wq = int64_t{H} * hd, wkv = int64_t{Hkv} * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::fill(dk, dk + n_ * wkv, 0.0f);
  std::fill(dv, dv + n_ * wkv, 0.0f);
  // One task per (sequence, KV head): the K/V rows it writes belong to no other.
  const auto n_seq = static_cast<int64_t>(seq_begin_.size()) - 1;
  pool_.parallel_for(n_seq * Hkv, [&](int64_t task, int) {
    const int64_t seq = task / Hkv, b = seq_begin_[seq], L = seq_begin_[seq + 1] - b;
    const int g = static_cast<int>(task % Hkv);
    const float* k = a.k.data() + b * wkv + int64_t{g} * hd;
    const float* v = a.v.data() + b * wkv + int64_t{g} * hd;
    const float* mask = masks_.data() + mask_begin_[seq];
    thread_local std::vector<float> p, dp;
    p.resize(L * L);
    dp.resize(L * L);
    for (int h = g * (H / Hkv); h < (g + 1) * (H / Hkv); ++h) {
      const float* q = a.q.data() + b * wq + int64_t{h} * hd;
      const float* o = a.attn.data() + b * wq + int64_t{h} * hd;
      const float* dout = d_attn + b * wq + int64_t{h} * hd;
      // The probabilities again, from the saved log-sum-exp of each row.
      sgemm(CblasNoTrans, CblasTrans, L, L, hd, scale, q, wq, k, wkv, 0.0f, p.data(), L);
      sgemm(CblasNoTrans, CblasTrans, L, L, hd, 1.0f, dout, wq, v, wkv, 0.0f, dp.data(), L);
      for (int64_t i = 0; i < L; ++i) {
        float* pr = p.data() + i * L;
        float* dr = dp.data() + i * L;
        for (int64_t j = 0; j < L; ++j) pr[j] += mask[i * L + j];
        exp_shifted(pr, a.lse[(b + i) * H + h], pr, L);
        const float big_d = vec::dot(dout + i * wq, o + i * wq, hd);
        // dS = P ∘ (dP − D) · scale, into dp.
        for (int64_t j = 0; j < L; ++j) dr[j] = pr[j] * (dr[j] - big_d) * scale;
      }
      sgemm(CblasNoTrans, CblasNoTrans, L, hd, L, 1.0f, dp.data(), L, k, wkv, 0.0f,
            dq + b * wq + int64_t{h} * hd, wq);
      sgemm(CblasTrans, CblasNoTrans, L, hd, L, 1.0f, dp.data(), L, q, wq, 1.0f,
            dk + b * wkv + int64_t{g} * hd, wkv);
      sgemm(CblasTrans, CblasNoTrans, L, hd, L, 1.0f, p.data(), L, dout, wq, 1.0f,
            dv + b * wkv + int64_t{g} * hd, wkv);
    }
  });
}

// The batch as one sequence of sequences, each seeing only its own rows;
// returns every token's RoPE position.
std::vector<int32_t> TrainGraph::pack_batch(std::span<const TrainSequence> batch) {
  const int64_t V = shape_.n_vocab;
  seq_begin_.assign(1, 0);
  tokens_.clear();
  targets_.clear();
  std::vector<int32_t> positions;
  std::vector<QueryGroup> groups;
  for (const TrainSequence& seq : batch) {
    const auto n = static_cast<int64_t>(seq.tokens.size());
    if (n == 0 || static_cast<int64_t>(seq.positions.size()) != n ||
        static_cast<int64_t>(seq.targets.size()) != n || seq.visibility.n_queries() != n ||
        seq.visibility.max_row() > n)
      fail(ErrorKind::InvalidInput,
           "a training sequence needs a position, a target and visibility per token");
    for (int32_t t : seq.tokens)
      if (t < 0 || t >= V) fail(ErrorKind::InvalidInput, "token {} is outside the vocabulary of {}", t, V);
    for (int32_t t : seq.targets)
      if (t < -1 || t >= V) fail(ErrorKind::InvalidInput, "target {} is outside the vocabulary of {}", t, V);
    append_shifted(groups, seq.visibility, seq_begin_.back(), seq_begin_.back());
    tokens_.insert(tokens_.end(), seq.tokens.begin(), seq.tokens.end());
    targets_.insert(targets_.end(), seq.targets.begin(), seq.targets.end());
    positions.insert(positions.end(), seq.positions.begin(), seq.positions.end());
    seq_begin_.push_back(seq_begin_.back() + n);
  }
  n_ = seq_begin_.back();
  if (n_ == 0) fail(ErrorKind::InvalidInput, "an empty training batch");
  vis_ = Visibility(std::move(groups));
  return positions;
}

// Each sequence's visibility as an additive mask over its L x L block.
void TrainGraph::build_masks() {
  mask_begin_.assign(1, 0);
  for (size_t q = 0; q + 1 < seq_begin_.size(); ++q) {
    const int64_t L = seq_begin_[q + 1] - seq_begin_[q];
    mask_begin_.push_back(mask_begin_.back() + L * L);
  }
  masks_.assign(static_cast<size_t>(mask_begin_.back()), -INFINITY);
  for (size_t q = 0; q + 1 < seq_begin_.size(); ++q) {
    const int64_t b = seq_begin_[q], L = seq_begin_[q + 1] - b;
    for (int64_t i = 0; i < L; ++i)
      for (const RowRange& r : vis_.visible(b + i))
        std::fill(masks_.begin() + mask_begin_[q] + i * L + (r.begin - b),
                  masks_.begin() + mask_begin_[q] + i * L + (r.end - b), 0.0f);
  }
}

// Layer il on the residual stream x, keeping its activations; tmp: (n, max(d, ff)).
void TrainGraph::forward_layer(const ParamSet& params, int il, std::vector<float>& x,
                               std::vector<float>& tmp) {
  const ModelShape& s = shape_;
  const int64_t d = s.n_embd, H = s.n_head, hd = d / H, dq = H * hd, dkv = int64_t{s.n_head_kv} * hd,
                ff = s.n_ff;
  const ParamSet::LayerIndex& w = params.layer(il);
  LayerActs& a = acts_[il];
  a.x_in = x;
  a.inv_rms1.resize(n_);
  a.xn1.resize(n_ * d);
  rms_norm_forward(pool_, x.data(), params.data(w.attn_norm), a.xn1.data(), a.inv_rms1.data(), n_, d,
                   s.rms_eps);
  a.q.resize(n_ * dq);
  a.k.resize(n_ * dkv);
  a.v.resize(n_ * dkv);
  forward_product(pool_, a.xn1.data(), params.data(w.wq), a.q.data(), n_, d, dq);
  forward_product(pool_, a.xn1.data(), params.data(w.wk), a.k.data(), n_, d, dkv);
  forward_product(pool_, a.xn1.data(), params.data(w.wv), a.v.data(), n_, d, dkv);
  rope(a.q.data(), n_, static_cast<int>(H), static_cast<int>(hd), rope_, false);
  rope(a.k.data(), n_, s.n_head_kv, static_cast<int>(hd), rope_, false);
  attention_forward(a);
  forward_product(pool_, a.attn.data(), params.data(w.wo), tmp.data(), n_, dq, d);
  for (int64_t i = 0; i < n_ * d; ++i) x[i] += tmp[i];
  a.x_mid = x;
  a.inv_rms2.resize(n_);
  a.xn2.resize(n_ * d);
  rms_norm_forward(pool_, x.data(), params.data(w.ffn_norm), a.xn2.data(), a.inv_rms2.data(), n_, d,
                   s.rms_eps);
  a.gate.resize(n_ * ff);
  a.up.resize(n_ * ff);
  forward_product(pool_, a.xn2.data(), params.data(w.w_gate), a.gate.data(), n_, d, ff);
  forward_product(pool_, a.xn2.data(), params.data(w.w_up), a.up.data(), n_, d, ff);
  std::vector<float> h(n_ * ff), sg(n_ * ff);
  for_rows(pool_, n_,
           [&](int64_t r) { swiglu_row(&a.gate[r * ff], &a.up[r * ff], &sg[r * ff], &h[r * ff], ff); });
  forward_product(pool_, h.data(), params.data(w.w_down), tmp.data(), n_, ff, d);
  for (int64_t i = 0; i < n_ * d; ++i) x[i] += tmp[i];
}

// Embedding, every layer, the final norm and the logits.
void TrainGraph::forward(const ParamSet& params) {
  const ModelShape& s = shape_;
  const int64_t d = s.n_embd, ff = s.n_ff, V = s.n_vocab;
  acts_.resize(s.n_layer);
  std::vector<float> x(n_ * d);
  const float* embd = params.data(params.tok_embd());
  for (int64_t t = 0; t < n_; ++t) std::memcpy(&x[t * d], embd + int64_t{tokens_[t]} * d, d * sizeof(float));
  std::vector<float> tmp(n_ * std::max(d, ff));
  for (int il = 0; il < s.n_layer; ++il) forward_layer(params, il, x, tmp);
  x_final_ = x;
  inv_rms_final_.resize(n_);
  xn_final_.resize(n_ * d);
  rms_norm_forward(pool_, x.data(), params.data(params.output_norm()), xn_final_.data(),
                   inv_rms_final_.data(), n_, d, s.rms_eps);
  logits_.resize(n_ * V);
  forward_product(pool_, xn_final_.data(), params.data(params.output()), logits_.data(), n_, d, V);
}

// The loss, and with `gradient` its gradient w.r.t. the logits into dlogits
// (n, V): softmax − one-hot, over the batch's target count.
LossSum TrainGraph::compute_loss(bool gradient, std::vector<float>& dlogits) {
  const int64_t V = shape_.n_vocab;
  LossSum loss;
  for (int32_t t : targets_) loss.n_targets += t >= 0;
  std::vector<double> row_loss(n_, 0.0);
  correct_.assign(n_, 0);
  const float inv_targets = loss.n_targets ? 1.0f / static_cast<float>(loss.n_targets) : 0.0f;
  for_rows(pool_, n_, [&](int64_t r) {
    const int32_t target = targets_[r];
    if (target < 0) return;
    const float* l = logits_.data() + r * V;
    const float m = max_of(l, V);
    thread_local std::vector<float> scratch;
    float* e = gradient ? dlogits.data() + r * V : (scratch.resize(V), scratch.data());
    const float z = exp_shifted(l, m, e, V);
    row_loss[r] = double(m) + std::log(double(z)) - l[target];
    correct_[r] = l[target] == m;
    if (!gradient) return;
    vec::scale(e, inv_targets / z, V);  // softmax / targets
    e[target] -= inv_targets;
  });
  for (int64_t r = 0; r < n_; ++r) loss.sum += row_loss[r], loss.n_correct += correct_[r];
  return loss;
}

TrainGraph::BackwardBuffers::BackwardBuffers(const ModelShape& s, int64_t n, std::vector<float> dx_,
                                             std::vector<float> dxn_)
    : dx(std::move(dx_)), dxn(std::move(dxn_)) {
  const int64_t hd = s.n_embd / s.n_head, dq = int64_t{s.n_head} * hd, dkv = int64_t{s.n_head_kv} * hd;
  dh.resize(n * s.n_ff);
  dgate.resize(n * s.n_ff);
  dup.resize(n * s.n_ff);
  h.resize(n * s.n_ff);
  sg.resize(n * s.n_ff);
  d_attn.resize(n * dq);
  dqv.resize(n * dq);
  dkv_k.resize(n * dkv);
  dkv_v.resize(n * dkv);
}

// Layer il's gradients into g, b.dx carrying the residual stream's gradient
// from the layer's output to its input.
void TrainGraph::backward_layer(const ParamSet& params, int il, ParamSet& g, BackwardBuffers& b) {
  const ModelShape& s = shape_;
  const int64_t d = s.n_embd, H = s.n_head, hd = d / H, dq = H * hd, dkv = int64_t{s.n_head_kv} * hd,
                ff = s.n_ff;
  const ParamSet::LayerIndex& w = params.layer(il);
  const LayerActs& a = acts_[il];
  std::vector<float>& dx = b.dx;
  std::vector<float>& dxn = b.dxn;
  std::vector<float>& dh = b.dh;
  std::vector<float>& dgate = b.dgate;
  std::vector<float>& dup = b.dup;
  std::vector<float>& h = b.h;
  std::vector<float>& sg = b.sg;
  // FFN: x += (silu(gate)·up) W_downᵀ.
  for_rows(pool_, n_,
           [&](int64_t r) { swiglu_row(&a.gate[r * ff], &a.up[r * ff], &sg[r * ff], &h[r * ff], ff); });
  input_gradient(pool_, dx.data(), params.data(w.w_down), dh.data(), n_, d, ff, false);
  weight_gradient(pool_, dx.data(), h.data(), g.data(w.w_down), n_, d, ff);
  for_rows(pool_, n_, [&](int64_t r) {
    for (int64_t i = r * ff; i < (r + 1) * ff; ++i) {
      const float gt = a.gate[i], s_i = sg[i];
      dup[i] = dh[i] * gt * s_i;
      dgate[i] = dh[i] * a.up[i] * s_i * (1.0f + gt * (1.0f - s_i));
    }
  });
  input_gradient(pool_, dgate.data(), params.data(w.w_gate), dxn.data(), n_, ff, d, false);
  input_gradient(pool_, dup.data(), params.data(w.w_up), dxn.data(), n_, ff, d, true);
  weight_gradient(pool_, dgate.data(), a.xn2.data(), g.data(w.w_gate), n_, ff, d);
  weight_gradient(pool_, dup.data(), a.xn2.data(), g.data(w.w_up), n_, ff, d);
  rms_norm_backward(pool_, a.x_mid.data(), params.data(w.ffn_norm), a.inv_rms2.data(), dxn.data(), dx.data(),
                    g.data(w.ffn_norm), n_, d, true);
  // Attention: x += attn W_oᵀ.
  std::vector<float>& d_attn = b.d_attn;
  std::vector<float>& dqv = b.dqv;
  std::vector<float>& dkv_k = b.dkv_k;
  std::vector<float>& dkv_v = b.dkv_v;
  input_gradient(pool_, dx.data(), params.data(w.wo), d_attn.data(), n_, d, dq, false);
  weight_gradient(pool_, dx.data(), a.attn.data(), g.data(w.wo), n_, d, dq);
  attention_backward(a, d_attn.data(), dqv.data(), dkv_k.data(), dkv_v.data());
  rope(dqv.data(), n_, static_cast<int>(H), static_cast<int>(hd), unrope_, false);
  rope(dkv_k.data(), n_, s.n_head_kv, static_cast<int>(hd), unrope_, false);
  input_gradient(pool_, dqv.data(), params.data(w.wq), dxn.data(), n_, dq, d, false);
  input_gradient(pool_, dkv_k.data(), params.data(w.wk), dxn.data(), n_, dkv, d, true);
  input_gradient(pool_, dkv_v.data(), params.data(w.wv), dxn.data(), n_, dkv, d, true);
  weight_gradient(pool_, dqv.data(), a.xn1.data(), g.data(w.wq), n_, dq, d);
  weight_gradient(pool_, dkv_k.data(), a.xn1.data(), g.data(w.wk), n_, dkv, d);
  weight_gradient(pool_, dkv_v.data(), a.xn1.data(), g.data(w.wv), n_, dkv, d);
  rms_norm_backward(pool_, a.x_in.data(), params.data(w.attn_norm), a.inv_rms1.data(), dxn.data(), dx.data(),
                    g.data(w.attn_norm), n_, d, true);
}

// From the logits' gradient (released once used) back to the embedding.
void TrainGraph::backward(const ParamSet& params, std::vector<float>& dlogits, ParamSet& g) {
  const int64_t d = shape_.n_embd, V = shape_.n_vocab;
  std::vector<float> dx(n_ * d), dxn(n_ * d);
  input_gradient(pool_, dlogits.data(), params.data(params.output()), dxn.data(), n_, V, d, false);
  weight_gradient(pool_, dlogits.data(), xn_final_.data(), g.data(params.output()), n_, V, d);
  dlogits = {};
  rms_norm_backward(pool_, x_final_.data(), params.data(params.output_norm()), inv_rms_final_.data(),
                    dxn.data(), dx.data(), g.data(params.output_norm()), n_, d, false);
  BackwardBuffers b(shape_, n_, std::move(dx), std::move(dxn));
  for (int il = shape_.n_layer - 1; il >= 0; --il) backward_layer(params, il, g, b);
  float* dembd = g.data(params.tok_embd());
  for (int64_t t = 0; t < n_; ++t) {
    float* row = dembd + int64_t{tokens_[t]} * d;
    for (int64_t i = 0; i < d; ++i) row[i] += b.dx[t * d + i];
  }
}

LossSum TrainGraph::run(const ParamSet& params, std::span<const TrainSequence> batch, ParamSet* grads) {
  shape_ = params.shape();
  const std::vector<int32_t> positions = pack_batch(batch);
  build_masks();
  rope_.build(positions.data(), n_, static_cast<int>(shape_.n_embd / shape_.n_head), shape_.rope_base);
  unrope_ = rope_;
  for (float& v : unrope_.sin) v = -v;  // the inverse rotation
  forward(params);
  std::vector<float> dlogits(grads ? n_ * shape_.n_vocab : 0);
  const LossSum sum = compute_loss(grads != nullptr, dlogits);
  if (!grads) return sum;
  if (!std::isfinite(sum.sum)) return sum;  // the caller reports it; no gradient from it
  backward(params, dlogits, *grads);
  return sum;
}

}  // namespace depcache

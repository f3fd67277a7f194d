#include "reference_forward.h"

#include <cmath>
#include <stdexcept>

#include "compute/quant_reference.h"

namespace depcache::test {
namespace {

using Matrix = ReferenceWeights::Matrix;

Matrix dequantized(const WeightMatrix& m) {
  Matrix out{m.n_out, m.n_in, std::vector<double>(m.n_out * m.n_in)};
  for (int64_t r = 0; r < m.n_out; ++r)
    dequantize_row_f64(m.type, m.row(r), out.w.data() + r * m.n_in, m.n_in);
  return out;
}

std::vector<double> widened(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<double> operator*(const Matrix& m, const std::vector<double>& x) {
  std::vector<double> y(m.n_out, 0.0);
  for (int64_t r = 0; r < m.n_out; ++r)
    for (int64_t i = 0; i < m.n_in; ++i) y[r] += m.w[r * m.n_in + i] * x[i];
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

// Pair i turns by pos * base^(-2i/n_rot) / divisors[i] (Llama 3's
// rope_freqs, linear scaling; none: 1).
void rope(std::vector<double>& v, int n_heads, int head_dim, int n_rot, int pos, double base, bool neox,
          const std::vector<float>& divisors) {
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < n_rot / 2; ++i) {
      const double theta =
          pos * std::pow(base, -2.0 * i / n_rot) / (divisors.empty() ? 1.0 : double(divisors[i]));
      const int a = h * head_dim + (neox ? i : 2 * i);
      const int b = h * head_dim + (neox ? i + n_rot / 2 : 2 * i + 1);
      const double x0 = v[a], x1 = v[b];
      v[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      v[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
}

}  // namespace

ReferenceWeights ReferenceWeights::from_model(const Model& model) {
  ReferenceWeights r;
  r.config = model.config();
  r.tok_embd = dequantized(model.tok_embd);
  for (const LayerWeights& w : model.layers)
    r.layers.push_back({widened(w.attn_norm), widened(w.ffn_norm), widened(w.bq), widened(w.bk),
                        widened(w.bv), widened(w.q_norm), widened(w.k_norm), widened(w.attn_post_norm),
                        widened(w.ffn_post_norm), dequantized(w.wq), dequantized(w.wk), dequantized(w.wv),
                        dequantized(w.wo), dequantized(w.w_gate), dequantized(w.w_up),
                        dequantized(w.w_down)});
  r.output_norm = widened(model.output_norm);
  r.output = dequantized(model.output);
  return r;
}

ReferencePass reference_forward(const Model& model, const std::vector<int32_t>& tokens,
                                const std::vector<int32_t>& positions, const SeesRule& sees) {
  return reference_forward(ReferenceWeights::from_model(model), tokens, positions, sees);
}

ReferencePass reference_forward(const ReferenceWeights& weights, const std::vector<int32_t>& tokens,
                                const std::vector<int32_t>& positions, const SeesRule& sees) {
  const ModelConfig& c = weights.config;
  const auto n = static_cast<int64_t>(tokens.size());
  if (positions.size() != tokens.size())
    throw std::invalid_argument("reference_forward: one position per token");
  const int hd = c.head_dim;
  const bool neox = c.rope_style == RopeStyle::Neox;
  std::vector<std::vector<double>> x(n);
  for (int64_t t = 0; t < n; ++t) {
    const double* row = weights.tok_embd.w.data() + int64_t{tokens[t]} * c.n_embd;
    x[t].assign(row, row + c.n_embd);
    const bool gemma = c.arch == Arch::Gemma2 || c.arch == Arch::Gemma3;
    for (double& e : x[t]) e *= gemma ? std::sqrt(double(c.n_embd)) : 1.0;
  }

  ReferencePass out;
  for (int il = 0; il < c.n_layer; ++il) {
    const ReferenceWeights::Layer& w = weights.layers[il];
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      const auto xn = rmsnorm(x[t], w.attn_norm, c.rms_eps);
      q[t] = w.wq * xn;
      k[t] = w.wk * xn;
      v[t] = w.wv * xn;
      if (c.qkv_bias) {
        for (size_t i = 0; i < q[t].size(); ++i) q[t][i] += w.bq[i];
        for (size_t i = 0; i < k[t].size(); ++i) k[t][i] += w.bk[i], v[t][i] += w.bv[i];
      }
      if (c.qk_norm) {  // each head of Q and K on its own (Qwen3)
        const auto per_head = [&](std::vector<double>& y, int n_heads, const std::vector<double>& g) {
          for (int h = 0; h < n_heads; ++h) {
            const std::vector<double> head(y.begin() + h * hd, y.begin() + (h + 1) * hd);
            const auto normed = rmsnorm(head, g, c.rms_eps);
            std::copy(normed.begin(), normed.end(), y.begin() + h * hd);
          }
        };
        per_head(q[t], c.n_head, w.q_norm);
        per_head(k[t], c.n_head_kv, w.k_norm);
      }
      // Gemma 3's windowed layers turn with their own base and no scaling;
      // SmolLM3's every fourth layer does not turn.
      const bool local = c.windowed(il) && c.rope_base_local > 0;
      const bool turns = c.arch != Arch::SmolLM3 || (il + 1) % 4 != 0;
      if (turns) {
        const std::vector<float> none;
        const double base = local ? c.rope_base_local : c.rope_base;
        rope(q[t], c.n_head, hd, c.n_rot, positions[t], base, neox, local ? none : c.rope_divisors);
        rope(k[t], c.n_head_kv, hd, c.n_rot, positions[t], base, neox, local ? none : c.rope_divisors);
      }
      for (double& e : q[t]) e *= c.q_scale;
      if (c.attn_temp_scale != 0) {  // its own rule: 1 + scale * ln(floor(p / length) + 1)
        const double temp =
            1.0 + c.attn_temp_scale * std::log(std::floor(double(positions[t]) / c.attn_temp_length) + 1.0);
        for (double& e : q[t]) e *= temp;
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      std::vector<int64_t> seen;
      for (int64_t j = 0; j < n; ++j) {
        const bool in_window = !c.windowed(il) || positions[t] - positions[j] < c.sliding_window;
        if (sees(t, j) && in_window) seen.push_back(j);
      }
      if (seen.empty()) throw std::invalid_argument("reference_forward: a token that sees nothing");
      std::vector<double> attn(c.n_head * hd, 0.0);
      for (int h = 0; h < c.n_head; ++h) {
        const int kvh = h / (c.n_head / c.n_head_kv);
        std::vector<double> s(seen.size());
        double m = -INFINITY;
        for (size_t j = 0; j < seen.size(); ++j) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[seen[j]][kvh * hd + i];
          s[j] = d / std::sqrt(double(hd));
          if (c.attn_softcap > 0) s[j] = c.attn_softcap * std::tanh(s[j] / c.attn_softcap);
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - m));
        for (size_t j = 0; j < seen.size(); ++j)
          for (int i = 0; i < hd; ++i) attn[h * hd + i] += s[j] / sum * v[seen[j]][kvh * hd + i];
      }
      auto o = w.wo * attn;
      if (!w.attn_post_norm.empty()) o = rmsnorm(o, w.attn_post_norm, c.rms_eps);
      for (int i = 0; i < c.n_embd; ++i) x[t][i] += o[i];
    }
    // The FFN after every token's attention: attention reads only this
    // layer's K/V, which are fixed above, so the order does not matter.
    for (int64_t t = 0; t < n; ++t) {
      const auto xn = rmsnorm(x[t], w.ffn_norm, c.rms_eps);
      auto g = w.w_gate * xn;
      const auto u = w.w_up * xn;
      const double pi = 3.14159265358979323846;
      for (size_t i = 0; i < g.size(); ++i)
        g[i] = (c.ffn_act == Activation::GeluTanh
                    ? 0.5 * g[i] * (1 + std::tanh(std::sqrt(2 / pi) * (g[i] + 0.044715 * g[i] * g[i] * g[i])))
                    : g[i] / (1.0 + std::exp(-g[i]))) *
               u[i];
      auto d = w.w_down * g;
      if (!w.ffn_post_norm.empty()) d = rmsnorm(d, w.ffn_post_norm, c.rms_eps);
      for (int i = 0; i < c.n_embd; ++i) x[t][i] += d[i];
    }
    out.k.push_back(std::move(k));
    out.v.push_back(std::move(v));
  }
  out.logits.reserve(n * c.n_vocab);
  for (int64_t t = 0; t < n; ++t) {
    auto l = weights.output * rmsnorm(x[t], weights.output_norm, c.rms_eps);
    if (c.final_softcap > 0)
      for (double& e : l) e = c.final_softcap * std::tanh(e / c.final_softcap);
    out.logits.insert(out.logits.end(), l.begin(), l.end());
  }
  return out;
}

std::vector<double> reference_logits(const ReferenceWeights& weights, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> positions(tokens.size());
  for (size_t t = 0; t < tokens.size(); ++t) positions[t] = static_cast<int32_t>(t);
  return reference_forward(weights, tokens, positions, [](int64_t q, int64_t k) { return k <= q; }).logits;
}

std::vector<double> reference_logits(const Model& model, const std::vector<int32_t>& tokens) {
  return reference_logits(ReferenceWeights::from_model(model), tokens);
}

}  // namespace depcache::test

#include "reference_forward.h"

#include <cmath>

#include "compute/quant_reference.h"

namespace depcache::test {
namespace {

using Mat = std::vector<double>;  // row-major (n_out, n_in)

Mat load(const WeightMatrix& w) {
  Mat m(w.n_out * w.n_in);
  for (int64_t r = 0; r < w.n_out; ++r) dequantize_row_f64(w.type, w.row(r), m.data() + r * w.n_in, w.n_in);
  return m;
}

std::vector<double> matvec(const Mat& m, int64_t n_out, int64_t n_in, const std::vector<double>& x) {
  std::vector<double> y(n_out, 0.0);
  for (int64_t r = 0; r < n_out; ++r)
    for (int64_t i = 0; i < n_in; ++i) y[r] += m[r * n_in + i] * x[i];
  return y;
}

std::vector<double> times(const WeightMatrix& w, const std::vector<double>& x) {
  return matvec(load(w), w.n_out, w.n_in, x);
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

void rope(std::vector<double>& v, int n_heads, int head_dim, int n_rot, int pos, double base, bool neox) {
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < n_rot / 2; ++i) {
      const double theta = pos * std::pow(base, -2.0 * i / n_rot);
      const int a = h * head_dim + (neox ? i : 2 * i);
      const int b = h * head_dim + (neox ? i + n_rot / 2 : 2 * i + 1);
      const double x0 = v[a], x1 = v[b];
      v[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      v[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
}

}  // namespace

std::vector<double> reference_logits(const Model& model, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int hd = c.head_dim;
  const bool neox = c.rope_style == RopeStyle::Neox;
  std::vector<std::vector<double>> x(n, std::vector<double>(c.n_embd));
  for (int64_t t = 0; t < n; ++t)
    dequantize_row_f64(model.tok_embd.type, model.tok_embd.row(tokens[t]), x[t].data(), c.n_embd);

  for (int il = 0; il < c.n_layer; ++il) {
    const LayerWeights& w = model.layers[il];
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      const auto xn = rmsnorm(x[t], w.attn_norm, c.rms_eps);
      q[t] = times(w.wq, xn);
      k[t] = times(w.wk, xn);
      v[t] = times(w.wv, xn);
      if (c.qkv_bias) {
        for (size_t i = 0; i < q[t].size(); ++i) q[t][i] += w.bq[i];
        for (size_t i = 0; i < k[t].size(); ++i) k[t][i] += w.bk[i], v[t][i] += w.bv[i];
      }
      rope(q[t], c.n_head, hd, c.n_rot, static_cast<int>(t), c.rope_base, neox);
      rope(k[t], c.n_head_kv, hd, c.n_rot, static_cast<int>(t), c.rope_base, neox);
    }
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> attn(c.n_head * hd, 0.0);
      for (int h = 0; h < c.n_head; ++h) {
        const int kvh = h / (c.n_head / c.n_head_kv);
        std::vector<double> s(t + 1);
        double m = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[t][h * hd + i] * k[j][kvh * hd + i];
          s[j] = d / std::sqrt(double(hd));
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - m));
        for (int64_t j = 0; j <= t; ++j)
          for (int i = 0; i < hd; ++i) attn[h * hd + i] += s[j] / sum * v[j][kvh * hd + i];
      }
      const auto o = times(w.wo, attn);
      for (int i = 0; i < c.n_embd; ++i) x[t][i] += o[i];
      const auto xn = rmsnorm(x[t], w.ffn_norm, c.rms_eps);
      auto g = times(w.w_gate, xn);
      const auto u = times(w.w_up, xn);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const auto d = times(w.w_down, g);
      for (int i = 0; i < c.n_embd; ++i) x[t][i] += d[i];
    }
  }
  std::vector<double> logits;
  logits.reserve(n * c.n_vocab);
  for (int64_t t = 0; t < n; ++t) {
    const auto l = times(model.output, rmsnorm(x[t], model.output_norm, c.rms_eps));
    logits.insert(logits.end(), l.begin(), l.end());
  }
  return logits;
}

}  // namespace depcache::test

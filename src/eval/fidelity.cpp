#include "eval/fidelity.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/error.h"

namespace depcache {
namespace {

// log-sum-exp of the logits in double; NaN when a value is not finite.
double log_sum_exp(std::span<const float> x) {
  double m = -std::numeric_limits<double>::infinity();
  for (float v : x) {
    if (!std::isfinite(v)) return std::numeric_limits<double>::quiet_NaN();
    m = std::max(m, static_cast<double>(v));
  }
  double s = 0;
  for (float v : x) s += std::exp(static_cast<double>(v) - m);
  return m + std::log(s);
}

}  // namespace

double kl_divergence_of_logits(std::span<const float> p, std::span<const float> q) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (p.size() != q.size() || p.empty()) return kInf;
  const double lp = log_sum_exp(p), lq = log_sum_exp(q);
  if (!std::isfinite(lp) || !std::isfinite(lq)) return kInf;
  double kl = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double log_p = p[i] - lp, log_q = q[i] - lq;
    kl += std::exp(log_p) * (log_p - log_q);
  }
  return std::max(kl, 0.0);  // rounding can leave a tiny negative for equal distributions
}

double rouge_l(std::span<const int32_t> reference, std::span<const int32_t> candidate) {
  if (reference.empty() && candidate.empty()) return 1.0;
  if (reference.empty() || candidate.empty()) return 0.0;
  // LCS by dynamic programming over one row.
  std::vector<int32_t> row(candidate.size() + 1, 0);
  for (int32_t r : reference) {
    int32_t diag = 0;
    for (size_t j = 1; j <= candidate.size(); ++j) {
      const int32_t up = row[j];
      row[j] = r == candidate[j - 1] ? diag + 1 : std::max(row[j], row[j - 1]);
      diag = up;
    }
  }
  const double lcs = row.back();
  if (lcs == 0) return 0.0;
  const double precision = lcs / static_cast<double>(candidate.size());
  const double recall = lcs / static_cast<double>(reference.size());
  return 2 * precision * recall / (precision + recall);
}

Fidelity compare_to_full(std::span<const float> full_first_logits, std::span<const int32_t> full_tokens,
                         std::span<const float> first_logits, std::span<const int32_t> tokens) {
  Fidelity f;
  f.kl_first_token = kl_divergence_of_logits(full_first_logits, first_logits);
  if (!std::isfinite(f.kl_first_token)) return f;  // NaN or Inf on either side: nothing agrees
  f.first_token_agrees = !full_tokens.empty() && !tokens.empty() && full_tokens[0] == tokens[0];
  f.identical = std::equal(full_tokens.begin(), full_tokens.end(), tokens.begin(), tokens.end());
  f.rouge_l = rouge_l(full_tokens, tokens);
  return f;
}

std::vector<LayerDeviation> kv_deviation(const KvAssembly& full, const KvAssembly& got, int64_t n_rows) {
  if (full.n_layer() != got.n_layer() || full.row_elems() != got.row_elems() || n_rows > full.n_ctx() ||
      n_rows > got.n_ctx())
    fail(ErrorKind::InvalidInput, "kv_deviation: the two caches are not of the same model and size");
  const int64_t width = full.row_elems();
  std::vector<float> fk(width), fv(width), gk(width), gv(width);
  std::vector<LayerDeviation> out;
  for (int il = 0; il < full.n_layer(); ++il) {
    double dk = 0, dv = 0, nk = 0, nv = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
      full.read(il, r, fk.data(), fv.data());
      got.read(il, r, gk.data(), gv.data());
      for (int64_t e = 0; e < width; ++e) {
        dk += (static_cast<double>(gk[e]) - fk[e]) * (static_cast<double>(gk[e]) - fk[e]);
        dv += (static_cast<double>(gv[e]) - fv[e]) * (static_cast<double>(gv[e]) - fv[e]);
        nk += static_cast<double>(fk[e]) * fk[e];
        nv += static_cast<double>(fv[e]) * fv[e];
      }
    }
    const auto relative = [](double d, double n) {
      if (!std::isfinite(d) || !std::isfinite(n)) return std::numeric_limits<double>::infinity();
      return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
    };
    out.push_back({relative(dk, nk), relative(dv, nv)});
  }
  return out;
}

}  // namespace depcache

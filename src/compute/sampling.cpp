#include "compute/sampling.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace depcache {

void SamplerParams::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    fail(ErrorKind::InvalidInput, "temperature must be >= 0, got {}", temperature);
  if (!(top_p > 0) || top_p > 1) fail(ErrorKind::InvalidInput, "top-p must be in (0, 1], got {}", top_p);
  if (!(min_p >= 0) || min_p > 1) fail(ErrorKind::InvalidInput, "min-p must be in [0, 1], got {}", min_p);
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) { params_.validate(); }

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0) return argmax(logits);
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + params_.top_k, candidates_.end(), by_logit);
    n = params_.top_k;
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Probabilities at the sampling temperature, over the survivors of top-k.
  std::vector<double> p(n);
  const double max_logit = candidates_[0].first;
  double sum = 0;
  for (size_t i = 0; i < n; ++i)
    sum += (p[i] = std::exp((candidates_[i].first - max_logit) / params_.temperature));
  for (double& x : p) x /= sum;
  // top-p: smallest prefix whose mass reaches top_p.
  if (params_.top_p < 1) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += p[i];
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  // min-p: drop tokens below min_p times the top probability.
  if (params_.min_p > 0) {
    size_t keep = 1;
    while (keep < n && p[keep] >= params_.min_p * p[0]) ++keep;
    n = keep;
  }
  std::discrete_distribution<size_t> pick(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(n));
  return candidates_[pick(rng_)].second;
}

}  // namespace depcache

#include "compute/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "util/error.h"

namespace depcache {

void SamplerParams::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    fail(ErrorKind::InvalidInput, "temperature must be >= 0, got {}", temperature);
  if (!(top_p > 0) || top_p > 1) fail(ErrorKind::InvalidInput, "top-p must be in (0, 1], got {}", top_p);
  if (!(min_p >= 0) || min_p > 1) fail(ErrorKind::InvalidInput, "min-p must be in [0, 1], got {}", min_p);
  if (!(presence_penalty >= -2 && presence_penalty <= 2))
    fail(ErrorKind::InvalidInput, "presence_penalty must be in [-2, 2], got {}", presence_penalty);
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2))
    fail(ErrorKind::InvalidInput, "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) fail(ErrorKind::InvalidInput, "logit_bias token {} is not a token id", id);
    if (!(bias >= -100 && bias <= 100))
      fail(ErrorKind::InvalidInput, "logit_bias of token {} must be in [-100, 100], got {}", id, bias);
  }
}

void SamplerParams::validate(int32_t n_vocab) const {
  validate();
  std::set<int32_t> banned;
  for (const auto& [id, bias] : logit_bias) {
    if (id >= n_vocab)
      fail(ErrorKind::InvalidInput, "logit_bias token {} is outside the vocabulary of {}", id, n_vocab);
    if (bias <= -100) banned.insert(id);
  }
  if (static_cast<int64_t>(banned.size()) >= n_vocab)
    fail(ErrorKind::InvalidInput, "logit_bias bans every token of the vocabulary");
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) { params_.validate(); }

std::span<const float> Sampler::adjusted(std::span<const float> logits) {
  const bool penalties = params_.presence_penalty != 0 || params_.frequency_penalty != 0;
  if (params_.logit_bias.empty() && !penalties) return logits;
  adjusted_.assign(logits.begin(), logits.end());
  for (const auto& [id, bias] : params_.logit_bias) {
    if (static_cast<size_t>(id) >= adjusted_.size())
      fail(ErrorKind::InvalidInput, "logit_bias token {} is outside the vocabulary of {}", id,
           adjusted_.size());
    // -100 is OpenAI's "ban": exact here, whatever the logits' scale.
    adjusted_[id] = bias <= -100 ? -std::numeric_limits<float>::infinity() : adjusted_[id] + bias;
  }
  // OpenAI: mu[j] - c[j] * frequency_penalty - (c[j] > 0) * presence_penalty.
  for (const auto& [id, n] : generated_)
    adjusted_[id] -= static_cast<float>(n) * params_.frequency_penalty + params_.presence_penalty;
  return adjusted_;
}

int32_t Sampler::sample(std::span<const float> raw) {
  const std::span<const float> logits = adjusted(raw);
  int32_t picked = 0;
  if (params_.temperature <= 0) {
    picked = argmax(logits);
  } else {
    candidates_.clear();
    for (size_t i = 0; i < logits.size(); ++i) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
    auto by_logit = [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    size_t n = candidates_.size();
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
      std::partial_sort(candidates_.begin(), candidates_.begin() + params_.top_k, candidates_.end(),
                        by_logit);
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
    picked = candidates_[pick(rng_)].second;
  }
  if (params_.presence_penalty != 0 || params_.frequency_penalty != 0) ++generated_[picked];
  return picked;
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size())
    fail(ErrorKind::InvalidInput, "token {} is outside the vocabulary of {}", token, logits.size());
  // log-softmax in double: log p(i) = x_i - max - log(sum exp(x_j - max)).
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  const double log_z = max_logit + std::log(sum);
  const auto logprob = [&](int32_t i) { return static_cast<float>(logits[i] - log_z); };
  TokenLogprob out{token, logprob(token), {}};
  const size_t k = std::min(static_cast<size_t>(std::max(top, 0)), logits.size());
  if (k == 0) return out;
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(
      ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (size_t i = 0; i < k; ++i) out.top.push_back({ids[i], logprob(ids[i])});
  return out;
}

}  // namespace depcache

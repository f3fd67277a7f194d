#include "train/optimizer.h"

#include <cmath>

namespace depcache {

double learning_rate(const AdamWOptions& o, int64_t step) {
  if (step < o.warmup_steps)
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  const int64_t decay = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - o.warmup_steps) / static_cast<double>(decay));
  const double floor = o.lr * o.min_lr_ratio;
  return floor + (o.lr - floor) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(const ParamSet& params, AdamWOptions options)
    : o_(options), m_(params.shape()), v_(params.shape()) {}

double AdamW::update(ParamSet& params, const ParamSet& grads) {
  double ss = 0;
  for (float g : grads.values()) ss += double(g) * g;
  const double norm = std::sqrt(ss);
  const double clip = o_.clip_norm > 0 && norm > o_.clip_norm ? o_.clip_norm / norm : 1.0;
  const double lr = learning_rate(o_, step_);
  ++step_;
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(step_));
  const auto b1 = static_cast<float>(o_.beta1), b2 = static_cast<float>(o_.beta2);
  for (size_t t = 0; t < params.tensors().size(); ++t) {
    const ModelTensor& info = params.tensors()[t];
    const double decay = info.matrix ? o_.weight_decay : 0.0;
    float* p = params.data(t);
    const float* g = grads.data(t);
    float* m = m_.data(t);
    float* v = v_.data(t);
    const auto step_size = static_cast<float>(lr / bc1);
    const auto inv_bc2 = static_cast<float>(1.0 / bc2);
    const auto shrink = static_cast<float>(1.0 - lr * decay);
    const auto eps = static_cast<float>(o_.eps), scale = static_cast<float>(clip);
    for (int64_t i = 0; i < info.size(); ++i) {
      const float gi = g[i] * scale;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      p[i] = p[i] * shrink - step_size * m[i] / (std::sqrt(v[i] * inv_bc2) + eps);
    }
  }
  return norm;
}

}  // namespace depcache

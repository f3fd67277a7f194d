#pragma once
// AdamW with decoupled weight decay (on the 2-D weights only), gradient
// clipping by global norm, and a learning rate with linear warmup then a
// cosine decay to a floor.
#include <cstdint>

#include "train/params.h"

namespace depcache {

struct AdamWOptions {
  double lr = 3e-3;
  double min_lr_ratio = 0.1;  // the cosine ends at lr * this
  int64_t warmup_steps = 100;
  int64_t total_steps = 1000;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.1;
  double clip_norm = 1.0;  // <= 0: no clipping
};

// The learning rate of step `step` (0-based).
double learning_rate(const AdamWOptions& o, int64_t step);

class AdamW {
 public:
  AdamW(const ParamSet& params, AdamWOptions options);

  // One update of `params` from `grads`; returns the gradient's global norm
  // before clipping. Counts steps itself (step() is the next step's index).
  double update(ParamSet& params, const ParamSet& grads);
  int64_t step() const { return step_; }

  // The moments, for checkpoints.
  ParamSet& m() { return m_; }
  ParamSet& v() { return v_; }
  const ParamSet& m() const { return m_; }
  const ParamSet& v() const { return v_; }
  void set_step(int64_t step) { step_ = step; }
  const AdamWOptions& options() const { return o_; }

 private:
  AdamWOptions o_;
  ParamSet m_, v_;
  int64_t step_ = 0;
};

}  // namespace depcache

#pragma once
// y = x · Wᵀ for a weight matrix kept in its file type.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "compute/dtype.h"

namespace depcache {

class ThreadPool;
class PackedMatrix;

// A row-major weight matrix: n_out rows of n_in elements of `type`.
struct WeightMatrix {
  DType type = DType::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  // The same weights in panels (packed_matrix.h), made at load for the types
  // that have panel kernels; matmul uses it when present.
  std::shared_ptr<const PackedMatrix> packed;

  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

// x: (n_tokens, n_in) row-major floats; y: (n_tokens, n_out).
// A packed matrix runs the panel kernels for any token count, in parallel
// over panels (and token blocks when there are few panels); `scratch` holds
// the activations as the approximate modes convert them (dot.h), when on. A matrix without panels (only
// ever built by hand, e.g. in tests) runs the per-row dot kernels.
void matmul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            std::vector<float>& scratch);

// Several matrices applied to the same x (Q, K and V; gate and up) in one
// parallel loop: one hand-out and one wait instead of one per matrix.
struct MatmulOut {
  const WeightMatrix* w;
  float* y;  // (n_tokens, w->n_out)
};
void matmul(std::span<const MatmulOut> outs, const float* x, int64_t n_tokens, ThreadPool& pool,
            std::vector<float>& scratch);

// Token count from which work is split as a prefill (compute-bound) rather
// than a decode (weight streaming).
inline constexpr int64_t kGemmMinTokens = 4;

}  // namespace depcache

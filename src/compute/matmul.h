#pragma once
// y = x · Wᵀ for a weight matrix kept in its file type.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "compute/dtype.h"

namespace depcache {

class ThreadPool;

// A row-major weight matrix: n_out rows of n_in elements of `type`.
struct WeightMatrix {
  DType type = DType::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;

  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

// x: (n_tokens, n_in) row-major floats; y: (n_tokens, n_out).
// Few tokens (decode) use per-row dot kernels on the stored type, which is
// memory-bound; many tokens (prefill) dequantize the matrix once into
// `scratch` and run a float GEMM, which is compute-bound.
void matmul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            std::vector<float>& scratch);

// Token count from which the GEMM path is taken.
inline constexpr int64_t kGemmMinTokens = 4;

}  // namespace depcache

#pragma once
// Element-wise and per-row operations of the transformer block.
#include <cstdint>

namespace depcache {

// out[t] = x[t] / rms(x[t]) * w, for n_rows rows of n elements.
void rms_norm(const float* x, const float* w, float* out, int64_t n_rows, int64_t n, float eps);

// x[t] += b for every row.
void add_bias(float* x, const float* b, int64_t n_rows, int64_t n);

// gate[i] = silu(gate[i]) * up[i].
void swiglu(float* gate, const float* up, int64_t n);

// In-place softmax of one row.
void softmax(float* x, int64_t n);

// Rotary position embedding of n_rows rows, each n_heads heads of head_dim,
// of which the first n_rot dimensions rotate. Row t sits at positions[t].
// neox: pairs (i, i + n_rot/2); otherwise adjacent pairs (2i, 2i+1).
void rope(float* x, int64_t n_rows, int n_heads, int head_dim, int n_rot, const int32_t* positions,
          float base, bool neox);

}  // namespace depcache

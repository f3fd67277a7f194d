#pragma once
// Element-wise and per-row operations of the transformer block.
#include <cstdint>
#include <span>
#include <vector>

namespace depcache {

// out[t] = x[t] / rms(x[t]) * w, for n_rows rows of n elements.
// out may be x.
void rms_norm(const float* x, const float* w, float* out, int64_t n_rows, int64_t n, float eps);

// x[t] += b for every row.
void add_bias(float* x, const float* b, int64_t n_rows, int64_t n);

// gate[i] = silu(gate[i]) * up[i].
void swiglu(float* gate, const float* up, int64_t n);
// gate[i] = gelu(gate[i]) * up[i], GELU in its tanh approximation (Gemma).
void geglu(float* gate, const float* up, int64_t n);
// x[i] = cap * tanh(x[i] / cap): logit soft-capping.
void softcap(float* x, int64_t n, float cap);

// Rotary position embedding. The cos/sin of every (row, pair) angle are
// computed once per batch and shared by the query and key rotations of every
// layer.
struct RopeTable {
  int n_rot = 0;           // rotary dimensions per head (even)
  std::vector<float> cos;  // (n_rows, n_rot/2)
  std::vector<float> sin;  // (n_rows, n_rot/2)

  // Row t sits at positions[t]; pair i turns by positions[t] *
  // base^(-2i/n_rot) / divisors[i] (the model's frequency scaling:
  // ModelConfig::rope_divisors; empty: 1).
  void build(const int32_t* positions, int64_t n_rows, int n_rot, float base,
             std::span<const float> divisors = {});
};

// Rotates n_rows rows, each n_heads heads of head_dim, of which the first
// table.n_rot dimensions rotate. neox: pairs (i, i + n_rot/2); otherwise
// adjacent pairs (2i, 2i+1).
// x holds rows first_row .. first_row + n_rows - 1 of the table's batch.
void rope(float* x, int64_t n_rows, int n_heads, int head_dim, const RopeTable& table, bool neox,
          int64_t first_row = 0);

// The same for a one-off rotation (builds the table itself).
void rope(float* x, int64_t n_rows, int n_heads, int head_dim, int n_rot, const int32_t* positions,
          float base, bool neox, std::span<const float> divisors = {});

}  // namespace depcache

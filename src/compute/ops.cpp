#include "compute/ops.h"

#include <cmath>
#include <vector>

#include "compute/vec.h"
#include "util/error.h"

namespace depcache {

void rms_norm(const float* x, const float* w, float* out, int64_t n_rows, int64_t n, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* o = out + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
    for (int64_t i = 0; i < n; ++i) o[i] = xr[i] * inv * w[i];
  }
}

void add_bias(float* x, const float* b, int64_t n_rows, int64_t n) {
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < n; ++i) x[r * n + i] += b[i];
}

void swiglu(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = vec::exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

// gelu_tanh(g) = 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3).
void geglu(float* gate, const float* up, int64_t n) {
  constexpr float k2 = 2.0f * 0.7978845608028654f;  // 2 sqrt(2/pi)
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 u2 = _mm256_mul_ps(_mm256_set1_ps(k2), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
    const __m256 e = vec::exp(_mm256_sub_ps(_mm256_setzero_ps(), u2));
    const __m256 gelu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-k2 * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void RopeTable::build(const int32_t* positions, int64_t n_rows, int rot, float base,
                      std::span<const float> divisors) {
  n_rot = rot;
  const int half = rot / 2;
  if (!divisors.empty() && static_cast<int>(divisors.size()) != half)
    fail(ErrorKind::Internal, "{} rope divisors for {} rotary pairs", divisors.size(), half);
  std::vector<double> inv_freq(half);
  for (int i = 0; i < half; ++i)
    inv_freq[i] = std::pow(double(base), -2.0 * i / rot) / (divisors.empty() ? 1.0 : double(divisors[i]));
  cos.resize(n_rows * half);
  sin.resize(n_rows * half);
  for (int64_t r = 0; r < n_rows; ++r)
    for (int i = 0; i < half; ++i) {
      const double theta = positions[r] * inv_freq[i];
      cos[r * half + i] = static_cast<float>(std::cos(theta));
      sin[r * half + i] = static_cast<float>(std::sin(theta));
    }
}

void rope(float* x, int64_t n_rows, int n_heads, int head_dim, const RopeTable& table, bool neox,
          int64_t first_row) {
  const int half = table.n_rot / 2;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* cs = table.cos.data() + (first_row + r) * half;
    const float* sn = table.sin.data() + (first_row + r) * half;
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (r * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cs[i] - x1 * sn[i];
        v[b] = x0 * sn[i] + x1 * cs[i];
      }
    }
  }
}

void rope(float* x, int64_t n_rows, int n_heads, int head_dim, int n_rot, const int32_t* positions,
          float base, bool neox, std::span<const float> divisors) {
  RopeTable table;
  table.build(positions, n_rows, n_rot, base, divisors);
  rope(x, n_rows, n_heads, head_dim, table, neox);
}

}  // namespace depcache

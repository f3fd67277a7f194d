#pragma once
// Comparisons of numeric arrays that never hide a NaN or an Inf. A plain
// max(d, |a - b|) skips NaN (every comparison with it is false), so NaN
// logits would report a difference of 0; here any non-finite value, and a
// length mismatch, is an infinite difference.
#include <cmath>
#include <limits>
#include <span>

namespace depcache {

template <class T>
bool all_finite(std::span<const T> v) {
  for (const T x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// max_i |a_i - b_i| in double; +inf when the lengths differ or any value is
// not finite.
template <class A, class B>
double max_abs_difference(std::span<const A> a, std::span<const B> b) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (a.size() != b.size()) return kInf;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!std::isfinite(d)) return kInf;
    if (d > m) m = d;
  }
  return m;
}

}  // namespace depcache

#pragma once
// Order statistics of measured values (latencies, sizes).
#include <algorithm>
#include <cmath>
#include <vector>

namespace depcache {

// p-th percentile (0..100) of ascending values, nearest rank; T{} for none.
template <class T>
T percentile_sorted(const std::vector<T>& sorted, double p) {
  if (sorted.empty()) return T{};
  const double rank = std::ceil(p / 100.0 * static_cast<double>(sorted.size()));
  return sorted[static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(sorted.size()))) - 1];
}

// The same over unsorted values.
inline double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return percentile_sorted(values, p);
}

// Arithmetic mean; 0 for none.
inline double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return values.empty() ? 0 : sum / static_cast<double>(values.size());
}

}  // namespace depcache

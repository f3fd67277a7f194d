#pragma once
// RAGCache's cost model for PGDSF: the time to prefill `fresh` tokens after
// `cached` ones, measured on a grid and read between grid points by bilinear
// interpolation (linear extrapolation beyond the grid's edges, never below
// zero). The index asks it for a node's recompute cost: its tokens after the
// sequence before it.
#include <cstdint>
#include <string>
#include <vector>

namespace depcache {

class PrefillCostTable {
 public:
  // ms[i * fresh.size() + j]: time for fresh[j] tokens after cached[i].
  // Both axes strictly increasing, at least two points each.
  PrefillCostTable(std::vector<int64_t> cached, std::vector<int64_t> fresh, std::vector<double> ms);
  double operator()(int64_t cached, int64_t fresh) const;
  const std::vector<int64_t>& cached_axis() const { return cached_; }
  const std::vector<int64_t>& fresh_axis() const { return fresh_; }
  double at(size_t i, size_t j) const { return ms_[i * fresh_.size() + j]; }
  std::string to_string() const;  // the grid as a small table

 private:
  std::vector<int64_t> cached_, fresh_;
  std::vector<double> ms_;
};

}  // namespace depcache

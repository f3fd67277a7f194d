#include "kv/cost_table.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/error.h"

namespace depcache {
namespace {

// The cell [k, k + 1] of an axis holding x (the edge cells beyond it) and
// x's position in it (outside [0, 1] when extrapolating).
std::pair<size_t, double> cell(const std::vector<int64_t>& axis, int64_t x) {
  size_t k = static_cast<size_t>(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin());
  k = std::clamp<size_t>(k, 1, axis.size() - 1) - 1;
  const double t = static_cast<double>(x - axis[k]) / static_cast<double>(axis[k + 1] - axis[k]);
  return {k, t};
}

}  // namespace

PrefillCostTable::PrefillCostTable(std::vector<int64_t> cached, std::vector<int64_t> fresh,
                                   std::vector<double> ms)
    : cached_(std::move(cached)), fresh_(std::move(fresh)), ms_(std::move(ms)) {
  const auto increasing = [](const std::vector<int64_t>& a) {
    return a.size() >= 2 && std::adjacent_find(a.begin(), a.end(), std::greater_equal<>()) == a.end();
  };
  if (!increasing(cached_) || !increasing(fresh_))
    fail(ErrorKind::InvalidInput, "cost table axes must be strictly increasing with two points or more");
  if (ms_.size() != cached_.size() * fresh_.size())
    fail(ErrorKind::InvalidInput, "cost table: {} times for a {} x {} grid", ms_.size(), cached_.size(),
         fresh_.size());
}

double PrefillCostTable::operator()(int64_t cached, int64_t fresh) const {
  const auto [i, u] = cell(cached_, cached);
  const auto [j, v] = cell(fresh_, fresh);
  const double t = (1 - u) * (1 - v) * at(i, j) + (1 - u) * v * at(i, j + 1) + u * (1 - v) * at(i + 1, j) +
                   u * v * at(i + 1, j + 1);
  return std::max(t, 0.0);
}

std::string PrefillCostTable::to_string() const {
  std::string s = fmt::format("{:>12}", "cached\\new");
  for (int64_t f : fresh_) s += fmt::format(" {:>9}", f);
  s += '\n';
  for (size_t i = 0; i < cached_.size(); ++i) {
    s += fmt::format("{:>12}", cached_[i]);
    for (size_t j = 0; j < fresh_.size(); ++j) s += fmt::format(" {:>7.1f}ms", at(i, j));
    s += '\n';
  }
  return s;
}

}  // namespace depcache

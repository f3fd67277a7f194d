#include "strategy/lookahead.h"

#include <unordered_set>

namespace depcache {

std::unordered_map<int32_t, double> lookahead_weights(const RadixIndex& index,
                                                      std::span<const std::vector<Lookup>* const> queue) {
  std::unordered_map<int32_t, double> weights;
  const auto n = static_cast<double>(queue.size());
  for (size_t q = 0; q < queue.size(); ++q) {
    const double w = (n - static_cast<double>(q)) / n;
    // Once per request per node: a trunk shared by a request's paths is one use.
    std::unordered_set<int32_t> used;
    for (const Lookup& l : *queue[q])
      for (const RadixIndex::Piece& p : index.peek(l.ns, l.tokens).pieces) used.insert(p.node);
    for (int32_t node : used) weights[node] += w;
  }
  return weights;
}

}  // namespace depcache

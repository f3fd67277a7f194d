#include "strategy/lookahead.h"

namespace depcache {

std::unordered_map<int32_t, double> lookahead_weights(const RadixIndex& index,
                                                      std::span<const std::vector<Lookup>* const> queue) {
  std::unordered_map<int32_t, double> weights;
  const auto n = static_cast<double>(queue.size());
  for (size_t q = 0; q < queue.size(); ++q) {
    const double w = (n - static_cast<double>(q)) / n;
    for (const Lookup& l : *queue[q])
      for (const RadixIndex::Piece& p : index.peek(l.ns, l.tokens).pieces) weights[p.node] += w;
  }
  return weights;
}

}  // namespace depcache

#pragma once
// What the pending queue tells the cache: DepCache's lookahead weight per
// index node (LACR's future term), shared by the live engine and the
// simulator.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/radix_index.h"
#include "strategy/strategy.h"

namespace depcache {

// Weight per node of the pending requests that will use it: 1 for the next
// request, falling linearly with queue position.
std::unordered_map<int32_t, double> lookahead_weights(const RadixIndex& index,
                                                      std::span<const std::vector<Lookup>* const> queue);

}  // namespace depcache

// LACR's lookahead weights over the pending queue against a brute-force
// count: each pending request adds its weight (1 for the next, falling
// linearly) once to every node it will use, however many of its paths
// share the node.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "kv/radix_index.h"
#include "strategy/lookahead.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

TEST(Lookahead, WeightsEqualABruteForceCountOncePerRequest) {
  RadixIndex index(1 << 20);
  using Tokens = std::vector<int32_t>;
  const std::vector<Tokens> paths = {{1, 2, 3}, {1, 2, 4}, {1, 5}, {7, 8}, {7, 8, 9}};
  for (const Tokens& p : paths) index.insert_virtual(1, p, 8);
  // Requests: a tree of three paths (trunk {1} shared, {1 2} shared by two),
  // one path, the first again, a request with nothing cached.
  const std::vector<std::vector<Lookup>> queue = {{{1, paths[0]}, {1, paths[1]}, {1, paths[2]}},
                                                  {{1, paths[4]}},
                                                  {{1, paths[0]}, {1, paths[2]}},
                                                  {{1, {42}}}};
  std::vector<const std::vector<Lookup>*> pending;
  for (const auto& q : queue) pending.push_back(&q);
  const auto weights = lookahead_weights(index, pending);
  std::map<int32_t, double> want;
  const double n = static_cast<double>(queue.size());
  for (size_t q = 0; q < queue.size(); ++q) {
    std::set<int32_t> used;
    for (const Lookup& l : queue[q])
      for (const auto& p : index.peek(l.ns, l.tokens).pieces) used.insert(p.node);
    for (int32_t node : used) want[node] += (n - static_cast<double>(q)) / n;
  }
  ASSERT_EQ(weights.size(), want.size());
  for (const auto& [node, w] : want) EXPECT_DOUBLE_EQ(weights.at(node), w) << "node " << node;
  // The trunk {1}: requests 0 and 2, once each: 1 + 0.5.
  EXPECT_DOUBLE_EQ(weights.at(index.peek(1, Tokens{1}).pieces.front().node), 1.0 + 0.5);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// Dependency attention as a visibility: each computed token sees exactly the
// rows DepPrompt says it depends on.
#include <gtest/gtest.h>

#include <random>

#include "strategy/dependency_visibility.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::rows_seen;

// On random DepPrompts, computing any node-suffix-closed subset of tokens
// gives each computed token exactly DepPrompt::visible_ranges.
TEST(DependencyVisibility, MatchesTheDepPrompt) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    DepPrompt p;
    p.add_linear("system", std::vector<int32_t>(1 + rng() % 3, 1));
    for (int t = 0; t < 1 + static_cast<int>(rng() % 3); ++t) {
      std::vector<std::vector<int32_t>> paths;
      for (int i = 0; i < 1 + static_cast<int>(rng() % 5); ++i) {
        std::vector<int32_t> path(1 + rng() % 4);
        for (auto& tok : path) tok = static_cast<int32_t>(rng() % 3);
        paths.push_back(path);
      }
      p.add_tree("t", paths);
    }
    p.add_linear("task", std::vector<int32_t>{5, 6});
    // Per node, compute a random suffix (possibly all or none).
    std::vector<int64_t> rows;
    for (const PromptNode& node : p.nodes()) {
      const int32_t keep = static_cast<int32_t>(rng() % (node.tokens.size() + 1));
      for (int32_t r = node.tokens.end - keep; r < node.tokens.end; ++r) rows.push_back(r);
    }
    std::sort(rows.begin(), rows.end());
    if (rows.empty()) continue;
    const Visibility v = dependency_dag(p, rows);
    for (size_t q = 0; q < rows.size(); ++q) {
      std::vector<int64_t> want;
      for (const TokenRange& r : p.visible_ranges(static_cast<int32_t>(rows[q])))
        for (int32_t j = r.begin; j < r.end; ++j) want.push_back(j);
      ASSERT_EQ(rows_seen(v, static_cast<int64_t>(q)), want) << "trial " << trial << " row " << rows[q];
    }
  }
}

TEST(DependencyVisibility, NeedsNodeSuffixes) {
  DepPrompt p;
  p.add_linear("system", std::vector<int32_t>{1, 2, 3});
  p.add_linear("task", std::vector<int32_t>{4});
  // Rows 0 and 1 of the system node without row 2: not a suffix of the node.
  const std::vector<int64_t> rows = {0, 1, 3};
  EXPECT_THROW(dependency_dag(p, rows), Error);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

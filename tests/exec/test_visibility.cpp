// Visibility builders: each gives every query exactly the rows its rule says.
#include <gtest/gtest.h>

#include <random>

#include "exec/visibility.h"
#include "util/error.h"

namespace depcache {
namespace {

std::vector<int64_t> rows_seen(const Visibility& v, int64_t q) {
  std::vector<int64_t> rows;
  for (const RowRange& r : v.visible(q))
    for (int64_t j = r.begin; j < r.end; ++j) rows.push_back(j);
  return rows;
}

std::vector<int64_t> iota_rows(int64_t begin, int64_t end) {
  std::vector<int64_t> v;
  for (int64_t j = begin; j < end; ++j) v.push_back(j);
  return v;
}

TEST(Visibility, CausalChainAndCausalByPosition) {
  const Visibility chain = causal_chain(5, 3);
  for (int64_t q = 0; q < 5; ++q) EXPECT_EQ(rows_seen(chain, q), iota_rows(0, 3 + q + 1));
  const std::vector<int64_t> rows = {2, 3, 7, 9, 10};
  const Visibility scattered = causal_by_position(rows);
  EXPECT_EQ(scattered.groups().size(), 3u);  // runs 2-3, 7, 9-10
  for (int64_t q = 0; q < 5; ++q) EXPECT_EQ(rows_seen(scattered, q), iota_rows(0, rows[q] + 1));
}

// Cutting a batch's queries into pieces keeps what each query sees.
TEST(Visibility, SlicesKeepEveryQuerysRows) {
  const std::vector<RowRange> shared = {{0, 3}}, blocks = {{3, 6}, {6, 10}};
  const Visibility v = block_diagonal(shared, blocks);
  for (int64_t cut = 1; cut < v.n_queries(); ++cut)
    for (const auto& [begin, end] : {std::pair{int64_t{0}, cut}, std::pair{cut, v.n_queries()}}) {
      const Visibility piece = slice_queries(v, begin, end);
      ASSERT_EQ(piece.n_queries(), end - begin);
      for (int64_t q = begin; q < end; ++q) EXPECT_EQ(rows_seen(piece, q - begin), rows_seen(v, q)) << cut;
    }
  EXPECT_THROW(slice_queries(v, 2, 2), Error);
  EXPECT_THROW(slice_queries(v, 0, v.n_queries() + 1), Error);
}

TEST(Visibility, BlockDiagonalChunks) {
  const std::vector<RowRange> shared = {{0, 3}}, blocks = {{3, 6}, {6, 10}};
  const Visibility v = block_diagonal(shared, blocks);
  EXPECT_EQ(v.n_queries(), 7);
  EXPECT_EQ(rows_seen(v, 1), (std::vector<int64_t>{0, 1, 2, 3, 4}));  // row 4: shared + its block so far
  EXPECT_EQ(rows_seen(v, 4), (std::vector<int64_t>{0, 1, 2, 6, 7}));  // row 7: not the first block
  EXPECT_EQ(v.n_pairs(), 3 * 3 + 6 + 4 * 3 + 10);
}

// On random DepPrompts, computing any node-suffix-closed subset of tokens
// gives each computed token exactly DepPrompt::visible_ranges.
TEST(Visibility, DependencyDagMatchesTheDepPrompt) {
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

TEST(Visibility, DependencyDagNeedsNodeSuffixes) {
  DepPrompt p;
  p.add_linear("system", std::vector<int32_t>{1, 2, 3});
  p.add_linear("task", std::vector<int32_t>{4});
  // Rows 0 and 1 of the system node without row 2: not a suffix of the node.
  const std::vector<int64_t> rows = {0, 1, 3};
  EXPECT_THROW(dependency_dag(p, rows), Error);
}

}  // namespace
}  // namespace depcache

// Visibility builders: each gives every query exactly the rows its rule says.
#include <gtest/gtest.h>

#include "exec/visibility.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::rows_seen;

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

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

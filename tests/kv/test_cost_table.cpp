// PGDSF's prefill cost table: bilinear interpolation is exact on bilinear
// costs, between and beyond grid points; malformed grids are rejected.
#include <gtest/gtest.h>

#include "kv/cost_table.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

double bilinear(int64_t c, int64_t n) { return 1.0 + 0.02 * c + 0.3 * n + 0.001 * c * n; }

TEST(PrefillCostTable, InterpolatesAndExtrapolatesBilinearCostsExactly) {
  const std::vector<int64_t> cached = {0, 100, 400}, fresh = {8, 32, 128};
  std::vector<double> ms;
  for (int64_t c : cached)
    for (int64_t n : fresh) ms.push_back(bilinear(c, n));
  const PrefillCostTable t(cached, fresh, ms);
  for (int64_t c : {0, 50, 100, 399, 250, 1000})
    for (int64_t n : {8, 9, 20, 128, 300}) EXPECT_NEAR(t(c, n), bilinear(c, n), 1e-9) << c << " " << n;
  EXPECT_NE(t.to_string().find("cached"), std::string::npos);
}

TEST(PrefillCostTable, NeverNegativeAndRejectsBadGrids) {
  const PrefillCostTable t({0, 10}, {1, 2}, {1.0, 2.0, 1.0, 2.0});
  EXPECT_EQ(t(0, -100), 0.0);  // extrapolated below zero: clipped
  EXPECT_THROW(PrefillCostTable({0}, {1, 2}, {1, 2}), Error);
  EXPECT_THROW(PrefillCostTable({0, 0}, {1, 2}, {1, 2, 3, 4}), Error);
  EXPECT_THROW(PrefillCostTable({0, 1}, {1, 2}, {1, 2, 3}), Error);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

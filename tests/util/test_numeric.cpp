// Comparisons never hide a NaN or an Inf: every max-difference helper the
// tests and `run --verify` use reports an infinite difference for them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "test_support.h"
#include "util/numeric.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Numeric, NonFiniteValuesAreAnInfiniteDifference) {
  const std::vector<float> a = {1.0f, 2.0f, 3.0f};
  const auto diff = [&a](std::vector<float> b) {
    return max_abs_difference(std::span<const float>(a), std::span<const float>(b));
  };
  EXPECT_EQ(diff({1.0f, 2.5f, 3.0f}), 0.5);
  EXPECT_EQ(diff({1.0f, kNan, 3.0f}), INFINITY);
  EXPECT_EQ(diff({kNan, kNan, kNan}), INFINITY);
  EXPECT_EQ(diff({1.0f, 2.0f, kInf}), INFINITY);
  EXPECT_EQ(diff({1.0f, 2.0f, -kInf}), INFINITY);
  EXPECT_EQ(diff({1.0f, 2.0f}), INFINITY) << "lengths differ";
  // Both sides the same infinity: still not a pass.
  const std::vector<float> inf = {kInf};
  EXPECT_EQ(max_abs_difference(std::span<const float>(inf), std::span<const float>(inf)), INFINITY);
  EXPECT_TRUE(all_finite(std::span<const float>(a)));
  EXPECT_FALSE(all_finite(std::span<const float>(inf)));
}

// The test helpers route through the same comparison: NaN logits against
// any tolerance fail.
TEST(Numeric, TestHelpersReportNonFiniteAsInfinite) {
  const std::vector<float> good = {0.5f, -0.25f}, nan = {0.5f, kNan};
  const std::vector<double> ref = {0.5, -0.25}, ref_nan = {0.5, std::nan("")};
  EXPECT_EQ(test::max_abs_diff(good, good, "equal"), 0.0);
  EXPECT_EQ(test::max_abs_diff(good, nan, "NaN on the right"), INFINITY);
  EXPECT_EQ(test::max_abs_diff(nan, good, "NaN on the left"), INFINITY);
  EXPECT_EQ(test::max_abs_diff(nan.data(), good.data(), 2, "NaN by pointer"), INFINITY);
  EXPECT_EQ(test::max_abs_diff(nan, ref, "NaN against float64"), INFINITY);
  EXPECT_EQ(test::max_rel_diff(good, ref, "relative, equal"), 0.0);
  EXPECT_EQ(test::max_rel_diff(nan, ref, "relative, NaN"), INFINITY);
  EXPECT_EQ(test::max_rel_diff(good, ref_nan, "relative, NaN reference"), INFINITY);
  EXPECT_EQ(test::max_abs_diff(good, std::vector<float>{0.5f}, "short"), INFINITY);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// The KV storage codec against its definition, computed here in float64 from
// the raw bytes: f16 rounds to nearest, q8_0 blocks hold an fp16 scale
// amax / 127 and values within half a step of the input; non-finite input
// reads back NaN in every type; rows of partial q8_0 blocks are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "compute/fp16.h"
#include "compute/kv_format.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

double q8_value(const std::vector<uint8_t>& b, size_t at, double* scale = nullptr) {
  const uint8_t* blk = b.data() + (at / 32) * 34;
  uint16_t d;
  std::memcpy(&d, blk, 2);
  if (scale) *scale = fp16_to_fp32(d);
  return double(fp16_to_fp32(d)) * static_cast<int8_t>(blk[2 + at % 32]);
}

TEST(KvFormat, Q8RowsAreWithinHalfAStepOfTheInput) {
  const int64_t row = 96, n_rows = 7;
  auto x = test::randn(row * n_rows, 21);
  for (int64_t i = 0; i < row; ++i) x[i] *= 1e-3f;  // small values: a small scale
  x[row + 5] = 0;
  for (int64_t i = 2 * row; i < 2 * row + 32; ++i) x[i] = 0;  // an all-zero block
  std::vector<uint8_t> b(kv_row_bytes(DType::Q8_0, row) * n_rows);
  ASSERT_EQ(b.size(), size_t(n_rows * 3 * 34));
  kv_encode(DType::Q8_0, x.data(), b.data(), n_rows, row);
  std::vector<float> back(x.size());
  kv_decode(DType::Q8_0, b.data(), back.data(), n_rows, row);
  for (size_t blk = 0; blk < x.size() / 32; ++blk) {
    double amax = 0;
    for (size_t i = blk * 32; i < blk * 32 + 32; ++i) amax = std::max(amax, std::fabs(double(x[i])));
    double scale = 0;
    q8_value(b, blk * 32, &scale);
    EXPECT_EQ(fp32_to_fp16(scale), fp32_to_fp16(static_cast<float>(amax / 127))) << "block " << blk;
    for (size_t i = blk * 32; i < blk * 32 + 32; ++i) {
      const double want = q8_value(b, i);
      EXPECT_EQ(back[i], want) << i;  // decode is the definition, exactly
      EXPECT_LE(std::fabs(want - x[i]), 0.5 * scale * (1 + 1e-4) + 1e-30) << i;
    }
  }
  // Parts of rows (a head's slice) read the same values, across block edges.
  std::vector<float> part(50);
  kv_decode_part(DType::Q8_0, b.data() + kv_row_bytes(DType::Q8_0, row) * 3, 23, 50, part.data());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(part[i], back[3 * row + 23 + i]) << i;
}

TEST(KvFormat, F16AndF32RowsRoundTrip) {
  const int64_t row = 40;
  const auto x = test::randn(row * 3, 5);
  for (DType t : {DType::F32, DType::F16}) {
    std::vector<uint8_t> b(kv_row_bytes(t, row) * 3);
    kv_encode(t, x.data(), b.data(), 3, row);
    std::vector<float> back(x.size()), part(17);
    kv_decode(t, b.data(), back.data(), 3, row);
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(back[i], t == DType::F32 ? x[i] : fp16_to_fp32(fp32_to_fp16(x[i]))) << kv_type_name(t) << i;
    kv_decode_part(t, b.data() + kv_row_bytes(t, row), 9, 17, part.data());
    for (int i = 0; i < 17; ++i) EXPECT_EQ(part[i], back[row + 9 + i]);
  }
}

TEST(KvFormat, NonFiniteInputReadsBackNan) {
  const int64_t row = 64;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY, 3e38f}) {
    auto x = test::randn(row, 3);
    x[40] = bad;
    std::vector<uint8_t> b(kv_row_bytes(DType::Q8_0, row));
    kv_encode(DType::Q8_0, x.data(), b.data(), 1, row);
    std::vector<float> back(row);
    kv_decode(DType::Q8_0, b.data(), back.data(), 1, row);
    for (int i = 0; i < 32; ++i) EXPECT_FALSE(std::isnan(back[i])) << "the other block, " << i;
    // 3e38 is finite but its scale is not an fp16 number: the block is NaN too.
    for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(back[i])) << bad << " at " << i;
  }
}

TEST(KvFormat, RowsOfPartialBlocksAreRefusedByName) {
  EXPECT_TRUE(kv_type_fits(DType::Q8_0, 128));
  EXPECT_TRUE(kv_type_fits(DType::F16, 16));
  EXPECT_FALSE(kv_type_fits(DType::Q8_0, 16));
  EXPECT_FALSE(kv_type_fits(DType::Q4_0, 128));
  EXPECT_NE(kv_type_refusal(DType::Q8_0, 16).find("blocks of 32"), std::string::npos);
  try {
    kv_row_bytes(DType::Q8_0, 48);
    FAIL() << "48 elements are not whole q8_0 blocks";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("use f16"), std::string::npos) << e.what();
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

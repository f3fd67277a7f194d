// Range-based attention against a float64 softmax over explicit row sets:
// groups with context ranges and causal runs, GQA, f16 KV, query id lists,
// attention mass, and the validation of visibility lists.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "compute/attention.h"
#include "compute/dot.h"
#include "compute/vec.h"
#include "test_support.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

using test::randn;

struct Kv {
  int n_head_kv, hd;
  std::vector<float> k, v;
  std::vector<uint16_t> k16, v16;
  Kv(int64_t n_rows, int n_head_kv_, int hd_, uint32_t seed)
      : n_head_kv(n_head_kv_),
        hd(hd_),
        k(randn(n_rows * n_head_kv_ * hd_, seed)),
        v(randn(n_rows * n_head_kv_ * hd_, seed + 1)) {
    for (float x : k) k16.push_back(vec::f32_to_f16(x));
    for (float x : v) v16.push_back(vec::f32_to_f16(x));
  }
  int64_t row() const { return int64_t{n_head_kv} * hd; }
  KvLayerView view(bool f16) const {
    return {f16 ? static_cast<const void*>(k16.data()) : k.data(),
            f16 ? static_cast<const void*>(v16.data()) : v.data(), f16, row()};
  }
  double key(bool f16, int64_t j, int kvh, int i) const {
    const size_t at = j * row() + kvh * hd + i;
    return f16 ? vec::f16_to_f32(k16[at]) : k[at];
  }
  double val(bool f16, int64_t j, int kvh, int i) const {
    const size_t at = j * row() + kvh * hd + i;
    return f16 ? vec::f16_to_f32(v16[at]) : v[at];
  }
};

// float64 softmax attention of one query head over explicit rows.
std::vector<double> reference(const Kv& kv, bool f16, const float* q, int kvh,
                              const std::vector<int64_t>& rows, double softcap = 0) {
  std::vector<double> s(rows.size()), out(kv.hd, 0.0);
  double m = -INFINITY, sum = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    double d = 0;
    for (int i = 0; i < kv.hd; ++i) d += q[i] * kv.key(f16, rows[r], kvh, i);
    s[r] = d / std::sqrt(double(kv.hd));
    if (softcap > 0) s[r] = softcap * std::tanh(s[r] / softcap);
    m = std::max(m, s[r]);
  }
  for (double& e : s) sum += (e = std::exp(e - m));
  for (size_t r = 0; r < rows.size(); ++r)
    for (int i = 0; i < kv.hd; ++i) out[i] += s[r] / sum * kv.val(f16, rows[r], kvh, i);
  return out;
}

std::vector<int64_t> rows_of(const std::vector<RowRange>& ranges) {
  std::vector<int64_t> rows;
  for (const RowRange& r : ranges)
    for (int64_t j = r.begin; j < r.end; ++j) rows.push_back(j);
  return rows;
}

TEST(Attention, RangesMatchFloat64SoftmaxWithGqaAndF16) {
  const int n_head = 4, n_head_kv = 2, hd = 24;
  const Kv kv(300, n_head_kv, hd, 3);
  // Group 0: a causal chain over rows 0..69 (spans key blocks); group 1: two
  // context ranges then its own run at 200..; group 2: one token seeing
  // everything up to row 250 (a recomputed token).
  const Visibility vis({{0, 70, {}, 0, 0}, {70, 5, {{3, 40}, {100, 180}}, 195, 200}, {75, 1, {}, 0, 250}});
  const int64_t n_q = vis.n_queries();
  EXPECT_EQ(n_q, 76);
  const auto q = randn(n_q * n_head * hd, 5);
  ThreadPool pool(2);
  int64_t pairs = 0;
  for (int64_t t = 0; t < n_q; ++t) pairs += static_cast<int64_t>(rows_of(vis.visible(t)).size());
  EXPECT_EQ(vis.n_pairs(), pairs);
  EXPECT_EQ(vis.visible(72), (std::vector<RowRange>{{3, 40}, {100, 180}, {195, 203}}));
  const Isa saved = current_isa();
  for (Isa isa : {Isa::Avx2, Isa::Avx512})  // 8- and 16-lane kernels
    for (bool f16 : {false, true})
      for (float softcap : {0.0f, 0.7f}) {  // Gemma 2's soft-capped scores too
        if (!test::isa_available(isa)) continue;
        set_isa(isa);
        std::vector<float> out(q.size());
        attention(q.data(), n_q, {}, vis, kv.view(f16), n_head, n_head_kv, hd, out.data(), pool, softcap);
        std::vector<double> ref;
        for (int64_t t = 0; t < n_q; ++t)
          for (int h = 0; h < n_head; ++h) {
            const auto r =
                reference(kv, f16, &q[(t * n_head + h) * hd], h / 2, rows_of(vis.visible(t)), softcap);
            ref.insert(ref.end(), r.begin(), r.end());
          }
        const std::string label = std::string(f16 ? "f16 " : "f32 ") + std::string(isa_name(isa)) +
                                  (softcap > 0 ? " soft-capped" : "");
        EXPECT_LT(test::max_abs_diff(out, ref, label), 1e-5) << label;
      }
  set_isa(saved);
}

// A subset of queries, given by id: rows of q and out are compact.
TEST(Attention, QueryIdsSelectASubset) {
  const int n_head = 2, n_head_kv = 1, hd = 16;
  const Kv kv(40, n_head_kv, hd, 7);
  const Visibility vis({{0, 30, {}, 0, 10}});
  const auto q_all = randn(30 * n_head * hd, 9);
  const std::vector<int64_t> ids = {2, 17, 29};
  std::vector<float> q_sub, out_all(q_all.size()), out_sub(ids.size() * n_head * hd);
  for (int64_t id : ids) q_sub.insert(q_sub.end(), &q_all[id * n_head * hd], &q_all[(id + 1) * n_head * hd]);
  ThreadPool pool(2);
  attention(q_all.data(), 30, {}, vis, kv.view(false), n_head, n_head_kv, hd, out_all.data(), pool);
  attention(q_sub.data(), 3, ids, vis, kv.view(false), n_head, n_head_kv, hd, out_sub.data(), pool);
  for (size_t r = 0; r < ids.size(); ++r)
    for (int i = 0; i < n_head * hd; ++i)
      EXPECT_EQ(out_sub[r * n_head * hd + i], out_all[ids[r] * n_head * hd + i]);
}

// A NaN anywhere a query looks makes its output NaN in both kernels (and
// the attention mass NaN): never silently a number.
TEST(Attention, NanPropagates) {
  const int n_head = 2, n_head_kv = 1, hd = 16;
  Kv kv(40, n_head_kv, hd, 7);
  const Visibility vis({{0, 30, {}, 0, 10}});
  auto q = randn(30 * n_head * hd, 9);
  q[5 * n_head * hd + 3] = NAN;  // query 5, head 0
  kv.k[20 * hd + 1] = NAN;       // key row 20: seen by queries from 20 on (row 10 + 10)
  kv.k16[20 * hd + 1] = vec::f32_to_f16(NAN);
  ThreadPool pool(2);
  const Isa saved = current_isa();
  for (Isa isa : {Isa::Avx2, Isa::Avx512})
    for (bool f16 : {false, true}) {
      if (!test::isa_available(isa)) continue;
      set_isa(isa);
      std::vector<float> out(q.size());
      attention(q.data(), 30, {}, vis, kv.view(f16), n_head, n_head_kv, hd, out.data(), pool);
      const std::string label = std::string(isa_name(isa)) + (f16 ? " f16" : " f32");
      EXPECT_TRUE(std::isnan(out[5 * n_head * hd])) << label << ": the NaN query's head";
      EXPECT_FALSE(std::isnan(out[5 * n_head * hd + hd])) << label << ": its other head";
      EXPECT_FALSE(std::isnan(out[9 * n_head * hd])) << label << ": a query before the NaN key";
      EXPECT_TRUE(std::isnan(out[12 * n_head * hd])) << label << ": a query that sees the NaN key";
    }
  set_isa(saved);
}

TEST(Attention, MassOverTargetsIsTheSoftmaxShare) {
  const int n_head = 2, n_head_kv = 1, hd = 8;
  const Kv kv(20, n_head_kv, hd, 11);
  const auto q = randn(n_head * hd, 13);
  const std::vector<RowRange> visible = {{0, 5}, {8, 20}};
  const std::vector<RowRange> targets = {{0, 5}, {8, 12}, {12, 20}, {5, 8}};
  const auto mass = attention_mass(q.data(), visible, targets, kv.view(false), n_head, n_head_kv, hd);
  ASSERT_EQ(mass.size(), 4u);
  EXPECT_NEAR(mass[0] + mass[1] + mass[2], 1.0, 1e-9);
  EXPECT_EQ(mass[3], 0.0);  // not visible
  // Reference for target 1, per head.
  double want = 0;
  for (int h = 0; h < n_head; ++h) {
    std::vector<double> s;
    double m = -INFINITY, sum = 0, part = 0;
    for (int64_t j : rows_of(visible)) {
      double d = 0;
      for (int i = 0; i < hd; ++i) d += q[h * hd + i] * kv.key(false, j, 0, i);
      s.push_back(d / std::sqrt(double(hd)));
      m = std::max(m, s.back());
    }
    const auto rows = rows_of(visible);
    for (size_t r = 0; r < rows.size(); ++r) {
      const double e = std::exp(s[r] - m);
      sum += e;
      if (rows[r] >= 8 && rows[r] < 12) part += e;
    }
    want += part / sum / n_head;
  }
  EXPECT_NEAR(mass[1], want, 1e-6);
}

TEST(Attention, MalformedVisibilityIsRejected) {
  EXPECT_THROW(Visibility({{1, 2, {}, 0, 0}}), Error);                    // does not start at query 0
  EXPECT_THROW(Visibility({{0, 2, {}, 5, 3}}), Error);                    // causal run after its first row
  EXPECT_THROW(Visibility({{0, 2, {{4, 6}, {5, 7}}, 10, 10}}), Error);    // overlapping context
  EXPECT_THROW(Visibility({{0, 2, {{4, 12}}, 10, 10}}), Error);           // context reaches the causal run
  EXPECT_THROW(Visibility({{0, 2, {}, 0, 0}, {3, 1, {}, 0, 5}}), Error);  // gap between groups
  EXPECT_NO_THROW(Visibility({{0, 2, {{0, 4}}, 10, 10}, {2, 1, {}, 0, 5}}));
}

}  // namespace
}  // namespace depcache

// Range-based attention against a float64 softmax over explicit row sets:
// groups with context ranges and causal runs, GQA, every KV storage type, query id lists,
// attention mass, and the validation of visibility lists.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <tuple>

#include "compute/attention.h"
#include "compute/dot.h"
#include "compute/fp16.h"
#include "compute/kv_format.h"
#include "compute/vec.h"
#include "test_support.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::randn;

// Random K/V rows stored in every KV type; the references read the stored
// values back (decoded here by hand, independently of the codec).
struct Kv {
  int n_head_kv, hd;
  std::vector<float> k, v;
  Kv(int64_t n_rows, int n_head_kv_, int hd_, uint32_t seed)
      : n_head_kv(n_head_kv_),
        hd(hd_),
        k(randn(n_rows * n_head_kv_ * hd_, seed)),
        v(randn(n_rows * n_head_kv_ * hd_, seed + 1)) {}
  int64_t row() const { return int64_t{n_head_kv} * hd; }
  int64_t n_rows() const { return static_cast<int64_t>(k.size()) / row(); }
  // Stored rows of each type, made on first use (after a test edits k or v).
  mutable std::map<DType, std::pair<std::vector<uint8_t>, std::vector<uint8_t>>> stored;
  const std::pair<std::vector<uint8_t>, std::vector<uint8_t>>& bytes(DType t) const {
    auto& b = stored[t];
    if (b.first.empty()) {
      b.first.resize(kv_row_bytes(t, row()) * n_rows());
      b.second.resize(b.first.size());
      kv_encode(t, k.data(), b.first.data(), n_rows(), row());
      kv_encode(t, v.data(), b.second.data(), n_rows(), row());
    }
    return b;
  }
  KvLayerView view(DType t) const {
    return {bytes(t).first.data(), bytes(t).second.data(), t, kv_row_bytes(t, row())};
  }
  static double stored_value(DType t, const std::vector<uint8_t>& b, size_t at) {
    switch (t) {
      case DType::F32: {
        float x;
        std::memcpy(&x, b.data() + 4 * at, 4);
        return x;
      }
      case DType::F16: {
        uint16_t h;
        std::memcpy(&h, b.data() + 2 * at, 2);
        return fp16_to_fp32(h);
      }
      default: {  // q8_0: block at / 32 is 34 bytes, an fp16 scale then 32 int8
        const uint8_t* blk = b.data() + (at / 32) * 34;
        uint16_t d;
        std::memcpy(&d, blk, 2);
        return double(fp16_to_fp32(d)) * static_cast<int8_t>(blk[2 + at % 32]);
      }
    }
  }
  double key(DType t, int64_t j, int kvh, int i) const {
    return stored_value(t, bytes(t).first, j * row() + kvh * hd + i);
  }
  double val(DType t, int64_t j, int kvh, int i) const {
    return stored_value(t, bytes(t).second, j * row() + kvh * hd + i);
  }
};

// float64 softmax attention of one query head over explicit rows.
std::vector<double> reference(const Kv& kv, DType type, const float* q, int kvh,
                              const std::vector<int64_t>& rows, double softcap = 0) {
  std::vector<double> s(rows.size()), out(kv.hd, 0.0);
  double m = -INFINITY, sum = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    double d = 0;
    for (int i = 0; i < kv.hd; ++i) d += q[i] * kv.key(type, rows[r], kvh, i);
    s[r] = d / std::sqrt(double(kv.hd));
    if (softcap > 0) s[r] = softcap * std::tanh(s[r] / softcap);
    m = std::max(m, s[r]);
  }
  for (double& e : s) sum += (e = std::exp(e - m));
  for (size_t r = 0; r < rows.size(); ++r)
    for (int i = 0; i < kv.hd; ++i) out[i] += s[r] / sum * kv.val(type, rows[r], kvh, i);
  return out;
}

std::vector<int64_t> rows_of(const std::vector<RowRange>& ranges) {
  std::vector<int64_t> rows;
  for (const RowRange& r : ranges)
    for (int64_t j = r.begin; j < r.end; ++j) rows.push_back(j);
  return rows;
}

// Heads of 48: in q8_0 each head's slice cuts a block of 32 (read by scalars)
// besides whole blocks (read by vectors).
TEST(Attention, RangesMatchFloat64SoftmaxWithGqaInEveryKvType) {
  const int n_head = 4, n_head_kv = 2, hd = 48;
  const Kv kv(300, n_head_kv, hd, 3);
  // Group 0: a causal chain over rows 0..69 (spans key blocks); group 1: two
  // context ranges then its own run at 200..; group 2: one token seeing
  // everything up to row 250 (a recomputed token).
  // Groups of 11, 13 and 19 queries fill 3, 4 and 5 vectors of 8 lanes: the
  // kernel's register tiles and their remainders.
  const Visibility vis({{0, 70, {}, 0, 0},
                        {70, 5, {{3, 40}, {100, 180}}, 195, 200},
                        {75, 1, {}, 0, 250},
                        {76, 11, {{3, 40}}, 250, 260},
                        {87, 13, {{0, 10}}, 240, 271},
                        {100, 19, {}, 200, 280}});
  const int64_t n_q = vis.n_queries();
  EXPECT_EQ(n_q, 119);
  const auto q = randn(n_q * n_head * hd, 5);
  ThreadPool pool(2);
  int64_t pairs = 0;
  for (int64_t t = 0; t < n_q; ++t) pairs += static_cast<int64_t>(rows_of(vis.visible(t)).size());
  EXPECT_EQ(vis.n_pairs(), pairs);
  EXPECT_EQ(vis.visible(72), (std::vector<RowRange>{{3, 40}, {100, 180}, {195, 203}}));
  const Isa saved = current_isa();
  for (DType type : kv_types())
    for (float softcap : {0.0f, 0.7f}) {  // Gemma 2's soft-capped scores too
      std::vector<double> ref;
      for (int64_t t = 0; t < n_q; ++t)
        for (int h = 0; h < n_head; ++h) {
          const auto r =
              reference(kv, type, &q[(t * n_head + h) * hd], h / 2, rows_of(vis.visible(t)), softcap);
          ref.insert(ref.end(), r.begin(), r.end());
        }
      for (Isa isa : {Isa::Avx2, Isa::Avx512}) {  // 8- and 16-lane kernels
        if (!test::isa_available(isa)) continue;
        set_isa(isa);
        std::vector<float> out(q.size());
        attention(q.data(), n_q, {}, vis, kv.view(type), n_head, n_head_kv, hd, out.data(), pool, softcap);
        const std::string label =
            kv_type_name(type) + " " + std::string(isa_name(isa)) + (softcap > 0 ? " soft-capped" : "");
        EXPECT_LT(test::max_abs_diff(out, ref, label), 1e-5) << label;
      }
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
  attention(q_all.data(), 30, {}, vis, kv.view(DType::F32), n_head, n_head_kv, hd, out_all.data(), pool);
  attention(q_sub.data(), 3, ids, vis, kv.view(DType::F32), n_head, n_head_kv, hd, out_sub.data(), pool);
  for (size_t r = 0; r < ids.size(); ++r)
    for (int i = 0; i < n_head * hd; ++i)
      EXPECT_EQ(out_sub[r * n_head * hd + i], out_all[ids[r] * n_head * hd + i]);
}

// A NaN anywhere a query looks makes its output NaN in both kernels (and
// the attention mass NaN): never silently a number.
TEST(Attention, NanPropagates) {
  const int n_head = 2, n_head_kv = 1, hd = 32;
  Kv kv(40, n_head_kv, hd, 7);
  const Visibility vis({{0, 30, {}, 0, 10}});
  auto q = randn(30 * n_head * hd, 9);
  q[5 * n_head * hd + 3] = NAN;  // query 5, head 0
  kv.k[20 * hd + 1] = NAN;       // key row 20: seen by queries from 20 on (row 10 + 10)
  ThreadPool pool(2);
  const Isa saved = current_isa();
  for (Isa isa : {Isa::Avx2, Isa::Avx512})
    for (DType type : kv_types()) {
      if (!test::isa_available(isa)) continue;
      set_isa(isa);
      std::vector<float> out(q.size());
      attention(q.data(), 30, {}, vis, kv.view(type), n_head, n_head_kv, hd, out.data(), pool);
      const std::string label = std::string(isa_name(isa)) + " " + kv_type_name(type);
      EXPECT_TRUE(std::isnan(out[5 * n_head * hd])) << label << ": the NaN query's head";
      EXPECT_FALSE(std::isnan(out[5 * n_head * hd + hd])) << label << ": its other head";
      EXPECT_FALSE(std::isnan(out[9 * n_head * hd])) << label << ": a query before the NaN key";
      EXPECT_TRUE(std::isnan(out[12 * n_head * hd])) << label << ": a query that sees the NaN key";
    }
  set_isa(saved);
}

// Keys are attended in parts of 1024 KV rows merged in row order. Queries
// over 2,400 rows (three parts; one KV head, so a decode step is one task):
// float64's answer, and the same bits for a query alone, in a batch whose
// few tasks run their parts side by side, on one thread (each task merging
// its own parts) and in a batch of many groups. A NaN key in one part makes
// NaN only the queries that see it.
TEST(Attention, LongKeysRunInPartsWithTheSameBitsHoweverCut) {
  const int n_head = 4, n_head_kv = 1, hd = 32;
  Kv kv(2400, n_head_kv, hd, 13);
  // A decode query at row 2399 seeing [5, 1500) and its run from 2000; three
  // queries at rows 2300.. seeing [0, 2100) and their own run.
  const std::vector<QueryGroup> two = {{0, 1, {{5, 1500}}, 2000, 2399}, {1, 3, {{0, 2100}}, 2300, 2300}};
  const Visibility vis(two);
  std::vector<QueryGroup> many = two;  // and nine short groups after them
  for (int64_t i = 0; i < 9; ++i) many.push_back({4 + i, 1, {}, 100 + 10 * i, 100 + 10 * i});
  const Visibility vis_many(many);
  const auto q = randn(13 * n_head * hd, 17);
  const int64_t stride = int64_t{n_head} * hd;
  ThreadPool two_threads(2), one_thread(1);
  const Isa saved = current_isa();
  for (Isa isa : {Isa::Avx2, Isa::Avx512})
    for (DType type : kv_types()) {
      if (!test::isa_available(isa)) continue;
      set_isa(isa);
      const std::string label = std::string(isa_name(isa)) + " " + kv_type_name(type);
      std::vector<float> out(4 * stride), one(4 * stride), all(13 * stride), alone(stride);
      attention(q.data(), 4, {}, vis, kv.view(type), n_head, n_head_kv, hd, out.data(), two_threads);
      std::vector<double> ref;
      for (int64_t t = 0; t < 4; ++t)
        for (int h = 0; h < n_head; ++h) {
          const auto r = reference(kv, type, &q[(t * n_head + h) * hd], 0, rows_of(vis.visible(t)));
          ref.insert(ref.end(), r.begin(), r.end());
        }
      EXPECT_LT(test::max_abs_diff(out, ref, label), 1e-5) << label;
      attention(q.data(), 4, {}, vis, kv.view(type), n_head, n_head_kv, hd, one.data(), one_thread);
      EXPECT_EQ(one, out) << label << ": one thread";
      attention(q.data(), 13, {}, vis_many, kv.view(type), n_head, n_head_kv, hd, all.data(), two_threads);
      EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + 4 * stride), out) << label << ": many groups";
      for (int64_t id : {0, 2}) {
        attention(q.data() + id * stride, 1, std::vector<int64_t>{id}, vis, kv.view(type), n_head, n_head_kv,
                  hd, alone.data(), two_threads);
        EXPECT_EQ(alone, std::vector<float>(out.begin() + id * stride, out.begin() + (id + 1) * stride))
            << label << ": query " << id << " alone";
      }
    }
  kv.k[1800 * hd + 4] = NAN;  // seen by the three queries only
  kv.stored.clear();
  for (Isa isa : {Isa::Avx2, Isa::Avx512})
    for (DType type : kv_types()) {
      if (!test::isa_available(isa)) continue;
      set_isa(isa);
      std::vector<float> out(4 * stride);
      attention(q.data(), 4, {}, vis, kv.view(type), n_head, n_head_kv, hd, out.data(), two_threads);
      const std::string label = std::string(isa_name(isa)) + " " + kv_type_name(type);
      for (int64_t t = 0; t < 4; ++t)
        EXPECT_EQ(std::isnan(out[t * stride]), t > 0) << label << " query " << t;
    }
  set_isa(saved);
}

// Heads of 48 (a q8_0 head slice cuts blocks), of 64 with two query heads
// per KV head, and seven (Qwen2's groups: scored four heads and three at a
// time); ranges beginning and ending inside the blocks of 16 keys the
// scores are computed in. Every target against a float64 softmax.
TEST(Attention, MassOverTargetsIsTheSoftmaxShare) {
  for (const auto& [n_head, n_head_kv, hd] :
       {std::tuple{2, 2, 48}, std::tuple{4, 2, 64}, std::tuple{14, 2, 64}})
    for (DType type : kv_types()) {
      SCOPED_TRACE(fmt::format("{} heads of {} over {}", n_head, hd, kv_type_name(type)));
      const Kv kv(45, n_head_kv, hd, 11);
      const auto q = randn(n_head * hd, 13);
      const std::vector<RowRange> visible = {{0, 5}, {8, 23}, {30, 45}};
      const std::vector<RowRange> targets = {{0, 5}, {8, 12}, {12, 20}, {5, 8}, {33, 40}};
      const int group = n_head / n_head_kv;
      const auto mass = attention_mass(q.data(), visible, targets, kv.view(type), n_head, n_head_kv, hd);
      ASSERT_EQ(mass.size(), targets.size());
      EXPECT_EQ(mass[3], 0.0);  // not visible
      std::vector<double> want(targets.size(), 0.0);
      double covered = 0;
      for (int h = 0; h < n_head; ++h) {
        std::vector<double> s;
        double m = -INFINITY, sum = 0;
        const auto rows = rows_of(visible);
        for (int64_t j : rows) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[h * hd + i] * kv.key(type, j, h / group, i);
          s.push_back(d / std::sqrt(double(hd)));
          m = std::max(m, s.back());
        }
        for (double x : s) sum += std::exp(x - m);
        for (size_t r = 0; r < rows.size(); ++r)
          for (size_t t = 0; t < targets.size(); ++t)
            if (rows[r] >= targets[t].begin && rows[r] < targets[t].end) {
              want[t] += std::exp(s[r] - m) / sum / n_head;
              covered += std::exp(s[r] - m) / sum / n_head;
            }
      }
      for (size_t t = 0; t < targets.size(); ++t) EXPECT_NEAR(mass[t], want[t], 1e-6) << "target " << t;
      EXPECT_NEAR(std::accumulate(mass.begin(), mass.end(), 0.0), covered, 1e-6);
    }
  // Targets covering every visible row: the masses sum to 1 as the sums they
  // are made of do.
  const Kv kv(20, 2, 64, 5);
  const auto q = randn(4 * 64, 3);
  const std::vector<RowRange> visible = {{0, 20}};
  const auto mass = attention_mass(q.data(), visible, std::vector<RowRange>{{0, 7}, {7, 20}},
                                   kv.view(DType::F32), 4, 2, 64);
  EXPECT_NEAR(mass[0] + mass[1], 1.0, 1e-12);
}

TEST(Attention, MassIsNanWhereAScoreIs) {
  Kv kv(20, 2, 64, 5);
  kv.k[10 * 2 * 64 + 3] = NAN;  // row 10, KV head 0
  const auto q = randn(4 * 64, 3);
  const std::vector<RowRange> targets = {{0, 5}, {12, 20}};
  const auto seen =
      attention_mass(q.data(), std::vector<RowRange>{{0, 20}}, targets, kv.view(DType::F32), 4, 2, 64);
  for (double x : seen) EXPECT_TRUE(std::isnan(x));
  const auto unseen = attention_mass(q.data(), std::vector<RowRange>{{0, 10}, {11, 20}}, targets,
                                     kv.view(DType::F32), 4, 2, 64);
  for (double x : unseen) EXPECT_TRUE(std::isfinite(x));
}

TEST(Attention, MalformedVisibilityIsRejected) {
  EXPECT_THROW(Visibility({{1, 2, {}, 0, 0}}), Error);                    // does not start at query 0
  EXPECT_THROW(Visibility({{0, 2, {}, 5, 3}}), Error);                    // causal run after its first row
  EXPECT_THROW(Visibility({{0, 2, {{4, 6}, {5, 7}}, 10, 10}}), Error);    // overlapping context
  EXPECT_THROW(Visibility({{0, 2, {{4, 12}}, 10, 10}}), Error);           // context reaches the causal run
  EXPECT_THROW(Visibility({{0, 2, {}, 0, 0}, {3, 1, {}, 0, 5}}), Error);  // gap between groups
  EXPECT_NO_THROW(Visibility({{0, 2, {{0, 4}}, 10, 10}, {2, 1, {}, 0, 5}}));
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

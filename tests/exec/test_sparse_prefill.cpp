// The executor primitive: KV spans re-encoded at new positions, sparse
// prefill over an assembly, per-layer active sets and their hook, attention
// statistics, and decoding after a sparse prefill.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "exec/forward.h"
#include "exec/visibility.h"
#include "model/model.h"
#include "test_support.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

std::vector<int32_t> some_tokens(int n, int n_vocab, int salt = 0) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + 11 + salt * 101) % n_vocab;
  return t;
}

// A causal chain of `tokens` at rows row0.. and positions pos0..
PrefillPlan chain_plan(const std::vector<int32_t>& tokens, int64_t row0, int32_t pos0,
                       bool all_logits = false) {
  PrefillPlan p;
  p.tokens = tokens;
  const auto n = static_cast<int64_t>(tokens.size());
  for (int64_t i = 0; i < n; ++i) {
    p.rows.push_back(row0 + i);
    p.positions.push_back(static_cast<int32_t>(pos0 + i));
  }
  p.visibility = causal_chain(n, row0);
  if (all_logits)
    for (int64_t i = 0; i < n; ++i) p.logits_for.push_back(i);
  else
    p.logits_for = {n - 1};
  return p;
}

std::vector<float> rows_of(const KvAssembly& kv, int il, int64_t row0, int64_t n, bool keys) {
  std::vector<float> out(n * kv.row_elems()), k(kv.row_elems()), v(kv.row_elems());
  for (int64_t r = 0; r < n; ++r) {
    kv.read(il, row0 + r, k.data(), v.data());
    std::copy(keys ? k.begin() : v.begin(), keys ? k.end() : v.end(), out.begin() + r * kv.row_elems());
  }
  return out;
}

class BothRopeStyles : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

// An isolated segment computed at positions p.. and moved to p + delta equals
// the segment computed at p + delta, in every layer (keys and values).
TEST_P(BothRopeStyles, SpanRotatedByDeltaEqualsRecomputation) {
  const auto [preset, kv_type] = GetParam();
  const auto m = test::random_model(preset, DType::F32);
  ThreadPool pool(2);
  Forward fwd(m, pool);
  const auto toks = some_tokens(12, m->config().n_vocab);
  for (int delta : {37, -5, 1000}) {
    KvAssembly a(m->config(), 64, kv_type), b(m->config(), 64, kv_type), c(m->config(), 64, kv_type);
    fwd.prefill(chain_plan(toks, 0, 10), a);
    const std::vector<int64_t> rows = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    const KvSpan span = a.extract(rows);
    std::vector<int32_t> shifted;
    for (int i = 0; i < 12; ++i) shifted.push_back(10 + delta + i);
    b.place(span, 0, 12, 20, shifted);  // at other rows too
    fwd.prefill(chain_plan(toks, 0, 10 + delta), c);
    // Relative to the largest value: f32 rounding of the composed rotation;
    // for f16 a second rounding of each key plus what it changes downstream
    // (f16 has a relative step of 2^-11 ≈ 4.9e-4).
    const double rel = kv_type == DType::F32 ? 2e-5 : 2e-3;
    for (int il = 0; il < m->config().n_layer; ++il)
      for (bool keys : {true, false}) {
        const auto want = rows_of(c, il, 0, 12, keys);
        double scale = 1;
        for (float x : want) scale = std::max(scale, std::fabs(double(x)));
        EXPECT_LT(test::max_abs_diff(rows_of(b, il, 20, 12, keys), want, "rotated span vs recomputed"),
                  rel * scale)
            << (keys ? "K" : "V") << " layer " << il << " delta " << delta;
      }
    EXPECT_EQ(b.position(20), 10 + delta);
  }
}

// Not tiny-ministral3: its attention temperature scales queries by their
// absolute position once past the original context, so from the second
// layer on a span's K and V depend on where it was computed, not only on
// relative positions.
INSTANTIATE_TEST_SUITE_P(Models, BothRopeStyles,
                         ::testing::Combine(::testing::Values("tiny", "tiny-partial-rope", "tiny-qwen2",
                                                              "tiny-qwen2-yarn", "tiny-llama3", "tiny-qwen3",
                                                              "tiny-gemma2", "tiny-gemma3", "tiny-phi3",
                                                              "tiny-smollm3"),
                                            ::testing::Values(DType::F32, DType::F16)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) + "_" +
                                              std::string(dtype_info(std::get<1>(info.param)).name);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// q8_0 keys moved to new positions are decoded, rotated and encoded again:
// one rounding more than keys computed there. Measured against f32 keys
// computed at the new positions, the moved keys' error stays within a
// small factor of the error of q8_0 keys computed in place (independent
// roundings of the same size would give a factor of sqrt(2)).
TEST(KvQ8, MovedKeysAddOneRoundingAtMost) {
  for (const char* preset : {"tiny", "tiny-qwen2"}) {
    const auto m = test::random_model(preset, DType::F32);
    ThreadPool pool(2);
    Forward fwd(m, pool);
    const auto toks = some_tokens(24, m->config().n_vocab);
    const int delta = 301;
    KvAssembly source(m->config(), 64, DType::Q8_0), moved(m->config(), 64, DType::Q8_0),
        in_place(m->config(), 64, DType::Q8_0), exact(m->config(), 64, DType::F32);
    fwd.prefill(chain_plan(toks, 0, 0), source);
    fwd.prefill(chain_plan(toks, 0, delta), in_place);
    fwd.prefill(chain_plan(toks, 0, delta), exact);
    std::vector<int64_t> rows(24);
    std::vector<int32_t> shifted(24);
    for (int i = 0; i < 24; ++i) {
      rows[i] = i;
      shifted[i] = delta + i;
    }
    moved.place(source.extract(rows), 0, 24, 0, shifted);
    double err_moved = 0, err_in_place = 0, norm = 0;
    for (int il = 0; il < m->config().n_layer; ++il) {
      const auto want = rows_of(exact, il, 0, 24, true), a = rows_of(moved, il, 0, 24, true),
                 b = rows_of(in_place, il, 0, 24, true);
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(std::isfinite(a[i]) && std::isfinite(b[i]));
        err_moved += (double(a[i]) - want[i]) * (double(a[i]) - want[i]);
        err_in_place += (double(b[i]) - want[i]) * (double(b[i]) - want[i]);
        norm += double(want[i]) * want[i];
      }
    }
    const double moved_rel = std::sqrt(err_moved / norm), in_place_rel = std::sqrt(err_in_place / norm);
    std::printf("[ figures  ] %s: relative K error, q8_0 computed in place %.3g, moved by %d %.3g (x%.2f)\n",
                preset, in_place_rel, delta, moved_rel, moved_rel / in_place_rel);
    EXPECT_LT(in_place_rel, 2e-2) << preset;
    EXPECT_GT(in_place_rel, 0.0) << preset << ": q8_0 rounded nothing?";
    EXPECT_LT(moved_rel, 1.6 * in_place_rel) << preset;
  }
}

// A prefix placed from a span plus the rest computed sparsely equals one
// causal prefill; so does a continuation through eval().
TEST(SparsePrefill, PlacedPrefixPlusComputedSuffixEqualsFullPrefill) {
  const auto m = test::random_model("tiny", DType::F32);
  ThreadPool pool(2);
  Forward fwd(m, pool);
  const auto toks = some_tokens(40, m->config().n_vocab, 1);
  KvAssembly full(m->config(), 64, DType::F32), sparse(m->config(), 64, DType::F32);
  const auto want = fwd.prefill(chain_plan(toks, 0, 0, true), full).logits;
  std::vector<int64_t> rows(25);
  std::iota(rows.begin(), rows.end(), 0);
  std::vector<int32_t> pos(rows.begin(), rows.end());
  sparse.place(full.extract(rows), 0, 25, 0, pos);
  const std::vector<int32_t> rest(toks.begin() + 25, toks.end());
  const auto got = fwd.prefill(chain_plan(rest, 25, 25, true), sparse).logits;
  const std::vector<float> want_rest(want.begin() + 25 * m->config().n_vocab, want.end());
  EXPECT_LT(test::max_abs_diff(got, want_rest, "got vs want_rest"), 1e-4);
}

// Layer-wise preload places a span one layer at a time, from the layer hook,
// just before the layer runs: the logits equal those of the span placed
// whole before the pass, bit for bit, also when its keys are rotated.
TEST(SparsePrefill, ASpanPlacedLayerByLayerFromTheHookEqualsItPlacedWhole) {
  const auto m = test::random_model("tiny-qwen2", DType::F32);
  ThreadPool pool(2);
  Forward fwd(m, pool);
  const auto toks = some_tokens(30, m->config().n_vocab, 4);
  KvAssembly source(m->config(), 64, DType::F16);
  fwd.prefill(chain_plan(std::vector<int32_t>(toks.begin(), toks.begin() + 18), 0, 7), source);
  std::vector<int64_t> rows(18);
  std::iota(rows.begin(), rows.end(), 0);
  const KvSpan span = source.extract(rows);  // encoded at 7.., placed at 0..
  std::vector<int32_t> pos(18);
  std::iota(pos.begin(), pos.end(), 0);
  const std::vector<int32_t> rest(toks.begin() + 18, toks.end());

  KvAssembly whole(m->config(), 64, DType::F16);
  whole.place(span, 0, 18, 0, pos);
  const PrefillResult want = fwd.prefill(chain_plan(rest, 18, 18, true), whole);

  KvAssembly layered(m->config(), 64, DType::F16);
  PrefillPlan plan = chain_plan(rest, 18, 18, true);
  std::vector<int> layers_seen;
  plan.hook = [&](const LayerKv& layer) {
    layers_seen.push_back(layer.layer);
    layered.place(span, 0, 18, 0, pos, layer.layer, layer.layer + 1);
    return std::vector<int64_t>(layer.active.begin(), layer.active.end());
  };
  const PrefillResult got = fwd.prefill(plan, layered);
  ASSERT_EQ(static_cast<int>(layers_seen.size()), m->config().n_layer);
  EXPECT_EQ(got.logits, want.logits);
  for (int il = 0; il < m->config().n_layer; ++il) {
    EXPECT_EQ(rows_of(layered, il, 0, 30, true), rows_of(whole, il, 0, 30, true)) << il;
    EXPECT_EQ(rows_of(layered, il, 0, 30, false), rows_of(whole, il, 0, 30, false)) << il;
  }
  EXPECT_THROW(layered.place(span, 0, 18, 0, pos, 1, m->config().n_layer + 1), Error);
}

// Active sets shrinking with depth over an exact cache change nothing: a
// token that stops early leaves the cached (here: identical) K/V in later
// layers. With the set = all tokens everywhere, it is plain prefill.
TEST(SparsePrefill, ActiveSetsOverAnExactCacheGiveTheSameLogits) {
  const auto m = test::random_model("tiny-qwen2", DType::F32);
  const int n_layer = m->config().n_layer;
  ThreadPool pool(2);
  Forward fwd(m, pool);
  const auto toks = some_tokens(30, m->config().n_vocab, 2);
  KvAssembly full(m->config(), 32, DType::F32);
  const PrefillPlan base = chain_plan(toks, 0, 0);
  const PrefillResult want = fwd.prefill(base, full);
  std::vector<int64_t> rows(30);
  std::iota(rows.begin(), rows.end(), 0);
  const KvSpan all = full.extract(rows);

  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    KvAssembly kv(m->config(), 32, DType::F32);
    std::vector<int32_t> pos(rows.begin(), rows.end());
    kv.place(all, 0, 30, 0, pos);
    PrefillPlan plan = base;
    plan.last_layer.resize(30);
    for (auto& l : plan.last_layer) l = trial == 0 ? n_layer - 1 : static_cast<int>(rng() % n_layer);
    plan.last_layer.back() = n_layer - 1;
    int hook_calls = 0;
    plan.hook = [&](const LayerKv& lk) {
      ++hook_calls;
      // Fresh K equals the cached K of the same token (the cache is exact).
      std::vector<float> k(kv.row_elems()), v(kv.row_elems());
      for (size_t i = 0; i < lk.active.size(); ++i) {
        lk.kv->read(lk.layer, lk.rows[lk.active[i]], k.data(), v.data());
        for (int64_t e = 0; e < kv.row_elems(); ++e)
          EXPECT_NEAR(lk.k_fresh[i * kv.row_elems() + e], k[e], 1e-4);
      }
      // Trial 0 keeps all; others drop every third token except the last.
      std::vector<int64_t> keep;
      for (int64_t id : lk.active)
        if (trial == 0 || id % 3 != 1 || id == 29) keep.push_back(id);
      return keep;
    };
    const PrefillResult got = fwd.prefill(plan, kv);
    EXPECT_EQ(hook_calls, n_layer);
    EXPECT_LT(test::max_abs_diff(got.logits, want.logits, "got.logits vs want.logits"), 1e-4)
        << "trial " << trial;
    if (trial == 0) {
      EXPECT_EQ(got.attention_pairs, want.attention_pairs);
      EXPECT_EQ(got.active_per_layer, std::vector<int64_t>(n_layer, 30));
    } else {
      EXPECT_LT(got.attention_pairs, want.attention_pairs);
    }
  }
}

TEST(SparsePrefill, AttentionMassPerLayerOverTargets) {
  const auto m = test::random_model("tiny", DType::F32);
  ThreadPool pool(2);
  Forward fwd(m, pool);
  const auto toks = some_tokens(20, m->config().n_vocab, 3);
  KvAssembly kv(m->config(), 32, DType::F32);
  PrefillPlan plan = chain_plan(toks, 0, 0);
  plan.stats_queries = {19, 5};
  plan.stats_targets = {{0, 10}, {10, 20}};
  const PrefillResult r = fwd.prefill(plan, kv);
  ASSERT_EQ(r.attention_mass.size(), static_cast<size_t>(m->config().n_layer));
  for (const auto& layer : r.attention_mass) {
    ASSERT_EQ(layer.size(), 2u);
    EXPECT_NEAR(layer[0][0] + layer[0][1], 1.0, 1e-6);  // query 19 sees rows 0..19
    EXPECT_NEAR(layer[1][0], 1.0, 1e-6);                // query 5 sees rows 0..5 only
    EXPECT_EQ(layer[1][1], 0.0);
  }
}

TEST(SparsePrefill, MalformedPlansAreRejected) {
  const auto m = test::random_model("tiny", DType::F32);
  ThreadPool pool(2);
  Forward fwd(m, pool);
  KvAssembly kv(m->config(), 16, DType::F32);
  const auto toks = some_tokens(4, m->config().n_vocab);
  PrefillPlan p = chain_plan(toks, 0, 0);
  p.rows.pop_back();
  EXPECT_THROW(fwd.prefill(p, kv), Error);
  p = chain_plan(toks, 14, 0);  // rows 14..17 beyond 16
  EXPECT_THROW(fwd.prefill(p, kv), Error);
  p = chain_plan(toks, 0, 0);
  p.last_layer = {1, 1, 1, 0};  // the logits token stops early
  EXPECT_THROW(fwd.prefill(p, kv), Error);
  p = chain_plan(toks, 0, 0);
  p.hook = [](const LayerKv&) { return std::vector<int64_t>{7}; };  // not an active token
  EXPECT_THROW(fwd.prefill(p, kv), Error);
  p = chain_plan(toks, 0, 0);
  p.tokens[1] = m->config().n_vocab;
  EXPECT_THROW(fwd.prefill(p, kv), Error);
  p = chain_plan(toks, 0, 0);
  p.rows[2] = 9;  // the visibility expects row 2
  EXPECT_THROW(fwd.prefill(p, kv), Error);
  p = chain_plan(toks, 0, 0);
  p.stats_queries = {4};
  p.stats_targets = {{0, 4}};
  EXPECT_THROW(fwd.prefill(p, kv), Error);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

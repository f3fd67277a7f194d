// The measured prefill cost table on a real (random-weight) model: a full
// grid of positive times. (The index charging nodes by a cost model is
// tested in tests/kv/test_policy.cpp.)
#include <gtest/gtest.h>

#include "engine/cost_profile.h"
#include "engine/engine.h"
#include "model/model.h"
#include "test_support.h"
#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

TEST(CostProfile, MeasuresAGridOfPositiveTimes) {
  const auto model = test::random_model("tiny", DType::F32);
  ThreadPool pool(1);
  Forward fwd(model, pool);
  KvAssembly kv(model->config(), 256, DType::F32);
  const PrefillCostTable t = profile_prefill_cost(fwd, kv, 256, 1);
  EXPECT_EQ(t.fresh_axis(), (std::vector<int64_t>{8, 32, 128}));
  EXPECT_EQ(t.cached_axis().size(), 3u);
  for (size_t i = 0; i < t.cached_axis().size(); ++i)
    for (size_t j = 0; j < t.fresh_axis().size(); ++j) EXPECT_GT(t.at(i, j), 0.0);
  // Grid points read back as measured (timings themselves are for benchmarks:
  // under a sanitizer and parallel tests one 8-token prefill can outlast a 128-token one).
  EXPECT_DOUBLE_EQ(t(t.cached_axis()[1], t.fresh_axis()[2]), t.at(1, 2));
  EXPECT_EQ(kv.n_past(), 0);
}

// The engine profiles in its pool's rows before any request, and the pool
// serves requests afterwards as if nothing had been there; once a request is
// submitted, profiling is refused (it would write over the request's rows).
TEST(CostProfile, TheEngineProfilesInItsIdlePool) {
  const auto model = test::random_model("tiny", DType::F32);
  EngineOptions o;
  o.pool_rows = 200;
  o.kv_type = DType::F32;
  o.threads = 1;
  Engine profiled(model, o), fresh(model, o);
  const PrefillCostTable t = profiled.profile_prefill_cost(4096);
  EXPECT_EQ(t.fresh_axis(), (std::vector<int64_t>{8, 32, 128})) << "capped at the pool's 200 rows";
  EXPECT_LE(t.cached_axis().back() + t.fresh_axis().back(), 200);
  EXPECT_EQ(profiled.pool().n_free(), 200);
  PromptParts parts;
  for (int32_t i = 0; i < 40; ++i) parts.task.push_back(1 + i % 50);
  SamplingParams greedy;
  greedy.max_tokens = 4;
  const RequestResult& a = profiled.wait(profiled.submit("full", parts, greedy));
  const RequestResult& b = fresh.wait(fresh.submit("full", parts, greedy));
  EXPECT_EQ(a.tokens, b.tokens);
  profiled.submit("full", parts, greedy);
  EXPECT_THROW(profiled.profile_prefill_cost(64), Error);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

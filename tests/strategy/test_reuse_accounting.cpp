// Reuse accounting adds up: on trees whose paths share prefixes (several
// runs of one request place the same rows), a request's reused tokens by
// tier sum to its reused tokens, and under one-pass strategies reused plus
// computed is the prompt, whichever tier the KV comes from: hot, host, disk
// (another index over the same directory, whole or layer by layer) and
// remote (another index over the same Redis).
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "graph_requests.h"
#include "kv/disk_store.h"
#include "kv/remote_store.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "strategy/strategy.h"
#include "strategy_rig.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::graph_request;
using test::kCat;
using test::kDog;
using test::kDog2;
using test::kOwl;

constexpr int kHot = static_cast<int>(Tier::Hot), kHost = static_cast<int>(Tier::Host),
              kDisk = static_cast<int>(Tier::Disk), kRemote = static_cast<int>(Tier::Remote);

// Trees with shared path prefixes: dog's three paths share "dog", two of
// them "dog -hypernym-> canine -"; kDog2 shares part of them.
std::vector<RagRequest> shared_prefix_requests() {
  return {graph_request({kDog, kCat}, "Which animals?"),
          graph_request({kDog2, kCat, kOwl}, "Which eat mice?"), graph_request({kOwl, kDog}, "Which hunt?")};
}

int64_t tier_sum(const PrefillReport& r) {
  return std::accumulate(std::begin(r.reused_from), std::end(r.reused_from), int64_t{0});
}

// The invariants of one request's report; one_pass: computed is exactly
// what was not reused (multi-pass strategies recompute some reused rows).
void expect_adds_up(const PrefillReport& r, const std::string& label, bool one_pass = true) {
  EXPECT_EQ(tier_sum(r), r.reused_tokens)
      << label << ": hot " << r.reused_from[kHot] << " host " << r.reused_from[kHost] << " disk "
      << r.reused_from[kDisk] << " remote " << r.reused_from[kRemote];
  for (int t = 0; t < RadixIndex::kTiers; ++t) EXPECT_GE(r.reused_from[t], 0) << label;
  EXPECT_LT(r.reused_tokens, r.prompt_tokens) << label << ": the last token always runs";
  if (one_pass)
    EXPECT_EQ(r.reused_tokens + r.computed_tokens, r.prompt_tokens) << label;
  else
    EXPECT_GE(r.reused_tokens + r.computed_tokens, r.prompt_tokens) << label;
}

// Requests run one at a time on engines whose index a test sets up (its
// tiers attached to Engine::index()).
struct Rig {
  std::shared_ptr<const Model> model = test::random_model("tiny", DType::F32, false, 4);
  Tokenizer tok{Vocab::builtin_bytes()};
  // The strategy tests' engine (strategy_rig.h); each test attaches its own tiers.
  std::unique_ptr<Engine> engine() const {
    return std::make_unique<Engine>(
        model, test::strategy_engine_options(DType::F32, {PositionScheme::Sequential, true}));
  }
  PrefillReport run(Engine& e, const RagRequest& r, const std::string& strategy = "depcache") {
    const RequestId id = e.submit(strategy, make_prompt_parts(tok, r), test::greedy(1));
    const PrefillReport report = e.wait(id).report;
    e.forget(id);
    EXPECT_EQ(e.index().n_pinned(), 0u);
    e.index().check_invariants();
    return report;
  }
  // Every request of the list, each checked; the reports' tier sums.
  PrefillReport run_all(Engine& e, const std::string& label) {
    PrefillReport total;
    const std::vector<RagRequest> requests = shared_prefix_requests();
    for (size_t i = 0; i < requests.size(); ++i) {
      const PrefillReport r = run(e, requests[i]);
      expect_adds_up(r, label + " #" + std::to_string(i));
      total.reused_tokens += r.reused_tokens;
      for (int t = 0; t < RadixIndex::kTiers; ++t) total.reused_from[t] += r.reused_from[t];
    }
    return total;
  }
};

TEST(ReuseAccounting, SharedPathPrefixesAreChargedOnceFromTheHotTier) {
  Rig rig;
  const auto engine = rig.engine();
  const RagRequest r = graph_request({kDog, kCat}, "Which animals?");
  const PrefillReport cold = rig.run(*engine, r);
  expect_adds_up(cold, "cold");
  EXPECT_EQ(cold.reused_tokens, 0);
  // Again: the trees are found, dog's shared path prefix in three runs,
  // placed (and charged) once.
  const PrefillReport again = rig.run(*engine, r);
  expect_adds_up(again, "again");
  EXPECT_GT(again.reused_tokens, 0);
  EXPECT_EQ(again.reused_from[kHot], again.reused_tokens);
  const PrefillReport all = rig.run_all(*engine, "hot");
  EXPECT_GT(all.reused_from[kHot], 0);
  EXPECT_EQ(all.reused_from[kHot], all.reused_tokens);
}

TEST(ReuseAccounting, EveryStrategyAddsUp) {
  Rig rig;
  const auto engine = rig.engine();
  for (const std::string& name : strategy_names()) {
    const bool one_pass = name == "full" || name == "prefix" || name == "ragcache" || name == "depcache";
    for (const RagRequest& r : shared_prefix_requests())
      for (int round = 0; round < 2; ++round) expect_adds_up(rig.run(*engine, r, name), name, one_pass);
  }
}

// Host: the hot tier emptied (all of it, then half, so a path's parents stay
// hot and its children come from the host tier).
TEST(ReuseAccounting, HostTier) {
  Rig rig;
  for (const size_t keep_percent : {size_t{0}, size_t{50}}) {
    const auto engine = rig.engine();
    RadixIndex& index = EngineTestPeer::index(*engine);
    index.attach_host(64 << 20);
    rig.run_all(*engine, "seed");
    index.evict_to(index.bytes() * keep_percent / 100);
    ASSERT_GT(index.n_nodes(Tier::Host), 0u);
    const PrefillReport all = rig.run_all(*engine, "host " + std::to_string(keep_percent) + "%");
    EXPECT_GT(all.reused_from[kHost], 0);
    if (keep_percent > 0) {
      EXPECT_GT(all.reused_from[kHot], 0);
    }
    EXPECT_EQ(tier_sum(all), all.reused_tokens);
  }
}

// Disk: persisted, then read by a new index over the same directory (a
// restart), whole or layer by layer (when two runs of a request share a
// node still being read, the second finds it loading).
TEST(ReuseAccounting, DiskTierAfterARestart) {
  Rig rig;
  const auto dir = test::temp_path("reuse-accounting-disk");
  {
    DiskSpanStore disk(dir, 64 << 20);
    const auto engine = rig.engine();
    EngineTestPeer::index(*engine).attach_disk(disk);
    rig.run_all(*engine, "seed");
    EngineTestPeer::index(*engine).persist();
  }
  using Mode = RadixIndex::LayerPreload::Mode;
  for (const auto& [label, preload] : std::vector<std::pair<std::string, RadixIndex::LayerPreload>>{
           {"disk, whole", {Mode::Off, 0}}, {"disk, layer by layer", {Mode::Fixed, 1}}}) {
    const auto copy = dir.string() + "-" + std::to_string(preload.depth);
    std::filesystem::remove_all(copy);
    std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
    DiskSpanStore disk(copy, 64 << 20);
    const auto engine = rig.engine();
    RadixIndex& index = EngineTestPeer::index(*engine);
    index.attach_disk(disk);
    index.set_layer_preload(preload);
    ASSERT_GT(index.n_nodes(Tier::Disk), 0u) << label;
    const PrefillReport all = rig.run_all(*engine, label);
    EXPECT_GT(all.reused_from[kDisk], 0) << label;
    EXPECT_GT(all.reused_from[kHot], 0) << label << ": later requests find what earlier ones loaded";
    EXPECT_EQ(tier_sum(all), all.reused_tokens) << label;
    std::filesystem::remove_all(copy);
  }
  std::filesystem::remove_all(dir);
}

// Remote: one index publishes to Redis, another (as another process would)
// finds it there.
TEST(ReuseAccounting, RemoteTier) {
  DEPCACHE_REQUIRE_REDIS(redis);
  Rig rig;
  RedisOptions o;
  o.port = redis.port();
  RedisStore store_a(o), store_b(o);
  const auto a = rig.engine(), b = rig.engine();
  EngineTestPeer::index(*a).attach_remote(store_a, 8);
  EngineTestPeer::index(*b).attach_remote(store_b, 8);
  rig.run_all(*a, "publisher");
  ASSERT_GT(a->index().stats().remote_published, 0);
  const PrefillReport all = rig.run_all(*b, "remote");
  EXPECT_GT(all.reused_from[kRemote], 0);
  EXPECT_EQ(tier_sum(all), all.reused_tokens);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

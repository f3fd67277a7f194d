// Replacement policies through the radix index: which leaf each one evicts,
// and that every policy keeps the index's invariants and budget.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>

#include "kv/policy.h"
#include "kv/radix_index.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using Tokens = std::vector<int32_t>;
constexpr size_t kTokenBytes = 100;

RadixIndex index_with(const char* policy, size_t tokens_budget) {
  return RadixIndex(tokens_budget * kTokenBytes, make_policy(policy));
}
bool cached(RadixIndex& index, const Tokens& t) {
  return index.peek(1, t).length == static_cast<int64_t>(t.size());
}

TEST(Policy, LfuKeepsTheMostUsedLeafOverTheMostRecent) {
  RadixIndex index = index_with("lfu", 4);
  index.insert_virtual(1, Tokens{1, 1}, kTokenBytes);
  index.insert_virtual(1, Tokens{2, 2}, kTokenBytes);
  for (int i = 0; i < 3; ++i) index.match(1, Tokens{1, 1});
  index.match(1, Tokens{2, 2});  // more recent, less used
  index.insert_virtual(1, Tokens{3, 3}, kTokenBytes);
  EXPECT_TRUE(cached(index, {1, 1}));
  EXPECT_FALSE(cached(index, {2, 2}));
  EXPECT_TRUE(cached(index, {3, 3}));
}

TEST(Policy, LruKeepsTheMostRecent) {
  RadixIndex index = index_with("lru", 4);
  index.insert_virtual(1, Tokens{1, 1}, kTokenBytes);
  index.insert_virtual(1, Tokens{2, 2}, kTokenBytes);
  for (int i = 0; i < 3; ++i) index.match(1, Tokens{1, 1});
  index.match(1, Tokens{2, 2});
  index.insert_virtual(1, Tokens{3, 3}, kTokenBytes);
  EXPECT_FALSE(cached(index, {1, 1}));
  EXPECT_TRUE(cached(index, {2, 2}));
}

// PGDSF: with equal frequency, the node that costs more per token to
// recompute stays; GDSF (cost 1) prefers to keep the smaller node.
TEST(Policy, PgdsfWeighsRecomputeCostAndGdsfSize) {
  RadixIndex pg = index_with("pgdsf", 4);
  pg.insert_virtual(1, Tokens{1, 1}, kTokenBytes, /*cost_per_token=*/5.0);
  pg.insert_virtual(1, Tokens{2, 2}, kTokenBytes, /*cost_per_token=*/1.0);
  pg.insert_virtual(1, Tokens{3, 3}, kTokenBytes, 1.0);
  EXPECT_TRUE(cached(pg, {1, 1}));
  EXPECT_FALSE(cached(pg, {2, 2}));

  RadixIndex g = index_with("gdsf", 5);
  g.insert_virtual(1, Tokens{1, 1, 1}, kTokenBytes);
  g.insert_virtual(1, Tokens{2}, kTokenBytes);
  g.insert_virtual(1, Tokens{3, 3}, kTokenBytes);  // over by one: the large node goes
  EXPECT_FALSE(cached(g, {1, 1, 1}));
  EXPECT_TRUE(cached(g, {2}));
}

// GDSF's clock ages what stays unused: after an eviction raised the clock, a
// node inserted or used since outranks an old one with more hits.
TEST(Policy, GdsfClockAgesOldEntries) {
  for (const char* name : {"gdsf", "pgdsf"}) {
    auto policy = make_policy(name);
    ReplacementPolicy& p = *policy;
    p.on_insert(1, 1.0, 11);
    p.on_access(1);
    p.on_evict(7, 10.0, Tier::Hot);  // clock = 10
    p.on_insert(2, 1.0, 12);
    const NodeView old{1, 1, 2, 1}, fresh{2, 1, 1, 99};
    EXPECT_NEAR(p.priority(old), 2.0, 1e-9) << name;
    EXPECT_NEAR(p.priority(fresh), 11.0, 1e-9) << name;
    p.on_access(1);  // used again: catches up with the clock (PGDSF counts the access itself)
    EXPECT_NEAR(p.priority(old), std::string_view(name) == "pgdsf" ? 13.0 : 12.0, 1e-9) << name;
  }
}

// GDSF with the cost proportional to size: Frequency alone over the clock,
// so a large node used as often as a small one ranks the same.
TEST(Policy, GdsfSizeRanksByFrequencyNotSize) {
  auto policy = make_policy("gdsf-size");
  ReplacementPolicy& p = *policy;
  p.on_insert(1, 1.0, 11);
  p.on_insert(2, 1.0, 12);
  EXPECT_NEAR(p.priority({1, 1000, 3, 0}), 3.0, 1e-9);
  EXPECT_NEAR(p.priority({2, 4, 3, 0}), 3.0, 1e-9);
  p.on_evict(7, 10.0, Tier::Hot);
  p.on_access(1);
  EXPECT_NEAR(p.priority({1, 1000, 4, 0}), 14.0, 1e-9);
  EXPECT_EQ(p.name(), "gdsf-size");
}

// PGDSF as RAGCache publishes it: Frequency counts every access, Cost/Size
// is the mean of the request's cost per token over the accesses that found
// the node uncached, and both survive the node leaving the index.
TEST(Policy, PgdsfAveragesCostOverUncachedAccessesAndRemembersNodesThatLeft) {
  auto policy = make_policy("pgdsf");
  ReplacementPolicy& p = *policy;
  p.on_insert(1, 5.0, 42);  // computed: frequency 1, mean cost 5
  EXPECT_NEAR(p.priority({1, 2, 1, 0}), 5.0, 1e-9);
  p.on_access(1);  // found cached: frequency 2, the mean unchanged
  EXPECT_NEAR(p.priority({1, 2, 1, 0}), 10.0, 1e-9);
  p.on_remove(1);
  p.on_insert(1, 2.0, 43);  // the id reused by other content starts afresh
  EXPECT_NEAR(p.priority({1, 2, 1, 0}), 2.0, 1e-9);
  p.on_insert(3, 1.0, 42);  // the first content computed again: frequency 3, mean (5 + 1) / 2
  EXPECT_NEAR(p.priority({3, 2, 1, 0}), 9.0, 1e-9);
  p.on_split(4, 3, 44);  // the head of a split inherits, under its own key
  p.on_remove(4);
  p.on_insert(5, 3.0, 44);
  EXPECT_NEAR(p.priority({5, 2, 1, 0}), 4.0 * 3.0, 1e-9);  // frequency 4, mean (5 + 1 + 3) / 3
}

// LACR: a node the pending queue will use outranks a more frequent one
// nobody is waiting for (alpha 0.2).
TEST(Policy, LacrProtectsWhatThePendingQueueNeeds) {
  RadixIndex index = index_with("lacr", 4);
  index.insert_virtual(1, Tokens{1, 1}, kTokenBytes);
  index.insert_virtual(1, Tokens{2, 2}, kTokenBytes);
  for (int i = 0; i < 3; ++i) index.match(1, Tokens{1, 1});
  const RadixIndex::Match soon = index.peek(1, Tokens{2, 2});
  index.policy().set_lookahead({{soon.pieces[0].node, 2.0}});
  index.insert_virtual(1, Tokens{3, 3}, kTokenBytes);
  EXPECT_FALSE(cached(index, {1, 1}));
  EXPECT_TRUE(cached(index, {2, 2}));
}

TEST(Policy, CacheCraftFavoursChunksThatNeedLittleFixing) {
  RadixIndex index = index_with("cachecraft", 4);
  index.insert_virtual(1, Tokens{1, 1}, kTokenBytes);
  index.insert_virtual(1, Tokens{2, 2}, kTokenBytes);
  const auto a = index.peek(1, Tokens{1, 1}).pieces[0].node, b = index.peek(1, Tokens{2, 2}).pieces[0].node;
  index.policy().set_fix_overhead(a, 0.1);  // reusable almost as is: +10 per access
  index.policy().set_fix_overhead(b, 1.0);  // needs full recompute: +1 per access
  index.match(1, Tokens{1, 1});
  index.match(1, Tokens{2, 2});
  index.match(1, Tokens{2, 2});
  index.insert_virtual(1, Tokens{3, 3}, kTokenBytes);
  EXPECT_TRUE(cached(index, {1, 1}));
  EXPECT_FALSE(cached(index, {2, 2}));
}

// The index gives the policy a key per node that depends on its content
// only: a node computed again after it left, or split off, is known again.
// With a cost model set (PGDSF's profiled table), a request's cost per
// token is T(cached, fresh) / fresh; without one, what was measured.
TEST(Policy, TheIndexKeysNodesByContentAndPricesRequestsByTheCostModel) {
  struct Recording final : ReplacementPolicy {
    std::vector<std::pair<uint64_t, double>>* inserted;
    explicit Recording(std::vector<std::pair<uint64_t, double>>* v) : inserted(v) {}
    std::string_view name() const override { return "recording"; }
    void on_insert(int32_t, double cost_per_token, uint64_t key) override {
      inserted->emplace_back(key, cost_per_token);
    }
    double priority(const NodeView& n) const override { return static_cast<double>(n.last_used); }
  };
  std::vector<std::pair<uint64_t, double>> inserted;
  RadixIndex index(2 * kTokenBytes, std::make_unique<Recording>(&inserted));
  index.insert_virtual(1, Tokens{1, 2}, kTokenBytes, 7.0);
  index.insert_virtual(1, Tokens{3, 4}, kTokenBytes, 1.0);  // {1, 2} leaves
  index.insert_virtual(1, Tokens{1, 2}, kTokenBytes, 1.0);  // and comes back
  index.insert_virtual(2, Tokens{1, 2}, kTokenBytes, 1.0);  // another namespace
  ASSERT_EQ(inserted.size(), 4u);
  EXPECT_EQ(inserted[0].first, inserted[2].first);
  EXPECT_NE(inserted[0].first, inserted[1].first);
  EXPECT_NE(inserted[0].first, inserted[3].first);
  EXPECT_EQ(inserted[0].second, 7.0) << "the caller's cost";

  EXPECT_EQ(index.cost_per_token(4, 2, 99.0), 99.0) << "no cost model: what was measured";
  index.set_cost_model([](int64_t cached, int64_t n) {
    return 10.0 * static_cast<double>(cached) + 3.0 * static_cast<double>(n);
  });
  EXPECT_EQ(index.cost_per_token(4, 2, 99.0), (10.0 * 4 + 3.0 * 2) / 2);
  EXPECT_EQ(index.cost_per_token(4, 0, 99.0), 99.0) << "nothing computed";
}

TEST(Policy, UnknownNamesAndBadAlphaAreErrors) {
  EXPECT_THROW(make_policy("mru"), Error);
  PolicyOptions o;
  o.lacr_alpha = 1.5;
  EXPECT_THROW(make_policy("lacr", o), Error);
  EXPECT_EQ(policy_names().size(), 7u);
}

// A request that matches several paths sharing a trunk counts one access of
// the trunk (DepCache counts a node once per request), not one per path.
TEST(Policy, ARequestCountsEachNodeOnce) {
  struct Counting final : ReplacementPolicy {
    std::map<int32_t, int>* accesses;
    explicit Counting(std::map<int32_t, int>* a) : accesses(a) {}
    std::string_view name() const override { return "counting"; }
    void on_access(int32_t node) override { ++(*accesses)[node]; }
    double priority(const NodeView& n) const override { return static_cast<double>(n.hits); }
  };
  std::map<int32_t, int> accesses;
  RadixIndex index(1000 * kTokenBytes, std::make_unique<Counting>(&accesses));
  const Tokens a = {1, 2, 3, 4}, b = {1, 2, 5, 6};  // trunk {1, 2}
  index.insert_virtual(1, a, kTokenBytes);
  index.insert_virtual(1, b, kTokenBytes);
  const int32_t trunk = index.peek(1, a).pieces.front().node;
  const uint64_t tick = index.begin_request();
  index.match(1, a, tick);
  index.match(1, b, tick);
  EXPECT_EQ(accesses[trunk], 1);
  EXPECT_EQ(accesses[index.peek(1, a).pieces.back().node], 1);
  EXPECT_EQ(accesses[index.peek(1, b).pieces.back().node], 1);
  index.match(1, a);  // separate requests count separately
  index.match(1, b);
  EXPECT_EQ(accesses[trunk], 3);
}

// LACR: the head split off a weighted node inherits its lookahead weight
// (every request that will use the tail uses the head).
TEST(Policy, LacrSplitHeadInheritsTheLookahead) {
  RadixIndex index = index_with("lacr", 1000);
  index.insert_virtual(1, Tokens{1, 2, 3, 4}, kTokenBytes);
  const int32_t node = index.peek(1, Tokens{1, 2, 3, 4}).pieces.front().node;
  index.set_lookahead({{node, 4.0}});
  index.insert_virtual(1, Tokens{1, 2, 9}, kTokenBytes);  // splits {1 2 | 3 4}
  const auto m = index.peek(1, Tokens{1, 2, 3, 4});
  ASSERT_EQ(m.pieces.size(), 2u);
  const int32_t head = m.pieces.front().node;
  ASSERT_NE(head, node);
  // alpha 0.2: 0.2 * hits + 0.8 * lookahead; the head has 1 hit (as the node had).
  EXPECT_DOUBLE_EQ(index.policy().priority({head, 2, 1, 0, Tier::Hot}), 0.2 * 1 + 0.8 * 4.0);
  index.check_invariants();
}

// Every policy: random inserts/matches/pins and lookahead updates over shared
// prefixes never break the index, never exceed the budget once nothing is
// pinned, and never evict a pinned node.
TEST(Policy, EveryPolicyKeepsTheIndexSound) {
  for (const std::string& name : policy_names()) {
    RadixIndex index(40 * kTokenBytes, make_policy(name));
    std::mt19937 rng(9);
    std::vector<std::pair<RadixIndex::Match, Tokens>> pins;
    for (int step = 0; step < 2000; ++step) {
      Tokens seq(1 + rng() % 8);
      for (auto& t : seq) t = static_cast<int32_t>(rng() % 3);
      if (rng() % 6 == 0) index.set_lookahead({{static_cast<int32_t>(rng() % 50), 1.0}});
      if (rng() % 2) {
        index.insert_virtual(1, seq, kTokenBytes, 1.0 + rng() % 4);
      } else {
        const auto m = index.match(1, seq);
        if (m.length > 0 && rng() % 4 == 0) {
          index.pin(m);
          pins.emplace_back(m, Tokens(seq.begin(), seq.begin() + m.length));
        }
      }
      for (const auto& [m, t] : pins)
        ASSERT_EQ(index.peek(1, t).length, static_cast<int64_t>(t.size())) << name;
      if (rng() % 5 == 0 && !pins.empty()) {
        index.unpin(pins.back().first);
        pins.pop_back();
      }
      if (pins.empty()) {
        ASSERT_LE(index.bytes(), index.budget()) << name << " step " << step;
      }
      // Including: the eviction candidates are exactly the evictable leaves,
      // each ranked by its current priority (the victim is the brute-force minimum).
      ASSERT_NO_THROW(index.check_invariants()) << name << " step " << step;
    }
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

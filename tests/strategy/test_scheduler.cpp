// The scheduler shared by the engine and the simulator: each order on a
// hand-made queue over a real index, and the starvation bound.
#include <gtest/gtest.h>

#include "kv/radix_index.h"
#include "strategy/admission.h"
#include "strategy/scheduler.h"
#include "util/error.h"
#include "util/random.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using Tokens = std::vector<int32_t>;

struct Queue {
  std::vector<std::vector<Lookup>> lookups;
  // Each request's passed-over count, one array for every waiting() view
  // (a later call's counts replace the earlier ones).
  std::vector<int> passed;
  std::vector<WaitingRequest> waiting(std::vector<int64_t> prompt_tokens, std::vector<int> passed_over = {}) {
    if (passed.empty()) passed.resize(lookups.size());
    if (passed_over.empty()) passed_over.resize(lookups.size());
    std::copy(passed_over.begin(), passed_over.end(), passed.begin());
    std::vector<WaitingRequest> q;
    for (size_t i = 0; i < lookups.size(); ++i) q.push_back({&lookups[i], prompt_tokens[i], &passed[i]});
    return q;
  }
};

TEST(Scheduler, EachOrderOnAHandMadeQueue) {
  RadixIndex index(1 << 20);
  index.insert_virtual(1, Tokens{1, 2, 3, 4, 5, 6}, 1);  // six tokens of "a" cached
  index.insert_virtual(1, Tokens{9, 9}, 1);              // two of "b"
  Queue q;
  q.lookups = {
      {{1, {7, 7, 7}}},                                                     // 0: nothing cached, 3 tokens
      {{1, {9, 9, 8, 8, 8, 8, 8, 8}}},                                      // 1: 2 of 8 cached
      {{1, {1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}}},  // 2: 6 of 20 cached
      {{1, {5, 5}}, {1, {5, 5, 6}}},  // 3: nothing cached; one run shared with 4
      {{1, {5, 5, 6}}},               // 4: shares a run with 3
  };
  const auto waiting = q.waiting({3, 8, 20, 5, 3});
  EXPECT_EQ(pick_next({"fifo"}, waiting, index), 0u);
  EXPECT_EQ(pick_next({"lpm"}, waiting, index), 2u) << "6 tokens matched beat 2";
  // ragcache: cached / to compute = 2/6 for #1 vs 6/14 for #2.
  EXPECT_EQ(pick_next({"ragcache"}, waiting, index), 2u);
  // lsp: #3's runs are shared by #4 (and each other) and score highest.
  EXPECT_EQ(pick_next({"lsp"}, waiting, index), 3u);
  // A tie-free case for ragcache where a short request wins on its ratio.
  const auto short_first = q.waiting({3, 3, 20, 5, 3});  // #1: 2 cached of 3 -> 2/1
  EXPECT_EQ(pick_next({"ragcache"}, short_first, index), 1u);
  EXPECT_THROW(pick_next({"nope"}, waiting, index), Error);
  EXPECT_THROW(check_scheduler("nope"), Error);
}

// A request's own runs that start alike (one entity's relation paths) are
// not shared with anyone: lsp scores sharing between waiting requests.
TEST(Scheduler, LspCountsEachRequestOncePerGroup) {
  RadixIndex index(1 << 20);
  Queue q;
  const Tokens start = {3, 3, 3, 3, 3, 3, 3, 3};  // a group is a run's first 8 tokens
  auto run = [&](int32_t last) {
    Tokens t = start;
    t.push_back(last);
    return Lookup{1, t};
  };
  q.lookups = {
      {run(1), run(2), run(4), run(5)},  // 0: four runs of one group, shared by nobody
      {{1, {5, 5, 6}}},                  // 1: shares its run with 2
      {{1, {5, 5, 6}}},                  // 2
  };
  EXPECT_EQ(pick_next({"lsp"}, q.waiting({36, 3, 3}), index), 1u);
}

TEST(Scheduler, StarvationBound) {
  RadixIndex index(1 << 20);
  index.insert_virtual(1, Tokens{1, 2, 3}, 1);
  Queue q;
  q.lookups = {{{1, {8, 8, 8}}}, {{1, {1, 2, 3, 4}}}};
  // #0 has nothing cached: lpm passes it over until it has waited 4 times.
  for (int passed = 0; passed < 4; ++passed)
    EXPECT_EQ(pick_next({"lpm", 4}, q.waiting({3, 4}, {passed, 0}), index), 1u) << passed;
  EXPECT_EQ(pick_next({"lpm", 4}, q.waiting({3, 4}, {4, 0}), index), 0u);
  EXPECT_EQ(pick_next({"ragcache", 4}, q.waiting({3, 4}, {4, 0}), index), 0u);
  // Among several starved requests, the oldest first.
  EXPECT_EQ(pick_next({"lpm", 4}, q.waiting({3, 4}, {5, 9}), index), 0u);
}

// expected_order is pick_next repeated: on random queues over a random
// index, for every order and with starvation in play, the same sequence as
// picking, counting the waits (Admission::admitted) and taking the pick out.
TEST(Scheduler, ExpectedOrderIsPickNextRepeated) {
  uint64_t seed = 7;
  const auto draw = [&](int n) { return static_cast<int32_t>(splitmix64(seed) % static_cast<uint64_t>(n)); };
  for (int trial = 0; trial < 60; ++trial) {
    RadixIndex index(1 << 20);
    for (int i = 0; i < 6; ++i) {
      Tokens t;
      for (int k = 0, len = 1 + draw(10); k < len; ++k) t.push_back(draw(4));
      index.insert_virtual(1, t, 1);
    }
    // Runs drawn from a small pool, so that requests share groups (lsp).
    std::vector<Tokens> pool(6);
    for (Tokens& t : pool)
      for (int k = 0, len = 1 + draw(12); k < len; ++k) t.push_back(draw(4));
    for (int i = 0; i < 3; ++i)  // parts of some runs cached
      index.insert_virtual(
          1, Tokens(pool[i].begin(), pool[i].begin() + 1 + draw(static_cast<int>(pool[i].size()))), 1);
    Queue q;
    std::vector<int64_t> prompt;
    std::vector<int> passed;
    const int n = 1 + draw(12);
    for (int r = 0; r < n; ++r) {
      std::vector<Lookup> lookups;
      for (int run = 0, runs = 1 + draw(3); run < runs; ++run) lookups.push_back({1, pool[draw(6)]});
      q.lookups.push_back(lookups);
      prompt.push_back(4 + draw(30));
      passed.push_back(draw(4));
    }
    // A bound of 32 is never reached here: the claims decide every pick.
    for (const SchedulerOptions& o :
         {SchedulerOptions{"lpm", 5}, SchedulerOptions{"lpm", 32}, SchedulerOptions{"lsp", 5},
          SchedulerOptions{"lsp", 32}, SchedulerOptions{"ragcache", 5}, SchedulerOptions{"ragcache", 32},
          SchedulerOptions{"fifo", 5}}) {
      const std::string& order = o.order;
      const std::vector<size_t> expected = expected_order(o, q.waiting(prompt, passed), index);
      // The reference: pick, count the waits, take the pick out, again.
      std::vector<size_t> ids(static_cast<size_t>(n)), got;
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
      std::vector<int> counts = passed;
      while (!ids.empty()) {
        std::vector<WaitingRequest> left;
        for (size_t id : ids) left.push_back({&q.lookups[id], prompt[id], &counts[id]});
        const size_t k = pick_next(o, left, index);
        Admission::admitted(left, k);
        got.push_back(ids[k]);
        ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(k));
      }
      ASSERT_EQ(expected, got) << order << ", trial " << trial;
      ASSERT_EQ(q.passed, passed) << "expected_order counts on copies";
    }
  }
}

// Admission, as the engine and the simulator use it: the scheduler sees the
// first `window` candidates only, an admission counts a wait for every other
// one, and those counts reach the starvation bound.
TEST(Admission, WindowPassedOverCountsAndStarvation) {
  RadixIndex index(1 << 20);
  index.insert_virtual(1, Tokens{1, 2, 3}, 1);
  Queue q;
  q.lookups = {{{1, {8, 8, 8}}}, {{1, {7, 7}}}, {{1, {1, 2, 3, 4}}}};
  const Admission two({{"lpm", 3}, 2, false});
  EXPECT_EQ(two.window(), 2u);
  // #2 has the longest match but lies outside a window of two.
  EXPECT_EQ(two.pick(q.waiting({3, 2, 4}), index), 0u);
  const Admission three({{"lpm", 3}, 3, false});
  auto waiting = q.waiting({3, 2, 4});
  // #2 admitted three times over (a stream of such requests): #0 and #1 wait
  // once each time, then the oldest starved one goes first.
  for (int round = 0; round < 3; ++round) {
    const size_t chosen = three.pick(waiting, index);
    ASSERT_EQ(chosen, 2u) << round;
    Admission::admitted(waiting, chosen);
  }
  EXPECT_EQ(q.passed, (std::vector<int>{3, 3, 0}));
  EXPECT_EQ(three.pick(waiting, index), 0u);
  EXPECT_EQ(Admission({{"fifo", 3}, 0, false}).window(), 1u) << "a window of 0 still admits";
  EXPECT_THROW(Admission({{"nope", 3}, 2, false}), Error);
}

// A policy that keeps the lookahead weights it is given.
struct LookaheadSeen : ReplacementPolicy {
  std::unordered_map<int32_t, double>* seen;
  explicit LookaheadSeen(std::unordered_map<int32_t, double>* s) : seen(s) {}
  std::string_view name() const override { return "seen"; }
  double priority(const NodeView&) const override { return 0; }
  void set_lookahead(std::unordered_map<int32_t, double> w) override { *seen = std::move(w); }
};

// LACR's lookahead is set from the window only, and only when on.
TEST(Admission, LookaheadFromTheWindowOnly) {
  std::unordered_map<int32_t, double> seen{{-1, 1.0}};
  RadixIndex index(1 << 20, std::make_unique<LookaheadSeen>(&seen));
  index.insert_virtual(1, Tokens{1, 2}, 1);
  index.insert_virtual(1, Tokens{5, 6}, 1);
  const std::vector<Lookup> first{{1, {1, 2}}}, second{{1, {5, 6}}};
  int passed[2] = {0, 0};
  const std::vector<WaitingRequest> waiting{{&first, 2, &passed[0]}, {&second, 2, &passed[1]}};
  Admission({{"fifo", 3}, 2, false}).refresh_lookahead(index, waiting);
  EXPECT_EQ(seen.size(), 1u) << "no lookahead unless asked";
  Admission({{"fifo", 3}, 1, true}).refresh_lookahead(index, waiting);
  EXPECT_EQ(seen.size(), 1u) << "the first request's node only, in a window of one";
  EXPECT_EQ(seen.count(-1), 0u);
  Admission({{"fifo", 3}, 2, true}).refresh_lookahead(index, waiting);
  EXPECT_EQ(seen.size(), 2u);
}

// The lookahead weighs requests by when the scheduler will run them: under
// lpm the longest match goes first and weighs 1 however late it arrived,
// fifo keeps arrival order, a starved request keeps its turn, and the real
// passed-over counts are left alone.
TEST(Admission, LookaheadRanksTheWindowInTheSchedulersOrder) {
  std::unordered_map<int32_t, double> seen;
  RadixIndex index(1 << 20, std::make_unique<LookaheadSeen>(&seen));
  index.insert_virtual(1, Tokens{1, 2, 3, 4, 5, 6}, 1);  // node of "a": six tokens
  index.insert_virtual(1, Tokens{9, 9}, 1);              // "b": two
  index.insert_virtual(1, Tokens{7}, 1);                 // "c": one
  Queue q;
  q.lookups = {{{1, {7, 8}}}, {{1, {9, 9, 8}}}, {{1, {1, 2, 3, 4, 5, 6, 8}}}};
  const auto node = [&](Tokens t) { return index.peek(1, t).pieces.at(0).node; };
  const int32_t a = node({1, 2, 3, 4, 5, 6}), b = node({9, 9}), c = node({7});
  auto waiting = q.waiting({2, 3, 7});
  const Admission lpm({{"lpm", 3}, 3, true});
  EXPECT_EQ(expected_order(lpm.scheduler(), waiting, index), (std::vector<size_t>{2, 1, 0}));
  lpm.refresh_lookahead(index, waiting);
  EXPECT_DOUBLE_EQ(seen.at(a), 1.0) << "the longest match runs next";
  EXPECT_DOUBLE_EQ(seen.at(b), 2.0 / 3);
  EXPECT_DOUBLE_EQ(seen.at(c), 1.0 / 3);
  EXPECT_EQ(q.passed, (std::vector<int>{0, 0, 0})) << "the prediction counts on copies";
  const Admission fifo({{"fifo", 3}, 3, true});
  EXPECT_EQ(expected_order(fifo.scheduler(), waiting, index), (std::vector<size_t>{0, 1, 2}));
  fifo.refresh_lookahead(index, waiting);
  EXPECT_DOUBLE_EQ(seen.at(c), 1.0);
  EXPECT_DOUBLE_EQ(seen.at(a), 1.0 / 3);
  // #0 has waited 3 times (the bound): it goes first, then lpm's order.
  waiting = q.waiting({2, 3, 7}, {3, 0, 0});
  EXPECT_EQ(expected_order(lpm.scheduler(), waiting, index), (std::vector<size_t>{0, 2, 1}));
  // #0 reaches the bound when the first predicted pick passes it over: it
  // then goes before #1, whose match is longer.
  waiting = q.waiting({2, 3, 7}, {2, 0, 0});
  EXPECT_EQ(expected_order(lpm.scheduler(), waiting, index), (std::vector<size_t>{2, 0, 1}));
  EXPECT_EQ(q.passed, (std::vector<int>{2, 0, 0}));
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

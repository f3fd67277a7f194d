// The scheduler shared by the engine and the simulator: each order on a
// hand-made queue over a real index, and the starvation bound.
#include <gtest/gtest.h>

#include "kv/radix_index.h"
#include "strategy/scheduler.h"
#include "util/error.h"

namespace depcache {
namespace {

using Tokens = std::vector<int32_t>;

struct Queue {
  std::vector<std::vector<Lookup>> lookups;
  std::vector<WaitingRequest> waiting(std::vector<int64_t> prompt_tokens,
                                      std::vector<int> passed = {}) const {
    std::vector<WaitingRequest> q;
    for (size_t i = 0; i < lookups.size(); ++i)
      q.push_back({&lookups[i], prompt_tokens[i], passed.empty() ? 0 : passed[i]});
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

}  // namespace
}  // namespace depcache

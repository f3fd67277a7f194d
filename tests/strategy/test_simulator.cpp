// The cache simulator: hit rates at the extremes of capacity, the classic
// cyclic pattern where lookahead beats recency, schedulers, and errors.
#include <gtest/gtest.h>

#include "model/tokenizer.h"
#include "model/vocab.h"
#include "strategy/prompt_parts.h"
#include "strategy/scheduler.h"
#include "strategy/simulator.h"
#include "util/error.h"

namespace depcache {
namespace {

DepPrompt prompt_with(const Tokenizer& tok, const std::vector<std::string>& entities,
                      const std::string& q = "Q?") {
  RagRequest r;
  r.question = q;
  for (const std::string& e : entities)
    r.entities.push_back({e, e, {e + " -rel-> a thing of some length", e + " -rel-> another thing"}});
  return make_prompt_parts(tok, r).dep_prompt();
}

TEST(Simulator, InfiniteCapacityReusesEverythingSeenBefore) {
  const Tokenizer tok(Vocab::builtin_bytes());
  const std::vector<DepPrompt> prompts = {prompt_with(tok, {"dog", "cat"}), prompt_with(tok, {"cat", "dog"})};
  SimulationOptions o;
  o.capacity_tokens = 1 << 30;
  const SimulationResult r = simulate(prompts, o);
  const auto task = static_cast<int64_t>(prompts[1].segments().back().tokens.size());
  // First request: nothing cached. Second: everything but the task.
  EXPECT_EQ(r.cached_tokens, static_cast<int64_t>(prompts[1].size()) - task);
  EXPECT_NEAR(r.token_hit_rate,
              0.5 * static_cast<double>(r.cached_tokens) / static_cast<double>(prompts[1].size()), 1e-12);
  EXPECT_DOUBLE_EQ(r.item_hit_rate, 0.5);  // 2 of 4 items served were fully cached
  // The distinct KV is one request's worth (the same runs, reordered).
  EXPECT_EQ(distinct_kv_tokens(prompts, PositionScheme::Depth),
            static_cast<int64_t>(prompts[0].size()) - task);
  o.capacity_tokens = 0;
  EXPECT_EQ(simulate(prompts, o).cached_tokens, 0);
}

// e0 e1 e2 e0 e1 e2 ... with room for less than the three entities: LRU
// always evicts the one needed next; LACR's lookahead keeps what the queue is
// about to use.
TEST(Simulator, LookaheadBeatsRecencyOnACycle) {
  const Tokenizer tok(Vocab::builtin_bytes());
  std::vector<DepPrompt> prompts;
  for (int i = 0; i < 30; ++i)
    prompts.push_back(prompt_with(tok, {std::string("entity") + std::to_string(i % 3)}));
  const int64_t distinct = distinct_kv_tokens(prompts, PositionScheme::Depth);
  const int64_t lead = prompts[0].segments()[0].tokens.size();
  SimulationOptions o;
  o.window = 4;
  // Just short of everything: one leaf must go each time.
  o.capacity_tokens = distinct - 7;
  o.policy = "lru";
  const SimulationResult lru = simulate(prompts, o);
  o.policy = "lacr";
  const SimulationResult lacr = simulate(prompts, o);
  EXPECT_EQ(lru.item_hit_rate, 0.0);
  EXPECT_GT(lacr.item_hit_rate, 0.3);
  EXPECT_GT(lacr.token_hit_rate, lru.token_hit_rate + 0.05);
  // Room for about two of the three.
  o.capacity_tokens = lead + 2 * (distinct - lead) / 3 + 2;
  o.policy = "lru";
  const double lru_tokens = simulate(prompts, o).token_hit_rate;
  o.policy = "lacr";
  EXPECT_GT(simulate(prompts, o).token_hit_rate, lru_tokens + 0.05);
}

TEST(Simulator, SchedulersServeEveryRequestOnce) {
  const Tokenizer tok(Vocab::builtin_bytes());
  std::vector<DepPrompt> prompts;
  for (int i = 0; i < 12; ++i)
    prompts.push_back(prompt_with(
        tok, {std::string("e") + std::to_string(i % 4), std::string("f") + std::to_string(i % 2)}));
  for (const std::string& s : scheduler_names()) {
    SimulationOptions o;
    o.scheduler = s;
    o.capacity_tokens = 1 << 20;
    const SimulationResult r = simulate(prompts, o);
    std::vector<size_t> order = r.order;
    std::sort(order.begin(), order.end());
    for (size_t i = 0; i < order.size(); ++i) ASSERT_EQ(order[i], i) << s;
    if (s == "lpm" || s == "ragcache") {
      EXPECT_NE(r.order, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));  // repeats jump ahead
    }
  }
  SimulationOptions bad;
  bad.scheduler = "random";
  EXPECT_THROW(simulate(prompts, bad), Error);
  bad.scheduler = "fifo";
  bad.policy = "nope";
  EXPECT_THROW(simulate(prompts, bad), Error);
}

}  // namespace
}  // namespace depcache

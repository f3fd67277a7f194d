// The cache simulator: hit rates at the extremes of capacity, the classic
// cyclic pattern where lookahead beats recency, schedulers, and errors.
#include <gtest/gtest.h>

#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "strategy/scheduler.h"
#include "strategy/simulator.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

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

PromptParts parts_with(const Tokenizer& tok, const std::vector<std::string>& docs, const std::string& q) {
  RagRequest r;
  r.question = q;
  for (const std::string& d : docs) r.entities.push_back({d, d, {d + " -rel-> a thing of some length"}});
  return make_prompt_parts(tok, r);
}

// RAGCache's knowledge tree: [S, D1, D2] then [S, D1, D3] reuses S and D1
// (a document in the context of those before it); [S, D2, D1] reuses S only
// (order matters); the question is never stored, so asking the same
// documents again reuses everything but the question; and a document is
// reused whole or not at all, even when its first tokens are cached (D1x
// begins like D1).
TEST(Simulator, KnowledgeTreeReusesWholeDocumentsInTheirContext) {
  const Tokenizer tok(Vocab::builtin_bytes());
  const std::vector<PromptParts> parts = {
      parts_with(tok, {"d1", "d2"}, "first?"), parts_with(tok, {"d1", "d3"}, "second?"),
      parts_with(tok, {"d2", "d1"}, "third?"), parts_with(tok, {"d1", "d3"}, "fourth?"),
      parts_with(tok, {"d1x", "d2"}, "fifth?")};
  const auto len = [](const std::vector<int32_t>& v) { return static_cast<int64_t>(v.size()); };
  const auto doc = [&](size_t r, size_t i) { return len(parts[r].items[i].paths[0]); };
  const int64_t sys = len(parts[0].system);
  const std::vector<SimulatedRequest> reqs = simulated_requests(parts, "ragcache", PositionScheme::Depth);
  ASSERT_EQ(reqs.size(), parts.size());
  EXPECT_EQ(reqs[0].runs.size(), 1u);
  EXPECT_EQ(reqs[0].runs[0].stops, (std::vector<int64_t>{sys, sys + doc(0, 0), sys + doc(0, 0) + doc(0, 1)}));
  EXPECT_EQ(len(reqs[0].runs[0].tokens), sys + doc(0, 0) + doc(0, 1)) << "no question";
  SimulationOptions o;
  o.capacity_tokens = 1 << 30;
  const SimulationResult r = simulate(reqs, o);
  const int64_t want = 0 + (sys + doc(1, 0)) + sys + (sys + doc(3, 0) + doc(3, 1)) + sys;
  EXPECT_EQ(r.cached_tokens, want);
  EXPECT_DOUBLE_EQ(r.item_hit_rate, 3.0 / 10.0);  // d1 in the second, d1 and d3 in the fourth

  // What schedulers see of a knowledge-tree lookup: whole documents only.
  RadixIndex index(1 << 20);
  const CacheRun& run = reqs[0].runs[0];
  index.insert_virtual(run.ns, std::span<const int32_t>(run.tokens).first(run.stops[1] + 2), 1);
  const Lookup lookup{run.ns, run.tokens, run.stops};
  EXPECT_EQ(index.peek(run.ns, run.tokens).length, run.stops[1] + 2);
  EXPECT_EQ(cached_length(index, lookup), run.stops[1]) << "two tokens into d2 are not d2";
  EXPECT_EQ(whole_stops({}, 7), 7);
  EXPECT_EQ(whole_stops(std::vector<int64_t>{5, 9}, 4), 0);
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
    o.scheduler.order = s;
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
  bad.scheduler.order = "random";
  EXPECT_THROW(simulate(prompts, bad), Error);
  bad.scheduler.order = "fifo";
  bad.policy = "nope";
  EXPECT_THROW(simulate(prompts, bad), Error);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

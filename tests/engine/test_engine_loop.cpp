// The engine on its own thread: clients on many threads get, each, the
// tokens the request gives alone; cancellation, rejection, draining and
// shutdown end every stream and leave no rows and no pins behind.
#include <gtest/gtest.h>

#include <thread>

#include "engine/engine_loop.h"
#include "engine_fixtures.h"
#include "graph_requests.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::graph_request;
using test::greedy;

std::vector<RagRequest> requests() {
  return {graph_request({test::kDog, test::kCat}, "Which animals?"),
          graph_request({test::kOwl, test::kDog2}, "Which eat mice?"),
          graph_request({test::kCat}, "What do cats like?"),
          graph_request({test::kDog, test::kOwl, test::kCat}, "Which?")};
}

// Everything a stream delivers, until it ends (a stream that goes quiet for
// 20 s fails the test instead of hanging it).
std::vector<int32_t> drain_tokens(RequestStream& s) {
  std::vector<int32_t> tokens;
  while (const auto e = s.next(std::chrono::seconds(20))) tokens.push_back(e->token);
  if (!s.done()) ADD_FAILURE() << "the stream neither delivered nor ended in 20 s";
  return tokens;
}

TEST(EngineLoop, ClientsOnManyThreadsGetWhatEachRequestGivesAlone) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  const auto reqs = requests();
  std::vector<std::vector<int32_t>> alone;
  for (const RagRequest& r : reqs)
    alone.push_back(
        test::run_alone(model, test::engine_options(), "depcache", make_prompt_parts(tok, r), greedy(6))
            .tokens);
  EngineLoop loop(model, test::engine_options());
  constexpr int kClients = 8, kEach = 4;
  std::vector<std::vector<std::vector<int32_t>>> got(kClients);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c)
    clients.emplace_back([&, c] {
      for (int i = 0; i < kEach; ++i) {
        const size_t which = static_cast<size_t>(c + i) % reqs.size();
        auto s = loop.submit(c % 2 ? "depcache" : "full", make_prompt_parts(tok, reqs[which]), greedy(6));
        std::vector<int32_t> tokens = drain_tokens(*s);
        const RequestResult r = s->result();
        EXPECT_EQ(r.state, RequestState::Finished) << r.error;
        EXPECT_EQ(tokens, r.tokens) << "the events carry every token";
        if (c % 2)
          got[c].push_back(tokens);  // depcache: compared below with alone
        else
          EXPECT_EQ(tokens.size(), 6u);
      }
    });
  for (std::thread& t : clients) t.join();
  for (int c = 1; c < kClients; c += 2)
    for (int i = 0; i < kEach; ++i)
      EXPECT_EQ(got[c][i], alone[static_cast<size_t>(c + i) % reqs.size()]) << "client " << c << " #" << i;
  ASSERT_TRUE(loop.drain(std::chrono::steady_clock::now() + std::chrono::seconds(30)));
  const EngineSnapshot snap = loop.snapshot();
  EXPECT_EQ(snap.pool_free, snap.pool_rows);
  EXPECT_EQ(snap.pinned_nodes, 0u);
  EXPECT_EQ(snap.waiting + snap.running, 0u);
  EXPECT_GT(snap.steps, 0);
}

TEST(EngineLoop, CancelRejectDrainAndShutdownEndEveryStream) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  const PromptParts parts = make_prompt_parts(tok, requests()[0]);
  {
    EngineLoop loop(model, test::engine_options());
    // Rejected at submission: the stream ends Failed with the engine's reason.
    auto bad = loop.submit("fastest", parts, greedy(4));
    EXPECT_TRUE(drain_tokens(*bad).empty());
    EXPECT_EQ(bad->result().state, RequestState::Failed);
    EXPECT_EQ(bad->result().error_kind, ErrorKind::InvalidInput);
    EXPECT_NE(bad->result().error.find("strategy"), std::string::npos) << bad->result().error;
    // Cancelled from another thread after its first token.
    auto long_one = loop.submit("depcache", parts, greedy(1000));
    ASSERT_TRUE(long_one->next(std::chrono::seconds(20)).has_value());
    std::thread([&] { loop.cancel(long_one); }).join();
    drain_tokens(*long_one);
    EXPECT_EQ(long_one->result().state, RequestState::Cancelled);
    // Draining with requests that cannot finish in time cancels them.
    auto a = loop.submit("depcache", parts, greedy(1000));
    auto b = loop.submit("full", parts, greedy(1000));
    EXPECT_FALSE(loop.drain(std::chrono::steady_clock::now()));  // already past: whatever runs is cancelled
    for (auto* s : {&a, &b}) {
      drain_tokens(**s);
      EXPECT_EQ((*s)->result().state, RequestState::Cancelled);
    }
    // After draining nothing is accepted.
    auto late = loop.submit("depcache", parts, greedy(2));
    EXPECT_TRUE(drain_tokens(*late).empty());
    EXPECT_EQ(late->result().state, RequestState::Failed);
    const EngineSnapshot snap = loop.snapshot();
    EXPECT_EQ(snap.pool_free, snap.pool_rows);
    EXPECT_EQ(snap.pinned_nodes, 0u);
  }
  // Shutting down with a request in flight ends its stream too.
  std::shared_ptr<RequestStream> orphan;
  {
    EngineLoop loop(model, test::engine_options());
    orphan = loop.submit("depcache", parts, greedy(1000));
    ASSERT_TRUE(orphan->next(std::chrono::seconds(20)).has_value());
  }
  drain_tokens(*orphan);
  EXPECT_EQ(orphan->result().state, RequestState::Cancelled);
  // Options the engine refuses fail the constructor.
  EngineOptions bad = test::engine_options();
  bad.scheduler = {"nope", 2};
  EXPECT_THROW(EngineLoop(model, bad), Error);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

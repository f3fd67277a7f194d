// The engine: requests batched in one forward pass (prefills of admitted
// requests and decode tokens of running ones) give what each gives alone;
// the shared KV pool admits, waits and frees; cancellations and failures
// leave no rows and no pins behind.
#include <gtest/gtest.h>

#include <random>

#include "engine/engine.h"
#include "graph_requests.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "test_support.h"
#include "util/error.h"
#include "util/numeric.h"

namespace depcache {
namespace {

using test::entity;
using test::graph_request;

// Shorter than the strategy tests' entities: many requests fit a small pool.
const RequestEntity kDog =
    entity("dog", {"dog -hypernym-> canine -hypernym-> carnivore", "dog -member of-> pack"});
const RequestEntity kCat = entity("cat", {"cat -hypernym-> feline", "cat -likes-> milk"});
const RequestEntity kOwl = entity("owl", {"owl -eats-> mice", "owl -hypernym-> bird of prey"});

struct Job {
  std::string strategy;
  RagRequest request;
};

std::vector<Job> jobs() {
  RagRequest text;
  text.question = "What happened?";
  text.text = "Once upon a time there was a dog who liked to run.";
  RagRequest docs;
  docs.question = "Who barks?";
  docs.documents = {{"d1", "Dogs", "Dogs bark at night."}, {"d2", "Cats", "Cats purr."}};
  return {{"depcache", graph_request({kDog, kCat}, "Which animals?")},
          {"prefix", graph_request({kDog, kOwl}, "Which animals eat mice?")},
          {"full", text},
          {"depcache", docs},
          {"depcache", graph_request({kOwl, kCat, kDog}, "Which?")},
          {"prefix", graph_request({kDog, kCat}, "Which animals?")}};
}

EngineOptions options(DType kv = DType::F32) {
  EngineOptions o;
  o.pool_rows = 2048;
  o.kv_type = kv;
  o.threads = 2;
  o.strategy = {PositionScheme::Depth, true};
  return o;
}

SamplingParams greedy(int n) {
  SamplingParams s;
  s.max_tokens = n;
  s.stop_at_eog = false;
  return s;
}

// Each request alone (a fresh engine each, so nothing is reused across
// them) and all of them at once in one engine, where their prefills share a
// forward pass with each other and with the others' decode tokens.
TEST(Engine, BatchedEqualsEachRequestAlone) {
  for (DType kv : {DType::F32, DType::F16}) {
    const auto model = test::random_model("tiny", DType::F32);
    const Tokenizer tok(Vocab::builtin_bytes());
    const auto js = jobs();
    std::vector<RequestResult> alone;
    for (const Job& j : js) {
      Engine e(model, options(kv));
      const RequestId id = e.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(6));
      e.run_until_idle();
      alone.push_back(e.result(id));
      ASSERT_EQ(alone.back().state, RequestState::Finished) << alone.back().error;
    }
    Engine e(model, options(kv));
    std::vector<RequestId> ids;
    for (const Job& j : js) ids.push_back(e.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(6)));
    // A late arrival joins while the others decode.
    e.step();
    e.step();
    const RequestId late = e.submit("depcache", make_prompt_parts(tok, js[0].request), greedy(6));
    e.run_until_idle();
    for (size_t i = 0; i < js.size(); ++i) {
      const RequestResult& r = e.result(ids[i]);
      ASSERT_EQ(r.state, RequestState::Finished) << r.error;
      const std::string label =
          js[i].strategy + " #" + std::to_string(i) + (kv == DType::F16 ? " f16" : " f32");
      // f16 K/V: the same rows rounded the same way; only sums differ.
      EXPECT_LT(test::max_abs_diff(r.report.logits, alone[i].report.logits, label),
                kv == DType::F32 ? 1e-4 : 2e-3);
      EXPECT_EQ(r.tokens, alone[i].tokens) << label;
      EXPECT_TRUE(r.finite);
    }
    const RequestResult& l = e.result(late);
    EXPECT_GT(l.report.reused_tokens, 0) << "the late request reuses the first one's subtrees";
    EXPECT_LT(test::max_abs_diff(l.report.logits, alone[0].report.logits, "late arrival"),
              kv == DType::F32 ? 1e-4 : 2e-3);
    EXPECT_EQ(l.tokens, alone[0].tokens);
    EXPECT_EQ(e.pool().n_free(), e.pool().n_rows()) << "every row back in the pool";
    EXPECT_EQ(e.index().n_pinned(), 0u);
  }
}

// Whatever order the scheduler admits them in, each request's answer is the
// one it gives alone (small batches, so the orders differ).
TEST(Engine, EverySchedulerGivesTheSameAnswers) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  const auto js = jobs();
  std::vector<std::vector<int32_t>> alone;
  for (const Job& j : js) {
    Engine e(model, options());
    const RequestId id = e.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(4));
    e.run_until_idle();
    alone.push_back(e.result(id).tokens);
  }
  for (const char* order : {"fifo", "lpm", "lsp", "ragcache"}) {
    EngineOptions o = options();
    o.scheduler = {order, 2};
    o.batch_tokens = 1;  // one admission per step
    Engine e(model, o);
    std::vector<RequestId> ids;
    for (const Job& j : js) ids.push_back(e.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(4)));
    e.run_until_idle();
    for (size_t i = 0; i < js.size(); ++i) EXPECT_EQ(e.result(ids[i]).tokens, alone[i]) << order << " #" << i;
  }
  EngineOptions bad = options();
  bad.scheduler = {"nope", 2};
  EXPECT_THROW(Engine(model, bad), Error);
}

// The batched engine against the plain single-request path (plan applied on
// its own assembly, then decoding with Forward::eval), which shares no
// batching code.
TEST(Engine, EqualsTheSingleRequestPath) {
  const auto model = test::random_model("tiny-qwen2", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  Engine e(model, options());
  std::vector<RequestId> ids;
  const auto js = jobs();
  for (const Job& j : js) ids.push_back(e.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(5)));
  e.run_until_idle();
  ThreadPool pool(2);
  Forward fwd(model, pool);
  for (size_t i = 0; i < js.size(); ++i) {
    RadixIndex none(0);
    KvCache kv(model->config(), 1024, DType::F32);
    StrategyOptions so{PositionScheme::Depth, false};
    const PrefillReport rep = make_strategy(js[i].strategy, none, *model, DType::F32, so)
                                  ->prefill(make_prompt_parts(tok, js[i].request), kv, fwd);
    std::vector<int32_t> tokens = {argmax(rep.logits)};
    std::vector<float> logits;
    for (int t = 1; t < 5; ++t) {
      const std::vector<int32_t> one = {tokens.back()};
      fwd.eval(one, kv, Logits::Last, logits);
      tokens.push_back(argmax(logits));
    }
    EXPECT_EQ(e.result(ids[i]).tokens, tokens) << js[i].strategy << " #" << i;
  }
}

// A pool too small for everything at once: requests wait for rows and all
// finish; one too large for the pool fails clearly; random cancellations and
// a request with a bad token leave no rows and no pins behind.
TEST(Engine, PoolAdmissionCancellationAndFailures) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  EngineOptions o = options();
  o.pool_rows = 300;  // about two requests at a time
  o.batch_tokens = 64;
  Engine e(model, o);
  const auto js = jobs();
  std::mt19937 rng(3);
  std::vector<RequestId> ids;
  int cancelled = 0;
  for (int round = 0; round < 40; ++round) {
    const Job& j = js[rng() % js.size()];
    ids.push_back(e.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(1 + rng() % 8)));
    if (rng() % 5 == 0) {
      e.cancel(ids[rng() % ids.size()]);
      ++cancelled;
    }
    if (rng() % 2) e.step();
    e.pool().check_invariants();
    ASSERT_NO_THROW(e.index().check_invariants());
  }
  PromptParts bad = make_prompt_parts(tok, js[0].request);
  bad.task.push_back(model->config().n_vocab + 1);
  const RequestId bad_id = e.submit("depcache", bad, greedy(3));
  const RequestId huge = e.submit("full", make_prompt_parts(tok, js[2].request), greedy(400));
  e.run_until_idle();
  EXPECT_EQ(e.result(bad_id).state, RequestState::Failed);
  EXPECT_NE(e.result(bad_id).error.find("vocabulary"), std::string::npos) << e.result(bad_id).error;
  EXPECT_EQ(e.result(huge).state, RequestState::Failed);
  EXPECT_NE(e.result(huge).error.find("KV rows"), std::string::npos) << e.result(huge).error;
  int finished = 0;
  for (RequestId id : ids) {
    const RequestResult& r = e.result(id);
    EXPECT_TRUE(r.state == RequestState::Finished || r.state == RequestState::Cancelled) << r.error;
    finished += r.state == RequestState::Finished;
  }
  EXPECT_GT(finished, 20);
  EXPECT_GT(cancelled, 0);
  EXPECT_EQ(e.n_waiting() + e.n_running(), 0u);
  EXPECT_EQ(e.pool().n_free(), e.pool().n_rows());
  e.pool().check_invariants();
  EXPECT_EQ(e.index().n_pinned(), 0u);
  EXPECT_THROW(e.submit("fastest", make_prompt_parts(tok, js[0].request), greedy(1)), Error);
}

TEST(KvPool, RandomAllocationsKeepTheFreeListSound) {
  const auto model = test::random_model("tiny", DType::F32);
  KvPool pool(model->config(), 1000, DType::F16);
  std::mt19937 rng(7);
  std::vector<RowBlock> held;
  for (int op = 0; op < 1000; ++op) {
    if (rng() % 3 != 0 || held.empty()) {
      if (auto b = pool.allocate(1 + static_cast<int64_t>(rng() % 60))) held.push_back(std::move(*b));
    } else {
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(rng() % held.size()));
    }
    ASSERT_NO_THROW(pool.check_invariants()) << "op " << op;
    int64_t in_use = 0;
    for (const RowBlock& b : held) in_use += b.n_rows();
    ASSERT_EQ(pool.n_free() + in_use, pool.n_rows());
  }
  // Blocks never overlap.
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const RowBlock& b : held) spans.emplace_back(b.row0(), b.row0() + b.n_rows());
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  held.clear();
  EXPECT_EQ(pool.n_free(), pool.n_rows());
  EXPECT_EQ(pool.largest_free(), pool.n_rows()) << "freed blocks merge back into one";
  EXPECT_FALSE(pool.allocate(1001));
}

}  // namespace
}  // namespace depcache

// The engine: requests batched in one forward pass (prefills of admitted
// requests and decode tokens of running ones) give what each gives alone;
// the shared KV pool admits, waits and frees; cancellations and failures
// leave no rows and no pins behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "compute/kv_format.h"
#include "engine/engine.h"
#include "engine/text_output.h"
#include "engine_fixtures.h"
#include "graph_requests.h"
#include "kv/disk_store.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "strategy/simulator.h"
#include "test_support.h"
#include "util/error.h"
#include "util/numeric.h"
#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::engine_options;
using test::entity;
using test::graph_request;
using test::greedy;
using test::run_alone;

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
  RagRequest swapped = docs;
  std::swap(swapped.documents[0], swapped.documents[1]);
  swapped.question = "Who purrs?";
  return {{"depcache", graph_request({kDog, kCat}, "Which animals?")},
          {"prefix", graph_request({kDog, kOwl}, "Which animals eat mice?")},
          {"full", text},
          {"depcache", docs},
          {"depcache", graph_request({kOwl, kCat, kDog}, "Which?")},
          {"prefix", graph_request({kDog, kCat}, "Which animals?")},
          // Chunk strategies: two passes each, the second with a layer hook
          // (cacheblend) or after attention statistics (fusionrag).
          {"cacheblend", docs},
          {"fusionrag", swapped},
          {"fullreuse", graph_request({kOwl, kDog}, "Which?")},
          {"fusionrag", docs},
          {"cacheblend", swapped},
          // Cache-Craft: one pass with statistics from every layer, and a
          // focus hook once a variant placed in another context is fixed.
          {"cachecraft", docs},
          {"cachecraft", swapped},
          {"cachecraft", graph_request({kOwl, kCat, kDog}, "Which?")},
          {"cachecraft", graph_request({kCat, kDog, kOwl}, "Which?")}};
}

// Each request alone (a fresh engine each, so nothing is reused across
// them) and all of them at once in one engine, where their prefills share a
// forward pass with each other and with the others' decode tokens.
TEST(Engine, BatchedEqualsEachRequestAlone) {
  for (DType kv : kv_types()) {
    // f16 and q8_0 K/V: the same rows rounded the same way; only sums
    // differ, and a sum that differs can round a q8_0 row another way.
    const double tolerance = kv == DType::F32 ? 1e-4 : kv == DType::F16 ? 2e-3 : 2e-2;
    const auto model = test::random_model("tiny", DType::F32);
    const Tokenizer tok(Vocab::builtin_bytes());
    const auto js = jobs();
    std::vector<RequestResult> alone;
    for (const Job& j : js) {
      alone.push_back(
          run_alone(model, engine_options(kv), j.strategy, make_prompt_parts(tok, j.request), greedy(6)));
      ASSERT_EQ(alone.back().state, RequestState::Finished) << alone.back().error;
    }
    Engine e(model, engine_options(kv));
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
      const std::string label = js[i].strategy + " #" + std::to_string(i) + " " + kv_type_name(kv);
      EXPECT_LT(test::max_abs_diff(r.report.logits, alone[i].report.logits, label), tolerance);
      EXPECT_EQ(r.tokens, alone[i].tokens) << label;
      EXPECT_TRUE(r.finite);
    }
    const RequestResult& l = e.result(late);
    EXPECT_GT(l.report.reused_tokens, 0) << "the late request reuses the first one's subtrees";
    EXPECT_LT(test::max_abs_diff(l.report.logits, alone[0].report.logits, "late arrival"), tolerance);
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
  for (const Job& j : js)
    alone.push_back(
        run_alone(model, engine_options(), j.strategy, make_prompt_parts(tok, j.request), greedy(4)).tokens);
  for (const char* order : {"fifo", "lpm", "lsp", "ragcache"}) {
    EngineOptions o = engine_options();
    o.scheduler = {order, 2};
    o.batch_tokens = 1;  // one admission per step
    Engine e(model, o);
    std::vector<RequestId> ids;
    for (const Job& j : js) ids.push_back(e.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(4)));
    e.run_until_idle();
    for (size_t i = 0; i < js.size(); ++i) EXPECT_EQ(e.result(ids[i]).tokens, alone[i]) << order << " #" << i;
  }
  // One request in flight at a time: the same answers, never two running.
  EngineOptions one = engine_options();
  one.max_running = 1;
  Engine e(model, one);
  std::vector<RequestId> ids;
  for (const Job& j : js) ids.push_back(e.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(4)));
  while (e.step()) ASSERT_LE(e.n_running(), 1u);
  for (size_t i = 0; i < js.size(); ++i)
    EXPECT_EQ(e.result(ids[i]).tokens, alone[i]) << "one at a time #" << i;
  EngineOptions bad = engine_options();
  bad.scheduler = {"nope", 2};
  EXPECT_THROW(Engine(model, bad), Error);
}

// The reference the batched engine is compared with: a request's plan
// carried out on an assembly of its own, pass by pass, by PlanExecution and
// Forward alone (no pieces, no shared pool, no other sequence, nothing
// cached), then `n` tokens decoded greedily with Forward::eval.
std::vector<int32_t> unbatched_greedy(const RequestPlan& plan, Forward& fwd, int n) {
  RadixIndex none(0);
  KvAssembly kv(fwd.model().config(), 1024, DType::F32);
  PlanExecution ex(plan, none, kv, 0);
  std::vector<float> logits;
  for (;;) {
    PrefillResult pass = fwd.prefill(ex.prefill(), kv);
    const PassResult done{pass.attention_mass, ex.prefill().visibility.n_pairs(), 0};
    if (!ex.final_pass()) {
      ex.next_pass(kv, 0, done);
      continue;
    }
    kv.set_n_past(static_cast<int64_t>(plan.tokens.size()));
    logits = ex.finish(kv, 0, std::move(pass.logits), done).logits;
    break;
  }
  std::vector<int32_t> tokens = {argmax(logits)};
  for (int t = 1; t < n; ++t) {
    const std::vector<int32_t> one = {tokens.back()};
    fwd.eval(one, kv, Logits::Last, logits);
    tokens.push_back(argmax(logits));
  }
  return tokens;
}

// The batched engine against that reference, which shares no batching code.
TEST(Engine, EqualsTheUnbatchedReference) {
  const auto model = test::random_model("tiny-qwen2", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  Engine e(model, engine_options());
  std::vector<RequestId> ids;
  const auto js = jobs();
  for (const Job& j : js) ids.push_back(e.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(5)));
  e.run_until_idle();
  ThreadPool pool(2);
  Forward fwd(model, pool);
  for (size_t i = 0; i < js.size(); ++i) {
    StrategyOptions so{PositionScheme::Depth, false};
    const RequestPlan plan =
        make_strategy(js[i].strategy, *model, DType::F32, so)->plan(make_prompt_parts(tok, js[i].request));
    EXPECT_EQ(e.result(ids[i]).tokens, unbatched_greedy(plan, fwd, 5)) << js[i].strategy << " #" << i;
  }
}

// What front ends that are not serving ask of the engine: a request computed
// alone beside the shared cache (run --verify's reference), a plan made
// outside its strategies (chunks fuse), and waiting for one request.
TEST(Engine, RequestsAloneAndOwnPlansGoThroughTheEngine) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  const PromptParts parts = make_prompt_parts(tok, graph_request({kDog, kCat}, "Which animals?"));
  EngineOptions no_reuse = engine_options();
  no_reuse.strategy.reuse = false;
  const RequestResult want = run_alone(model, no_reuse, "depcache", parts, greedy(4));
  ASSERT_EQ(want.state, RequestState::Finished) << want.error;

  Engine e(model, engine_options());
  const RequestResult first = e.wait(e.submit("depcache", parts, greedy(4)));
  EXPECT_EQ(first.report.reused_tokens, 0);
  const size_t bytes = e.index().bytes(), nodes = e.index().n_nodes();
  ASSERT_GT(nodes, 0u);
  const RequestResult alone = e.wait(e.submit("depcache", parts, greedy(4), {}, CacheUse::None));
  EXPECT_EQ(alone.report.reused_tokens, 0) << "nothing looked up";
  EXPECT_EQ(alone.report.computed_tokens, alone.report.prompt_tokens);
  EXPECT_EQ(e.index().bytes(), bytes) << "nothing stored";
  EXPECT_EQ(e.index().n_nodes(), nodes);
  EXPECT_LT(test::max_abs_diff(alone.report.logits, want.report.logits, "alone"), 1e-5);
  EXPECT_EQ(alone.tokens, want.tokens);
  const RequestResult shared = e.wait(e.submit("depcache", parts, greedy(4)));
  EXPECT_GT(shared.report.reused_tokens, 0) << "the shared cache is still there";

  // A plan of the strategy's own, submitted as a plan: the same request.
  const RequestPlan plan =
      make_strategy("depcache", *model, DType::F32, engine_options().strategy)->plan(parts);
  const RequestResult planned = e.wait(e.submit_plan(plan, greedy(4)));
  EXPECT_EQ(planned.report.reused_tokens, shared.report.reused_tokens);
  EXPECT_EQ(planned.tokens, shared.tokens);

  // wait() throws a failed request's error; the engine goes on.
  EngineOptions small = engine_options();
  small.pool_rows = 16;
  Engine tiny(model, small);
  EXPECT_THROW(tiny.wait(tiny.submit("full", parts, greedy(2))), Error);
  EXPECT_EQ(tiny.pool().n_free(), tiny.pool().n_rows());
  EXPECT_THROW(e.submit("nope", parts, greedy(1), {}, CacheUse::None), Error);
}

// Every prompt row's logits (SamplingParams::prompt_logits), from a prompt
// cut into pieces and batched beside another request, equal one causal
// pass of Forward::eval over the prompt.
TEST(Engine, PromptLogitsEqualOneCausalPass) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  PromptParts parts;
  parts.text = tok.encode("Once upon a time there was a dog who liked to run.", true, false);
  const auto n = static_cast<int64_t>(parts.text.size());
  const int n_vocab = model->config().n_vocab;
  ThreadPool pool(2);
  Forward fwd(model, pool);
  KvAssembly kv(model->config(), 256, DType::F32);
  std::vector<float> want;
  fwd.eval(parts.text, kv, Logits::All, want);
  ASSERT_EQ(want.size(), static_cast<size_t>(n * n_vocab));

  EngineOptions o = engine_options();
  o.batch_tokens = 7;  // pieces over several steps
  Engine e(model, o);
  SamplingParams s = greedy(3);
  s.prompt_logits = true;
  const RequestId other = e.submit("depcache", make_prompt_parts(tok, jobs()[0].request), greedy(3));
  const RequestId id = e.submit("full", parts, s);
  const RequestResult& r = e.wait(id);
  ASSERT_EQ(r.prompt_logits.size(), want.size());
  EXPECT_LT(test::max_abs_diff(r.prompt_logits, want, "prompt logits"), 1e-4);
  EXPECT_LT(test::max_abs_diff(r.report.logits, std::vector<float>(want.end() - n_vocab, want.end()),
                               "first token"),
            1e-4);
  EXPECT_TRUE(e.result(other).prompt_logits.empty()) << "only when asked";
  e.run_until_idle();
}

// Prompts cut into pieces over several steps (a budget far below their
// length, decode tokens taking part of it) give the logits and tokens of the
// whole prefill.
TEST(Engine, ChunkedPrefillEqualsWholePrefill) {
  const auto model = test::random_model("tiny-qwen2", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  const auto js = jobs();
  for (int64_t budget : {int64_t{5}, int64_t{23}}) {
    Engine whole(model, engine_options());
    EngineOptions o = engine_options();
    o.batch_tokens = budget;
    Engine cut(model, o);
    std::vector<RequestId> a, b;
    for (const Job& j : js) {
      a.push_back(whole.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(5)));
      b.push_back(cut.submit(j.strategy, make_prompt_parts(tok, j.request), greedy(5)));
    }
    whole.run_until_idle();
    int steps = 0;
    while (cut.step()) ++steps;
    for (size_t i = 0; i < js.size(); ++i) {
      const RequestResult &x = whole.result(a[i]), &y = cut.result(b[i]);
      ASSERT_EQ(y.state, RequestState::Finished) << y.error;
      EXPECT_LT(test::max_abs_diff(y.report.logits, x.report.logits, "chunked"), 1e-4) << budget << " #" << i;
      EXPECT_EQ(y.tokens, x.tokens) << budget << " #" << i;
      // Pieces spread admissions over steps, so later requests may reuse more.
      EXPECT_GE(y.report.reused_tokens, x.report.reused_tokens);
    }
    int64_t computed = 0;  // by strategies whose passes may be cut (not the whole ones of recompute)
    for (size_t i = 0; i < js.size(); ++i)
      if (js[i].strategy != "cacheblend" && js[i].strategy != "fusionrag" && js[i].strategy != "cachecraft")
        computed += cut.result(b[i]).report.computed_tokens;
    EXPECT_GE(steps, computed / budget) << "no step computed more than the budget";
    EXPECT_EQ(cut.pool().n_free(), cut.pool().n_rows());
    EXPECT_EQ(cut.index().n_pinned(), 0u);
  }
}

// A prefill cancelled midway leaves what it computed in the index (whole
// documents under ragcache), so the same prompt submitted again reuses it
// and still answers as a fresh engine does; prefill_piece_tokens caps what
// a request computes in one step.
TEST(Engine, ACancelledPrefillKeepsWhatItComputed) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  RagRequest docs;
  docs.question = "Who barks at night and who purrs?";
  docs.documents = {{"d1", "Dogs", "Dogs bark at night when the moon is up."},
                    {"d2", "Cats", "Cats purr when they are content and warm."}};
  const std::vector<Job> cases = {{"prefix", docs},
                                  {"ragcache", docs},
                                  {"depcache", graph_request({kDog, kCat, kOwl}, "Which animals?")}};
  for (const Job& j : cases) {
    SCOPED_TRACE(j.strategy);
    const PromptParts parts = make_prompt_parts(tok, j.request);
    const RequestResult alone = run_alone(model, engine_options(), j.strategy, parts, greedy(4));
    ASSERT_GT(alone.report.computed_tokens, 100);
    EngineOptions o = engine_options();
    o.batch_tokens = 200;
    Engine e(model, o);
    SamplingParams small = greedy(4);
    small.prefill_piece_tokens = 40;
    const RequestId first = e.submit(j.strategy, parts, small);
    for (int i = 0; i < 2; ++i) e.step();
    EXPECT_TRUE(e.result(first).tokens.empty()) << "40 tokens a step: the prefill is not done";
    e.cancel(first);
    EXPECT_EQ(e.result(first).state, RequestState::Cancelled);
    EXPECT_GT(e.kept_partial_tokens(), 0);
    EXPECT_EQ(e.index().n_pinned(), 0u);
    ASSERT_NO_THROW(e.index().check_invariants());
    const RequestId again = e.submit(j.strategy, parts, greedy(4));
    e.run_until_idle();
    const RequestResult& r = e.result(again);
    ASSERT_EQ(r.state, RequestState::Finished) << r.error;
    EXPECT_GT(r.report.reused_tokens, 0) << "the cancelled prefill's tokens are found";
    EXPECT_LE(r.report.reused_tokens, 80) << "no more than the two pieces computed";
    EXPECT_LT(test::max_abs_diff(r.report.logits, alone.report.logits, "after a cancel"), 1e-4);
    EXPECT_EQ(r.tokens, alone.tokens);
    EXPECT_EQ(e.pool().n_free(), e.pool().n_rows());
  }
  // Lifted, the cap no longer holds a prefill back (the budget is 200 a step).
  EngineOptions o = engine_options();
  o.batch_tokens = 200;
  Engine e(model, o);
  SamplingParams small = greedy(1);
  small.prefill_piece_tokens = 40;
  const RequestId lifted = e.submit("full", make_prompt_parts(tok, docs), small);
  e.step();
  e.set_prefill_piece_tokens(lifted, 0);
  EXPECT_THROW(e.set_prefill_piece_tokens(lifted, -1), Error);
  int steps = 0;
  while (e.result(lifted).tokens.empty() && e.step()) ++steps;
  EXPECT_LE(steps, 2) << "the rest of a prompt of about 200 tokens in one or two steps";
  SamplingParams negative = greedy(1);
  negative.prefill_piece_tokens = -1;
  EXPECT_THROW(e.submit("full", make_prompt_parts(tok, docs), negative), Error);
}

// A pool that cannot hold every sequence's generated rows: the latest
// admitted give theirs back and are prefilled again later with what they
// generated, and each request still answers what it answers alone.
TEST(Engine, PreemptedRequestsResumeWithTheSameTokens) {
  for (const char* strategy : {"full", "depcache", "cacheblend", "fusionrag", "cachecraft"}) {
    const auto model = test::random_model("tiny", DType::F32);
    const Tokenizer tok(Vocab::builtin_bytes());
    const auto js = jobs();
    std::vector<std::vector<int32_t>> alone;
    for (const Job& j : js)
      alone.push_back(
          run_alone(model, engine_options(), strategy, make_prompt_parts(tok, j.request), greedy(40)).tokens);
    EngineOptions o = engine_options();
    o.pool_rows = 400;  // every prompt fits; their 40 generated rows each do not, all at once
    o.decode_rows_ahead = 3;
    Engine e(model, o);
    std::vector<RequestId> ids;
    for (const Job& j : js) ids.push_back(e.submit(strategy, make_prompt_parts(tok, j.request), greedy(40)));
    while (e.step()) {
      e.pool().check_invariants();
      ASSERT_NO_THROW(e.index().check_invariants());
    }
    for (size_t i = 0; i < js.size(); ++i) {
      const RequestResult& r = e.result(ids[i]);
      ASSERT_EQ(r.state, RequestState::Finished) << r.error;
      EXPECT_EQ(r.tokens, alone[i]) << strategy << " #" << i << " preempted " << r.preemptions << " times";
      EXPECT_TRUE(r.finite);
    }
    EXPECT_GT(e.preemptions(), 0) << strategy;
    EXPECT_GT(e.pool().moved_rows(), 0) << "blocks grew by moving";
    EXPECT_EQ(e.pool().n_free(), e.pool().n_rows());
    EXPECT_EQ(e.index().n_pinned(), 0u);
  }
}

// Two requests that share subtrees arrive together: the second waits for
// the first's prefill (split over steps) and reuses what it computed,
// instead of computing the same tokens beside it; both answer as alone.
TEST(Engine, WaitsForAPrefillUnderWayThatComputesItsTokens) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  const RagRequest a = graph_request({kDog, kCat}, "Which animals?");
  const RagRequest b = graph_request({kCat, kDog, kOwl}, "Which eat mice?");
  const std::vector<int32_t> alone_b =
      run_alone(model, engine_options(), "depcache", make_prompt_parts(tok, b), greedy(4)).tokens;
  int64_t computed[2] = {};
  for (bool wait : {false, true}) {
    EngineOptions o = engine_options();
    o.batch_tokens = 16;  // the first prefill takes several steps
    o.wait_for_shared = wait;
    Engine e(model, o);
    const RequestId ia = e.submit("depcache", make_prompt_parts(tok, a), greedy(4));
    const RequestId ib = e.submit("depcache", make_prompt_parts(tok, b), greedy(4));
    e.run_until_idle();
    const RequestResult &ra = e.result(ia), &rb = e.result(ib);
    ASSERT_EQ(rb.state, RequestState::Finished) << rb.error;
    EXPECT_EQ(rb.tokens, alone_b) << "wait " << wait;
    computed[wait] = ra.report.computed_tokens + rb.report.computed_tokens;
    if (wait)
      EXPECT_GT(rb.report.reused_tokens, 0) << "the dog and cat subtrees come from the first request";
    else
      EXPECT_EQ(rb.report.reused_tokens, 0) << "admitted beside it, nothing was in the index yet";
  }
  EXPECT_LT(computed[1], computed[0]);
}

// Streaming text ends before the earliest stop string, and nothing that
// could begin one is streamed before it is known not to.
TEST(TextOutput, StopsBeforeTheFirstStopStringAndHoldsBackItsStart) {
  const Tokenizer tok(Vocab::builtin_bytes());
  // One token per byte (encode would prefix a space).
  std::map<char, int32_t> byte_token;
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (const std::string piece = tok.token_to_piece(id); piece.size() == 1) byte_token.emplace(piece[0], id);
  const auto stream = [&](const std::string& text, std::vector<std::string> stop,
                          std::vector<std::string>* pieces) {
    TextOutput out(tok, std::move(stop));
    std::string all;
    for (char c : text) {
      pieces->push_back(out.push(byte_token.at(c)));
      all += pieces->back();
    }
    all += out.finish();
    EXPECT_EQ(all, out.text());
    return std::make_pair(all, out.stopped());
  };
  std::vector<std::string> pieces;
  EXPECT_EQ(stream("Hello world, stop here", {"stop", "here"}, &pieces),
            std::make_pair(std::string("Hello world, "), true));
  // After "Hello world, s" nothing of the "s" has been streamed.
  std::string so_far;
  for (size_t i = 0; i < 14; ++i) so_far += pieces[i];
  EXPECT_EQ(so_far, "Hello world, ");
  pieces.clear();
  EXPECT_EQ(stream("no end in sight, sto", {"stop"}, &pieces),
            std::make_pair(std::string("no end in sight, sto"), false));
  pieces.clear();
  EXPECT_EQ(stream("abcabd", {"abd", ""}, &pieces), std::make_pair(std::string("abc"), true));
  pieces.clear();
  EXPECT_EQ(stream("plain", {}, &pieces), std::make_pair(std::string("plain"), false));
}

// With a tokenizer the engine streams text; a stop string taken from the
// middle of a request's greedy text ends it there, with fewer tokens.
TEST(Engine, StopStringsEndTheText) {
  const auto model = test::random_model("tiny", DType::F32);
  const auto tok = std::make_shared<const Tokenizer>(Vocab::builtin_bytes());
  EngineOptions o = engine_options();
  o.tokenizer = tok;
  const PromptParts parts = make_prompt_parts(*tok, jobs()[2].request);
  Engine e(model, o);
  const RequestId free = e.submit("full", parts, greedy(24));
  e.run_until_idle();
  const RequestResult& all = e.result(free);
  ASSERT_EQ(all.finish_reason, FinishReason::Length);
  ASSERT_GT(all.text.size(), 8u);
  const std::string stop = all.text.substr(all.text.size() / 2, 2);
  const size_t cut = all.text.find(stop);
  std::string streamed;
  SamplingParams sp = greedy(24);
  sp.stop = {stop};
  const RequestId id = e.submit("full", parts, sp, [&](const TokenEvent& ev) { streamed += ev.text; });
  e.run_until_idle();
  const RequestResult& r = e.result(id);
  EXPECT_EQ(r.finish_reason, FinishReason::Stop);
  EXPECT_EQ(r.text, all.text.substr(0, cut));
  EXPECT_EQ(streamed, r.text);
  EXPECT_LT(r.tokens.size(), all.tokens.size());
  Engine no_tokenizer(model, engine_options());
  EXPECT_THROW(no_tokenizer.submit("full", parts, sp), Error);
}

// The simulator replays a stream through the same index, policies and
// admission (scheduler, window, LACR's lookahead) with virtual nodes; served
// one at a time, the engine must find exactly the hits the simulator
// predicts, request by request, under eviction. (Cost-aware policies differ
// by design: the engine feeds them measured times, the simulator a formula.)
TEST(Engine, HitRateEqualsTheSimulators) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  std::vector<RequestEntity> pool = {kDog, kCat, kOwl, test::kDog, test::kCat, test::kDog2, test::kOwl};
  pool.push_back(entity("fox", {"fox -hypernym-> canine", "fox -eats-> mice", "fox -lives in-> den"}));
  pool.push_back(entity("bee", {"bee -makes-> honey", "bee -lives in-> hive -part of-> garden"}));
  std::mt19937 rng(11);
  std::vector<RagRequest> reqs;
  std::vector<PromptParts> parts;
  for (int i = 0; i < 40; ++i) {
    std::vector<RequestEntity> picked;
    const size_t k = 1 + rng() % 3;
    for (size_t j = 0; j < k; ++j) {
      // Skewed: low indices come back often.
      const size_t at = std::min<size_t>(rng() % pool.size(), rng() % pool.size());
      picked.push_back(pool[at]);
    }
    reqs.push_back(graph_request(picked, i % 2 ? "Which animals?" : "What do they eat?"));
    parts.push_back(make_prompt_parts(tok, reqs.back()));
  }
  KvAssembly one(model->config(), 1, DType::F32);
  const int64_t row = 0;
  const size_t bytes_per_token = one.extract({&row, 1}).bytes();
  for (const char* strategy : {"depcache", "fullreuse"}) {
    const std::vector<SimulatedRequest> prompts = simulated_requests(parts, strategy, PositionScheme::Depth);
    const int64_t distinct = distinct_kv_tokens(prompts);
    for (const char* policy : {"lru", "lfu", "lacr"})
      for (const char* order : {"fifo", "lpm"}) {
        SimulationOptions so;
        so.policy = policy;
        so.scheduler.order = order;
        so.capacity_tokens = distinct * 2 / 5;
        so.window = 8;
        so.scheme = PositionScheme::Depth;
        const SimulationResult sim = simulate(prompts, so);
        EngineOptions eo = engine_options();
        eo.policy = policy;
        eo.scheduler = so.scheduler;
        eo.window = so.window;
        eo.max_running = 1;
        eo.cache_bytes = static_cast<size_t>(so.capacity_tokens) * bytes_per_token;
        Engine e(model, eo);
        std::vector<RequestId> ids;
        for (const RagRequest& r : reqs)
          ids.push_back(e.submit(strategy, make_prompt_parts(tok, r), greedy(1)));
        e.run_until_idle();
        double hit = 0;
        for (RequestId id : ids) {
          const PrefillReport& rep = e.result(id).report;
          hit += static_cast<double>(rep.reused_tokens) / static_cast<double>(rep.prompt_tokens);
        }
        hit /= static_cast<double>(ids.size());
        EXPECT_NEAR(hit, sim.token_hit_rate, 1e-12) << strategy << " " << policy << " " << order;
        EXPECT_GT(sim.evicted_nodes, 0) << "the capacity must force evictions";
        EXPECT_GT(sim.token_hit_rate, 0.1);
      }
  }
}

// A pool too small for everything at once: requests wait for rows and all
// finish; one too large for the pool fails clearly; random cancellations and
// a request with a bad token leave no rows and no pins behind.
TEST(Engine, PoolAdmissionCancellationAndFailures) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  EngineOptions o = engine_options();
  o.pool_rows = 300;  // about two requests at a time
  o.batch_tokens = 64;
  o.decode_rows_ahead = 2;  // blocks grow, move, and get preempted
  Engine e(model, o);
  const auto js = jobs();
  std::mt19937 rng(3);
  std::vector<RequestId> ids;
  int cancelled = 0;
  for (int round = 0; round < 1000; ++round) {
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
  while (e.step()) e.pool().check_invariants();
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
  EXPECT_GT(finished, 500);
  EXPECT_GT(cancelled, 100);
  EXPECT_GT(e.preemptions(), 0);
  EXPECT_EQ(e.n_waiting() + e.n_running(), 0u);
  EXPECT_EQ(e.pool().n_free(), e.pool().n_rows());
  e.pool().check_invariants();
  EXPECT_EQ(e.index().n_pinned(), 0u);
  EXPECT_THROW(e.submit("fastest", make_prompt_parts(tok, js[0].request), greedy(1)), Error);
}

// Allocations, growth (in place, by moving, by compacting) and releases in
// random order: the free list stays sound and every block keeps its rows'
// contents (each row is stamped with its block and index).
TEST(KvPool, RandomAllocationsGrowthAndReleasesKeepRows) {
  const auto model = test::random_model("tiny", DType::F32);
  KvPool pool(model->config(), 1000, DType::F32);
  KvAssembly& kv = pool.kv();
  const int64_t elems = kv.row_elems();
  struct Held {
    RowBlock block;
    int stamp;
  };
  auto stamp_rows = [&](const Held& h, int64_t from) {
    std::vector<float> row(elems);
    for (int64_t i = from; i < h.block.n_rows(); ++i) {
      std::fill(row.begin(), row.end(), static_cast<float>(h.stamp * 10000 + i));
      for (int il = 0; il < kv.n_layer(); ++il) kv.write(il, h.block.row0() + i, row.data(), row.data(), 1);
      const int32_t pos = h.stamp + static_cast<int32_t>(i);
      kv.set_positions(h.block.row0() + i, {&pos, 1});
    }
  };
  auto rows_intact = [&](const Held& h) {
    std::vector<float> k(elems), v(elems);
    for (int64_t i = 0; i < h.block.n_rows(); ++i)
      for (int il = 0; il < kv.n_layer(); ++il) {
        kv.read(il, h.block.row0() + i, k.data(), v.data());
        if (k[0] != static_cast<float>(h.stamp * 10000 + i) || v[elems - 1] != k[0] ||
            kv.position(h.block.row0() + i) != h.stamp + i)
          return false;
      }
    return true;
  };
  std::mt19937 rng(7);
  std::vector<Held> held;
  int grown = 0, next_stamp = 1;
  for (int op = 0; op < 1000; ++op) {
    const unsigned what = rng() % 6;
    if (what < 3 || held.empty()) {
      if (auto b = pool.allocate(1 + static_cast<int64_t>(rng() % 60))) {
        held.push_back({std::move(*b), next_stamp++});
        stamp_rows(held.back(), 0);
      }
    } else if (what < 5) {
      Held& h = held[rng() % held.size()];
      const int64_t before = h.block.n_rows(), want = before + 1 + static_cast<int64_t>(rng() % 40);
      const int64_t free_before = pool.n_free();
      if (pool.grow(h.block, want)) {
        ASSERT_EQ(h.block.n_rows(), want);
        stamp_rows(h, before);
        ++grown;
      } else {
        ASSERT_LT(free_before, want - before) << "grow refused with enough free rows";
        ASSERT_EQ(h.block.n_rows(), before);
      }
    } else {
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(rng() % held.size()));
    }
    ASSERT_NO_THROW(pool.check_invariants()) << "op " << op;
    int64_t in_use = 0;
    for (const Held& h : held) {
      in_use += h.block.n_rows();
      ASSERT_TRUE(rows_intact(h)) << "op " << op << ": block " << h.stamp << " lost its rows";
    }
    ASSERT_EQ(pool.n_free() + in_use, pool.n_rows());
  }
  EXPECT_GT(grown, 100);
  EXPECT_GT(pool.moved_rows(), 0);
  std::vector<RowBlock> blocks;
  for (Held& h : held) blocks.push_back(std::move(h.block));
  held.clear();
  // Blocks never overlap.
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const RowBlock& b : blocks) spans.emplace_back(b.row0(), b.row0() + b.n_rows());
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  blocks.clear();
  EXPECT_EQ(pool.n_free(), pool.n_rows());
  EXPECT_EQ(pool.largest_free(), pool.n_rows()) << "freed blocks merge back into one";
  EXPECT_FALSE(pool.allocate(1001));
}

// Layer-wise preload through the engine: the spans of every strategy's
// requests, persisted to a disk tier, are read layer by layer while the
// requests' first passes compute (several depths, and the automatic one).
// One request at a time (so the cache evolves alike), every answer is
// bit for bit the one whole loads give; all at once, the exact strategies
// answer as alone. The loads are adopted (files gone, nodes hot) and
// nothing stays pinned. With the last layer of every file corrupted, the
// passes that placed them are void: each such request runs again without
// the bad nodes (counted as a preemption), which leave the index, and it
// answers as with whole loads, which find the bad files before computing.
class LayerLoadEngine : public ::testing::Test {
 protected:
  using Mode = RadixIndex::LayerPreload::Mode;
  void SetUp() override {
    dir_ = test::temp_path("layer-load-engine");
    model_ = test::random_model("tiny", DType::F32, false, 6);
    for (const Job& j : jobs()) parts_.push_back({j.strategy, make_prompt_parts(tok_, j.request)});
    // Every request's spans, persisted.
    DiskSpanStore disk(dir_ / "seed", 64 << 20);
    Engine e(model_, engine_options(DType::F16));
    EngineTestPeer::index(e).attach_disk(disk);
    for (const auto& [strategy, parts] : parts_) e.submit(strategy, parts, greedy(5));
    e.run_until_idle();
    e.save_strategy_state(dir_ / "seed");
    EngineTestPeer::index(e).persist();
    ASSERT_GT(disk.n_files(), 10u);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The persisted cache copied to `name`, optionally with a byte of every
  // span file's last layer flipped.
  std::filesystem::path cache_copy(const std::string& name, bool corrupt_last_layer) {
    const auto to = dir_ / name;
    std::filesystem::copy(dir_ / "seed", to, std::filesystem::copy_options::recursive);
    if (corrupt_last_layer)
      for (const auto& entry : std::filesystem::directory_iterator(to)) {
        if (entry.path().extension() != ".kvspan") continue;
        std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-5, std::ios::end);
        f.put('\x5a');
      }
    return to;
  }

  struct Outcome {
    std::vector<RequestResult> results;
    RadixIndex::Stats stats;
    int64_t preemptions = 0;
    size_t files_before = 0, files_after = 0, disk_nodes = 0;
  };
  // Every request on an engine over a copy of the cache (max_running 1: one
  // at a time, in order).
  Outcome run_all(const std::string& label, RadixIndex::LayerPreload preload, size_t max_running,
                  bool corrupt) {
    const auto cache = cache_copy(label, corrupt);
    DiskSpanStore disk(cache, 64 << 20);
    Outcome out;
    out.files_before = disk.n_files();
    EngineOptions o = engine_options(DType::F16);
    o.max_running = max_running;
    Engine e(model_, o);
    EngineTestPeer::index(e).attach_disk(disk);
    EngineTestPeer::index(e).set_layer_preload(preload);
    e.load_strategy_state(cache);
    std::vector<RequestId> ids;
    for (const auto& [strategy, parts] : parts_) ids.push_back(e.submit(strategy, parts, greedy(5)));
    while (e.step()) EXPECT_NO_THROW(e.index().check_invariants()) << label;
    for (RequestId id : ids) {
      out.results.push_back(e.result(id));
      EXPECT_EQ(out.results.back().state, RequestState::Finished)
          << label << ": " << out.results.back().error;
      EXPECT_TRUE(out.results.back().finite);
      EXPECT_GE(out.results.back().report.layer_wait_ms, 0);
    }
    EXPECT_EQ(e.index().n_pinned(), 0u) << label;
    EXPECT_EQ(e.pool().n_free(), e.pool().n_rows()) << label;
    out.stats = e.index().stats();
    out.preemptions = e.preemptions();
    out.files_after = disk.n_files();
    out.disk_nodes = e.index().n_nodes(Tier::Disk);
    return out;
  }

  static int64_t from_disk(const Outcome& o) {
    int64_t n = 0;
    for (const RequestResult& r : o.results) n += r.report.reused_from[static_cast<int>(Tier::Disk)];
    return n;
  }

  // Bit for bit the same answers; with same_reuse, from the same reuse too.
  // Without it only the strategies whose reuse is exact are compared: the
  // approximate ones (chunk reuse, Cache-Craft's variants) answer from what
  // they reused, which then differs.
  void expect_same(const Outcome& got, const Outcome& want, const std::string& label,
                   bool same_reuse = true) {
    ASSERT_EQ(got.results.size(), want.results.size());
    for (size_t i = 0; i < got.results.size(); ++i) {
      const std::string& strategy = parts_[i].first;
      if (!same_reuse && strategy != "full" && strategy != "prefix" && strategy != "depcache") continue;
      EXPECT_EQ(got.results[i].tokens, want.results[i].tokens) << label << " #" << i;
      EXPECT_EQ(got.results[i].report.logits, want.results[i].report.logits) << label << " #" << i;
      if (!same_reuse) continue;
      EXPECT_EQ(got.results[i].report.reused_tokens, want.results[i].report.reused_tokens)
          << label << " #" << i;
    }
  }

  std::filesystem::path dir_;
  std::shared_ptr<const Model> model_;
  Tokenizer tok_{Vocab::builtin_bytes()};
  std::vector<std::pair<std::string, PromptParts>> parts_;
};

TEST_F(LayerLoadEngine, SpansReadLayerByLayerGiveTheAnswersOfWholeLoads) {
  const Outcome whole = run_all("off", {Mode::Off, 0}, 1, false);
  EXPECT_GT(from_disk(whole), 0);
  for (const auto& [label, preload] :
       std::vector<std::pair<std::string, RadixIndex::LayerPreload>>{{"depth 0", {Mode::Fixed, 0}},
                                                                     {"depth 2", {Mode::Fixed, 2}},
                                                                     {"depth 6", {Mode::Fixed, 6}},
                                                                     {"auto", {Mode::Auto, 0}}}) {
    const Outcome layered = run_all(label, preload, 1, false);
    expect_same(layered, whole, label);
    EXPECT_EQ(from_disk(layered), from_disk(whole)) << label;
    EXPECT_EQ(layered.stats.dropped_bad, 0) << label;
    EXPECT_EQ(layered.files_after, whole.files_after) << label << ": every load adopted, its file removed";
  }
  // All at once, several loads in flight: the exact strategies answer as alone.
  const Outcome together = run_all("together", {Mode::Auto, 0}, 0, false);
  EXPECT_GT(from_disk(together), 0);
  EXPECT_LT(together.files_after, together.files_before);
  for (size_t i = 0; i < parts_.size(); ++i) {
    const auto& [strategy, parts] = parts_[i];
    if (strategy != "full" && strategy != "prefix" && strategy != "depcache") continue;
    const RequestResult alone = run_alone(model_, engine_options(DType::F16), strategy, parts, greedy(5));
    EXPECT_EQ(together.results[i].tokens, alone.tokens) << strategy << " #" << i;
    EXPECT_LT(test::max_abs_diff(together.results[i].report.logits, alone.report.logits, strategy), 2e-3)
        << i;
  }
}

TEST_F(LayerLoadEngine, ABadLayerMidPassRunsTheRequestAgainWithoutIt) {
  const Outcome whole = run_all("bad, off", {Mode::Off, 0}, 1, true);
  EXPECT_GT(whole.stats.dropped_bad, 0);
  for (const auto& [label, preload] : std::vector<std::pair<std::string, RadixIndex::LayerPreload>>{
           {"bad, depth 1", {Mode::Fixed, 1}}, {"bad, auto", {Mode::Auto, 0}}}) {
    const Outcome layered = run_all(label, preload, 1, true);
    // Which request reuses a span recomputed in place of a bad one depends on
    // when the next request's fetch-ahead reads the bad file (before or after
    // the running request puts its own copy back): the exact strategies'
    // answers do not (Cache-Craft's did once, under ThreadSanitizer's timing).
    expect_same(layered, whole, label, /*same_reuse=*/false);
    EXPECT_GT(layered.stats.dropped_bad, 0) << label;
    EXPECT_GT(layered.preemptions, 0) << label << ": the requests that placed bad spans ran again";
    EXPECT_EQ(layered.disk_nodes, whole.disk_nodes) << label;
  }
  const Outcome together = run_all("bad, together", {Mode::Fixed, 1}, 0, true);
  EXPECT_GT(together.stats.dropped_bad, 0);
  EXPECT_EQ(together.disk_nodes, 0u) << "no bad span is left in the index";
}

// A request alone on an engine runs again the same way.
TEST_F(LayerLoadEngine, ALoneRequestRunsAgainWithoutABadLayer) {
  std::vector<PrefillReport> reports;
  std::vector<size_t> disk_nodes;
  for (const auto& [label, preload] : std::vector<std::pair<std::string, RadixIndex::LayerPreload>>{
           {"single, off", {Mode::Off, 0}}, {"single, depth 1", {Mode::Fixed, 1}}}) {
    const auto cache = cache_copy(label, true);
    DiskSpanStore disk(cache, 64 << 20);
    EngineOptions o = engine_options(DType::F16);
    o.cache_bytes = 64 << 20;
    Engine e(model_, o);
    RadixIndex& index = EngineTestPeer::index(e);
    index.attach_disk(disk);
    index.set_layer_preload(preload);
    ASSERT_EQ(parts_[0].first, "depcache");
    reports.push_back(e.wait(e.submit("depcache", parts_[0].second, greedy(1))).report);
    EXPECT_GT(index.stats().dropped_bad, 0) << label;
    disk_nodes.push_back(index.n_nodes(Tier::Disk));  // other requests' spans, never read
    EXPECT_EQ(index.n_pinned(), 0u) << label;
    index.check_invariants();
  }
  EXPECT_EQ(reports[1].logits, reports[0].logits);
  EXPECT_EQ(reports[1].computed_tokens, reports[0].computed_tokens);
  EXPECT_EQ(disk_nodes[1], disk_nodes[0]);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

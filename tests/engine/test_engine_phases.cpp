// The engine's step in its phases, each checked alone: schedule decides what
// the step computes within the token budget, run computes it and advances
// no request, commit applies the outputs; composed, they answer as a
// request alone does.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::engine_options;
using test::greedy;

PromptParts text_prompt(const Tokenizer& tok, const std::string& question, const std::string& text) {
  RagRequest r;
  r.question = question;
  r.text = text;
  return make_prompt_parts(tok, r);
}

TEST(EngineSteps, ScheduleRunAndCommitEachDoTheirPart) {
  const auto model = test::random_model("tiny", DType::F32);
  const Tokenizer tok(Vocab::builtin_bytes());
  const PromptParts a = text_prompt(tok, "Who ran?", "Once upon a time there was a dog who liked to run.");
  const PromptParts b = text_prompt(tok, "Who purred?", "A cat sat by the fire and purred all night long.");
  const int64_t n_a = a.n_flat_tokens(), n_b = b.n_flat_tokens();
  ASSERT_GT(n_b, 10);
  EngineOptions o = engine_options();
  o.batch_tokens = n_a + 5;  // all of a's prefill and the first 5 tokens of b's
  Engine e(model, o);
  const RequestId ida = e.submit("full", a, greedy(3));
  const RequestId idb = e.submit("full", b, greedy(3));

  // Schedule: a whole, then a piece of b, in one plan; only a's last query
  // asks for logits (b's prefill is not done).
  const EngineTestPeer::StepBatch first = EngineTestPeer::schedule(e);
  ASSERT_EQ(first.pieces.size(), 2u);
  EXPECT_EQ(first.pieces[0].id, ida);
  EXPECT_EQ(first.pieces[0].begin, 0);
  EXPECT_EQ(first.pieces[0].end, n_a);
  EXPECT_TRUE(first.pieces[0].last);
  EXPECT_EQ(first.pieces[1].id, idb);
  EXPECT_EQ(first.pieces[1].end, 5);
  EXPECT_FALSE(first.pieces[1].last);
  EXPECT_TRUE(first.decoding.empty());
  EXPECT_EQ(static_cast<int64_t>(first.plan.tokens.size()), o.batch_tokens);
  EXPECT_EQ(first.plan.logits_for, std::vector<int64_t>{n_a - 1});

  // Run: the logits asked for, a cost per token, and no request advanced.
  const std::optional<EngineTestPeer::StepOutput> out = EngineTestPeer::run(e, first);
  ASSERT_TRUE(out.has_value());
  const int n_vocab = model->config().n_vocab;
  ASSERT_EQ(out->out.logits.size(), static_cast<size_t>(n_vocab));
  EXPECT_GT(out->ms_per_token, 0);
  EXPECT_TRUE(e.result(ida).tokens.empty());

  // Commit: a's first token is the greedy choice of those logits.
  EngineTestPeer::commit(e, first, *out);
  const auto argmax =
      std::max_element(out->out.logits.begin(), out->out.logits.end()) - out->out.logits.begin();
  ASSERT_EQ(e.result(ida).tokens.size(), 1u);
  EXPECT_EQ(e.result(ida).tokens[0], argmax);
  EXPECT_TRUE(e.result(idb).tokens.empty());

  // The next schedule decodes a's token first, at the position after its
  // prompt, and goes on with b where the first step left it.
  const EngineTestPeer::StepBatch second = EngineTestPeer::schedule(e);
  ASSERT_EQ(second.decoding.size(), 1u);
  EXPECT_EQ(second.plan.tokens[0], e.result(ida).tokens[0]);
  ASSERT_EQ(second.pieces.size(), 1u);
  EXPECT_EQ(second.pieces[0].id, idb);
  EXPECT_EQ(second.pieces[0].begin, 5);
  EXPECT_EQ(second.pieces[0].end, std::min(n_b, 5 + o.batch_tokens - 1));
  const std::optional<EngineTestPeer::StepOutput> out2 = EngineTestPeer::run(e, second);
  ASSERT_TRUE(out2.has_value());
  EngineTestPeer::commit(e, second, *out2);

  // Composed, the phases answer as each request alone does.
  e.run_until_idle();
  EXPECT_EQ(e.result(ida).tokens, test::run_alone(model, engine_options(), "full", a, greedy(3)).tokens);
  EXPECT_EQ(e.result(idb).tokens, test::run_alone(model, engine_options(), "full", b, greedy(3)).tokens);
  EXPECT_EQ(e.pool().n_free(), e.pool().n_rows());
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

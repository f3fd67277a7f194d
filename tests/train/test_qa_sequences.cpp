// Training sequences from QA requests, checked against the prompt the
// strategies serve, and the exact-match judge of generated answers.
#include <gtest/gtest.h>

#include "eval/answers.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "train/qa_sequences.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

RagRequest two_entity_request() {
  RagRequest r;
  r.id = "q1";
  r.question = "What is the home of Bolam?";
  r.answers = {"Kirat"};
  r.entities = {{"bolam", "Bolam", {"Bolam -home-> Kirat", "Bolam -friend-> Mezor -home-> Tisha"}},
                {"mezor", "Mezor", {"Mezor -home-> Tisha"}}};
  return r;
}

std::vector<int32_t> slice(const std::vector<int32_t>& v, int64_t begin, int64_t n) {
  return {v.begin() + begin, v.begin() + begin + n};
}

TEST(QaSequence, CausalIsTheFlatPromptThenTheAnswer) {
  const Tokenizer tok(Vocab::builtin_bytes());
  const RagRequest r = two_entity_request();
  const QaSequence q = qa_sequence(tok, r, {});
  const std::vector<int32_t> flat = make_prompt_parts(tok, r).flat();
  ASSERT_EQ(q.answer_begin, static_cast<int64_t>(flat.size()));
  EXPECT_EQ(slice(q.sequence.tokens, 0, q.answer_begin), flat);
  const std::vector<int32_t> answer = slice(q.sequence.tokens, q.answer_begin, q.answer_size);
  EXPECT_EQ(answer.back(), tok.eos());
  // The answer continues the prompt as its next word: one space, from the
  // tokenizer's own prefix (no lone space token before the name).
  const std::string text = tok.decode({q.sequence.tokens.data(), q.sequence.tokens.size() - 1});
  EXPECT_TRUE(text.ends_with("\nAnswer: Kirat\n")) << text;
  EXPECT_EQ(slice(answer, 0, answer.size() - 1), tok.encode("Kirat\n", false, false));
  for (size_t i = 0; i < q.sequence.positions.size(); ++i) EXPECT_EQ(q.sequence.positions[i], int32_t(i));
  // Every token predicts the next; with loss on the answer only, the
  // context predicts nothing.
  for (size_t i = 0; i + 1 < q.sequence.tokens.size(); ++i)
    EXPECT_EQ(q.sequence.targets[i], q.sequence.tokens[i + 1]);
  QaSequenceOptions answer_only;
  answer_only.loss_on_prompt = false;
  const QaSequence a = qa_sequence(tok, r, answer_only);
  for (int64_t i = 0; i + 1 < static_cast<int64_t>(a.sequence.tokens.size()); ++i)
    EXPECT_EQ(a.sequence.targets[i] >= 0, i + 1 >= a.answer_begin) << i;
}

// A tokenizer without a space prefix gets the answer's space written out.
TEST(QaSequence, TheAnswerKeepsExactlyOneSpace) {
  Vocab v = Vocab::builtin_bytes();
  for (const bool prefixed : {true, false}) {
    v.add_space_prefix = prefixed;
    const Tokenizer tok(v);
    std::vector<int32_t> prompt = tok.encode("Answer:", false, false);
    const std::vector<int32_t> answer = answer_tokens(tok, "Kirat");
    EXPECT_EQ(answer.back(), tok.eos());
    prompt.insert(prompt.end(), answer.begin(), answer.end() - 1);
    EXPECT_EQ(tok.decode(prompt), "Answer: Kirat\n") << "space prefix " << prefixed;
  }
}

// The template the sequence is built with is the one given (the model's).
TEST(QaSequence, BuiltWithTheModelsTemplate) {
  const Tokenizer tok(Vocab::builtin_bytes());
  const RagRequest r = two_entity_request();
  QaSequenceOptions o;
  o.prompt.system = "Facts:\n";
  o.prompt.task_prefix = "";
  o.prompt.task_suffix = " ->";
  const QaSequence q = qa_sequence(tok, r, o);
  EXPECT_EQ(slice(q.sequence.tokens, 0, q.answer_begin), make_prompt_parts(tok, r, o.prompt).flat());
  const std::string text = tok.decode(q.sequence.tokens);
  // Each part is encoded on its own, with the tokenizer's space prefix.
  EXPECT_TRUE(text.starts_with("Facts:\n Bolam -home-> Kirat")) << text;
  EXPECT_TRUE(text.ends_with("Mezor -home-> Tisha\n What is the home of Bolam? -> Kirat\n")) << text;
}

TEST(QaSequence, DependencyIsTheDepPromptWithTheAnswerUnderTheTask) {
  const Tokenizer tok(Vocab::builtin_bytes());
  const RagRequest r = two_entity_request();
  for (PositionScheme scheme : {PositionScheme::Depth, PositionScheme::Sequential}) {
    QaSequenceOptions o;
    o.attention = TrainAttention::Dependency;
    o.scheme = scheme;
    const QaSequence q = qa_sequence(tok, r, o);
    // The served DepPrompt, with the answer appended to its task segment.
    PromptParts parts = make_prompt_parts(tok, r);
    const int64_t n_prompt = static_cast<int64_t>(parts.dep_prompt().size());
    ASSERT_EQ(q.answer_begin, n_prompt);
    const std::vector<int32_t> served = parts.dep_prompt().tokens();
    EXPECT_EQ(slice(q.sequence.tokens, 0, n_prompt), served);
    const std::vector<int32_t> served_positions = parts.dep_prompt().positions(scheme);
    EXPECT_EQ(slice(q.sequence.positions, 0, n_prompt), served_positions);
    // The answer continues the task at the next positions and sees every row before it.
    for (int64_t i = 0; i < q.answer_size; ++i) {
      EXPECT_EQ(q.sequence.positions[n_prompt + i], served_positions.back() + 1 + i);
      EXPECT_EQ(q.sequence.visibility.n_visible(n_prompt + i), n_prompt + i + 1);
    }
    // The second entity's last token sees the system and its own tree, not the first entity's.
    const int64_t last_of_tree = n_prompt - static_cast<int64_t>(parts.task.size()) - 1;
    EXPECT_LT(q.sequence.visibility.n_visible(last_of_tree), last_of_tree + 1);
    EXPECT_EQ(q.sequence.visibility.n_visible(n_prompt - 1), n_prompt) << "the task sees everything";
    EXPECT_EQ(q.sequence.targets[n_prompt - 1], q.sequence.tokens[n_prompt])
        << "the task's last token cues the answer";
  }
}

// Position gaps: the served DepPrompt's tokens and visibility, each tree
// moved whole by a cumulative gap of 0..G (its own relative positions kept),
// the system text unmoved, and the task and answer after the last tree's
// gap. Over many request ids the gaps take every value 0..G.
TEST(QaSequence, PositionGapsMoveEachTreeWholeBy0ToGMore) {
  const Tokenizer tok(Vocab::builtin_bytes());
  RagRequest r = two_entity_request();
  QaSequenceOptions plain;
  plain.attention = TrainAttention::Dependency;
  const QaSequence base = qa_sequence(tok, r, plain);
  const DepPrompt served = make_prompt_parts(tok, r).dep_prompt();
  const std::vector<PromptSegment>& segs = served.segments();
  ASSERT_EQ(segs.size(), 4u);  // system, two trees, task
  constexpr int32_t kGap = 5;
  QaSequenceOptions gapped = plain;
  gapped.max_position_gap = kGap;
  std::vector<int> seen(kGap + 1, 0);
  bool varies = false;
  std::vector<int32_t> first;
  for (int k = 0; k < 200; ++k) {
    r.id = "q" + std::to_string(k);
    const QaSequence q = qa_sequence(tok, r, gapped);
    ASSERT_EQ(q.sequence.tokens, base.sequence.tokens);
    ASSERT_EQ(q.sequence.targets, base.sequence.targets);
    for (int64_t i = 0; i < static_cast<int64_t>(q.sequence.tokens.size()); ++i)
      ASSERT_EQ(q.sequence.visibility.n_visible(i), base.sequence.visibility.n_visible(i));
    // The shift of each token from its served position, segment by segment.
    const auto shift = [&](int64_t i) { return q.sequence.positions[i] - base.sequence.positions[i]; };
    int32_t before = 0;
    for (const PromptSegment& seg : segs) {
      const int32_t s0 = shift(seg.tokens.begin);
      for (int32_t i = seg.tokens.begin; i < seg.tokens.end; ++i) ASSERT_EQ(shift(i), s0) << "moved whole";
      if (seg.kind == SegmentKind::Tree) {
        ASSERT_GE(s0 - before, 0);
        ASSERT_LE(s0 - before, kGap);
        ++seen[s0 - before];
      } else {
        ASSERT_EQ(s0, before) << seg.label << ": only trees add a gap";
      }
      before = s0;
    }
    for (int64_t i = served.size(); i < static_cast<int64_t>(q.sequence.tokens.size()); ++i)
      ASSERT_EQ(shift(i), before) << "the answer follows the task";
    if (first.empty()) first = q.sequence.positions;
    varies |= q.sequence.positions != first;
    // The same request id draws the same gaps.
    ASSERT_EQ(qa_sequence(tok, r, gapped).sequence.positions, q.sequence.positions);
  }
  EXPECT_TRUE(varies);
  for (int g = 0; g <= kGap; ++g) EXPECT_GT(seen[g], 20) << "gap " << g;
}

// Trees alone: what a tree token sees in training is what the served
// DepPrompt says, the system text no longer; the task still sees everything.
TEST(QaSequence, TreesAloneAreTrainedAsServed) {
  const Tokenizer tok(Vocab::builtin_bytes());
  const RagRequest r = two_entity_request();
  QaSequenceOptions o;
  o.attention = TrainAttention::Dependency;
  o.tree_context = TreeContext::None;
  const QaSequence q = qa_sequence(tok, r, o);
  const DepPrompt served = make_prompt_parts(tok, r).dep_prompt(TreeContext::None);
  const auto n_system = static_cast<int64_t>(served.segments()[0].tokens.size());
  for (int32_t t = 0; t < static_cast<int32_t>(served.size()); ++t) {
    int64_t n = 0;
    for (const TokenRange& range : served.visible_ranges(t)) n += range.size();
    EXPECT_EQ(q.sequence.visibility.n_visible(t), n) << "token " << t;
  }
  const int64_t first_root = n_system;  // the first tree's root sees only itself
  EXPECT_EQ(q.sequence.visibility.n_visible(first_root), 1);
  const auto n_prompt = static_cast<int64_t>(served.size());
  EXPECT_EQ(q.sequence.visibility.n_visible(n_prompt - 1), n_prompt) << "the task sees everything";
}

TEST(QaSequence, RequestsOverOneContextShareASequence) {
  const Tokenizer tok(Vocab::builtin_bytes());
  std::vector<RagRequest> group(2, two_entity_request());
  group[1].id = "q2";
  group[1].question = "What is the home of Mezor?";
  group[1].answers = {"Tisha"};
  const std::vector<int32_t> task2 = make_prompt_parts(tok, group[1]).task;
  const auto answer_of = [&](const std::string& a) {
    std::vector<int32_t> t = tok.encode(a + "\n", false, false);
    t.push_back(tok.eos());
    return t;
  };
  for (const TrainAttention attention : {TrainAttention::Causal, TrainAttention::Dependency}) {
    QaSequenceOptions o;
    o.attention = attention;
    o.loss_on_prompt = false;
    const QaSequence one = qa_sequence(tok, group[0], o);
    const QaSequence both = qa_sequence(tok, group, o);
    // The first request's sequence, then the second's task and answer.
    const auto n1 = static_cast<int64_t>(one.sequence.tokens.size());
    std::vector<int32_t> want = one.sequence.tokens;
    want.insert(want.end(), task2.begin(), task2.end());
    const std::vector<int32_t> a2 = answer_of("Tisha");
    want.insert(want.end(), a2.begin(), a2.end());
    ASSERT_EQ(both.sequence.tokens, want);
    EXPECT_EQ(both.answer_begin, one.answer_begin);
    EXPECT_EQ(both.answer_size, one.answer_size);
    // The first part is trained as the request alone is, and the second
    // answer is in the loss, its question not.
    const auto n = static_cast<int64_t>(want.size());
    const int64_t answer2 = n - static_cast<int64_t>(a2.size());
    for (int64_t i = 0; i + 1 < n; ++i) {
      const bool in_answer = (i + 1 >= one.answer_begin && i + 1 < n1) || i + 1 >= answer2;
      EXPECT_EQ(both.sequence.targets[i] >= 0, in_answer) << i;
    }
    // Positions and visibility continue: the second question sees everything.
    for (int64_t i = n1; i < n; ++i) {
      EXPECT_EQ(both.sequence.positions[i], both.sequence.positions[i - 1] + 1);
      EXPECT_EQ(both.sequence.visibility.n_visible(i), i + 1);
    }
  }
  // A request over another context cannot share the sequence.
  group[1].entities.pop_back();
  EXPECT_THROW(qa_sequence(tok, group, {}), Error);
  EXPECT_THROW(qa_sequence(tok, std::span<const RagRequest>{}, {}), Error);
}

TEST(QaSequence, ARequestWithoutAnAnswerIsRefused) {
  const Tokenizer tok(Vocab::builtin_bytes());
  RagRequest r = two_entity_request();
  r.answers.clear();
  EXPECT_THROW(qa_sequence(tok, r, {}), Error);
}

TEST(AnswerJudge, TheAnswerEndsAtANewlineOrEndOfGeneration) {
  const Tokenizer tok(Vocab::builtin_bytes());
  const auto ids = [&tok](const std::string& s) { return tok.encode(s, false, false); };
  EXPECT_EQ(generated_answer(tok, ids(" Kirat\nThe next")), "Kirat");
  std::vector<int32_t> with_eos = ids(" Kirat");
  with_eos.push_back(tok.eos());
  const std::vector<int32_t> more = ids(" more");
  with_eos.insert(with_eos.end(), more.begin(), more.end());
  EXPECT_EQ(generated_answer(tok, with_eos), "Kirat");
  EXPECT_EQ(generated_answer(tok, ids("  Two words  ")), "Two words");
  EXPECT_EQ(generated_answer(tok, ids("\nKirat")), "");
  EXPECT_TRUE(answer_matches("Kirat", {"Mezor", "Kirat"}));
  EXPECT_FALSE(answer_matches("Kira", {"Kirat"}));
  EXPECT_FALSE(answer_matches("kirat", {"Kirat"})) << "exact, case included";
}

TEST(AnswerJudge, TokenF1IsSquadStyleAgainstTheBestAnswer) {
  EXPECT_DOUBLE_EQ(answer_f1("The Kirat!", {"kirat"}), 1.0);  // case, punctuation and articles aside
  // "Kirat river" vs "the Kirat": precision 1/2, recall 1 -> 2/3.
  EXPECT_NEAR(answer_f1("Kirat river", {"the Kirat"}), 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(answer_f1("Kirat river", {"Mezor", "Kirat River delta"}), 0.8, 1e-12);  // the best answer
  EXPECT_DOUBLE_EQ(answer_f1("Mezor", {"Kirat"}), 0.0);
  EXPECT_DOUBLE_EQ(answer_f1("", {"Kirat"}), 0.0);
  EXPECT_DOUBLE_EQ(answer_f1("the", {"a"}), 1.0);                    // both empty once articles go
  EXPECT_DOUBLE_EQ(answer_f1("Kirat Kirat", {"Kirat"}), 2.0 / 3.0);  // bags: one of two words matches
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

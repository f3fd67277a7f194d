#include "train/qa_sequences.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <limits>

#include "exec/visibility.h"
#include "prompt/prompt_parts.h"
#include "strategy/dependency_visibility.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/random.h"

namespace depcache {

std::string answer_text(const std::string& answer, bool space_prefixed) {
  return (space_prefixed ? "" : " ") + answer + "\n";
}

std::vector<int32_t> answer_tokens(const Tokenizer& tok, const std::string& answer) {
  std::vector<int32_t> out = tok.encode(answer_text(answer, tok.vocab().add_space_prefix), false, false);
  if (tok.eos() >= 0) out.push_back(tok.eos());
  return out;
}

void add_position_gaps(const DepPrompt& p, std::vector<int32_t>& positions, int32_t max_gap, uint64_t seed) {
  if (max_gap < 0) fail(ErrorKind::InvalidInput, "a position gap of {} is negative", max_gap);
  uint64_t state = seed;
  int64_t shift = 0;
  for (const PromptSegment& seg : p.segments()) {
    if (seg.kind == SegmentKind::Tree)
      shift += static_cast<int64_t>(splitmix64(state) % (static_cast<uint64_t>(max_gap) + 1));
    for (int32_t i = seg.tokens.begin; i < seg.tokens.end; ++i) {
      const int64_t moved = positions[i] + shift;
      if (moved > std::numeric_limits<int32_t>::max())
        fail(ErrorKind::InvalidInput, "position gaps of up to {} move token {} past the largest position",
             max_gap, i);
      positions[i] = static_cast<int32_t>(moved);
    }
  }
}

QaSequence qa_sequence(const Tokenizer& tok, const RagRequest& request, const QaSequenceOptions& o) {
  return qa_sequence(tok, std::span<const RagRequest>(&request, 1), o);
}

QaSequence qa_sequence(const Tokenizer& tok, std::span<const RagRequest> group, const QaSequenceOptions& o) {
  if (group.empty()) fail(ErrorKind::InvalidInput, "no request to make a training sequence of");
  PromptParts parts = make_prompt_parts(tok, group.front(), o.prompt);
  // Each request's task followed by its answer, in turn; answers[i]: whether
  // asked[i] is an answer token.
  std::vector<int32_t> asked;
  std::vector<bool> answers;
  QaSequence out;
  int64_t first_answer = 0;  // in `asked`
  for (size_t k = 0; k < group.size(); ++k) {
    const RagRequest& r = group[k];
    if (r.answers.empty() || r.answers.front().empty())
      fail(ErrorKind::InvalidInput, "request {} has no answer to train on", r.id);
    if (k > 0 && !same_context(group.front(), r))
      fail(ErrorKind::InvalidInput,
           "request {} does not have the context of request {}: cannot share a sequence", r.id,
           group.front().id);
    const std::vector<int32_t> task = k == 0 ? parts.task : task_tokens(tok, r, o.prompt);
    const std::vector<int32_t> answer = answer_tokens(tok, r.answers.front());
    asked.insert(asked.end(), task.begin(), task.end());
    answers.insert(answers.end(), task.size(), false);
    if (k == 0) {
      first_answer = static_cast<int64_t>(asked.size());
      out.answer_size = static_cast<int64_t>(answer.size());
    }
    asked.insert(asked.end(), answer.begin(), answer.end());
    answers.insert(answers.end(), answer.size(), true);
  }
  parts.task = asked;
  TrainSequence& s = out.sequence;
  const auto n_asked = static_cast<int64_t>(asked.size());
  // Whether token i (of the whole sequence of n) is in the loss.
  const auto in_loss = [&](int64_t i, int64_t n) {
    const int64_t at = i - (n - n_asked);
    return o.loss_on_prompt || (at >= 0 && answers[static_cast<size_t>(at)]);
  };
  if (o.attention == TrainAttention::Causal) {
    std::vector<int32_t> tokens = parts.flat();
    const auto n = static_cast<int64_t>(tokens.size());
    out.answer_begin = n - n_asked + first_answer;
    std::vector<bool> loss(tokens.size());
    for (int64_t i = 0; i < n; ++i) loss[i] = in_loss(i, n);
    s = causal_sequence(std::move(tokens), loss);
    return out;
  }
  // The tasks and answers continue the task segment, which sees the whole
  // context.
  const DepPrompt p = parts.dep_prompt(o.tree_context);
  s.tokens = p.tokens();
  s.positions = p.positions(o.scheme);
  if (o.max_position_gap > 0)
    add_position_gaps(p, s.positions, o.max_position_gap, hash_string(group.front().id, o.position_gap_seed));
  const auto n = static_cast<int64_t>(s.tokens.size());
  out.answer_begin = n - n_asked + first_answer;
  std::vector<int64_t> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = i;
  s.visibility = dependency_dag(p, rows);
  // A token predicts the next one only where that token hangs under it: the
  // first token of a tree or segment has no single predecessor to learn from.
  s.targets.assign(n, -1);
  for (int64_t i = 0; i + 1 < n; ++i)
    if (p.parents()[i + 1] == i && in_loss(i + 1, n)) s.targets[i] = s.tokens[i + 1];
  return out;
}

}  // namespace depcache

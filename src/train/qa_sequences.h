#pragma once
// Training sequences from QA requests: the prompt exactly as the engine
// builds it for serving (make_prompt_parts: system, context items, task),
// followed by the answer and EOS. Under causal attention the prompt is the
// flat serialization at positions 0..n-1; under dependency attention it is
// the DepPrompt (one tree per context item) with the chosen position scheme
// and the engine's visibility, the answer continuing the task segment.
#include <span>
#include <string>
#include <vector>

#include "model/rag_wrapper.h"
#include "model/tokenizer.h"
#include "prompt/dep_prompt.h"
#include "retrieval/rag_request.h"
#include "train/train_graph.h"

namespace depcache {

enum class TrainAttention { Causal, Dependency };

struct QaSequenceOptions {
  TrainAttention attention = TrainAttention::Causal;
  PositionScheme scheme = PositionScheme::Sequential;  // dependency attention only
  TreeContext tree_context = TreeContext::System;      // dependency attention only
  // Dependency attention only: each tree, and everything after it, moved by
  // a further 0..max_position_gap positions (uniform, cumulative), so that a
  // tree is trained at distances from the system text that vary as they do
  // when its cached KV is reused at another offset. The draws come from a
  // stream seeded by position_gap_seed and the first request's id.
  int32_t max_position_gap = 0;
  uint64_t position_gap_seed = 0;
  // Language-model loss on the context and question too (a small model
  // learns to read its context only so), or on the answer alone.
  bool loss_on_prompt = true;
  RagWrapper prompt;  // the model's (ModelConfig::prompt)
};

struct QaSequence {
  TrainSequence sequence;
  int64_t answer_begin = 0;  // index of the answer's first token
  int64_t answer_size = 0;   // answer tokens, EOS included
};

// The request's first answer is the one trained on; a request without an
// answer is an InvalidInput error.
QaSequence qa_sequence(const Tokenizer& tok, const RagRequest& request, const QaSequenceOptions& options);
// Requests over one context (same_context) as one sequence: the context once,
// then each request's task and answer in turn, every answer in the loss (a
// denser signal than one answer per context). answer_begin and answer_size
// are the first request's. A request with another context is InvalidInput.
QaSequence qa_sequence(const Tokenizer& tok, std::span<const RagRequest> group,
                       const QaSequenceOptions& options);

// Moves each tree segment of p, and every segment after it, by a further
// 0..max_gap positions drawn from the stream `seed` (QaSequenceOptions::
// max_position_gap). A tree's own relative positions, and so its rotated
// keys, are unchanged; its distance from the segments before it grows.
void add_position_gaps(const DepPrompt& p, std::vector<int32_t>& positions, int32_t max_gap, uint64_t seed);

// The text the model is trained to produce after the task: the answer as the
// prompt's next word, then a newline. It is encoded on its own, so a
// tokenizer that prefixes a space (space_prefixed) supplies the word's space
// itself; writing one too would train a lone space token before every answer.
std::string answer_text(const std::string& answer, bool space_prefixed);
// answer_text's tokens for this tokenizer, then EOS (when it has one).
std::vector<int32_t> answer_tokens(const Tokenizer& tok, const std::string& answer);

}  // namespace depcache

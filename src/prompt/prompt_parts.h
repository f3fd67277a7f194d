#pragma once
// A RAG request as token-level prompt parts: the system text (with BOS), the
// retrieved context items (an entity's relation paths, or a document), an
// optional plain context text, and the task (question and answer cue). Every
// strategy builds its prompt from the same parts, so they all see the same
// tokens: a flat serialization (system, every path of every item in order,
// text, task) or a DepPrompt (one tree per item).
#include <string>
#include <utility>
#include <vector>

#include "model/rag_wrapper.h"
#include "model/tokenizer.h"
#include "prompt/dep_prompt.h"
#include "retrieval/rag_request.h"

namespace depcache {

struct ContextItem {
  std::string label;                        // entity name or document id
  std::vector<std::vector<int32_t>> paths;  // token runs; a document has one
};

struct PromptParts {
  std::vector<int32_t> system;
  std::vector<ContextItem> items;
  std::vector<int32_t> text;  // plain context (requests with "text")
  std::vector<int32_t> task;
  // Whose cache the request may reuse and fill (scoped_namespace): 0 is the
  // shared scope; a server gives each tenant its own.
  uint64_t cache_scope = 0;

  int64_t n_flat_tokens() const;
  std::vector<int32_t> flat() const;
  // Rows [begin, end) of each context item in flat(), in order.
  std::vector<std::pair<int64_t, int64_t>> flat_item_ranges() const;
  DepPrompt dep_prompt(TreeContext tree_context = TreeContext::System) const;
};

// The same parts as text, each string exactly what is encoded on its own
// (with the tokenizer's space prefix): what a vocabulary is learned from.
struct PromptTexts {
  struct Item {
    std::string label;
    std::vector<std::string> pieces;  // one per path, or the document's body
  };
  std::string system;  // BOS goes before its tokens
  std::vector<Item> items;
  std::string text;  // empty: none
  std::string task;
};
PromptTexts prompt_texts(const RagRequest& request, const RagWrapper& tmpl = RagWrapper{});

PromptParts make_prompt_parts(const Tokenizer& tok, const RagRequest& request,
                              const RagWrapper& tmpl = RagWrapper{});
// The task's tokens alone, as make_prompt_parts encodes them (without
// encoding the context).
std::vector<int32_t> task_tokens(const Tokenizer& tok, const RagRequest& request,
                                 const RagWrapper& tmpl = RagWrapper{});

}  // namespace depcache

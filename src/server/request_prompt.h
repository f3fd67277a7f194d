#pragma once
// An API request as the engine's prompt parts. A plain completion is its
// prompt; a chat is its messages in the model's chat format. With the RAG
// extension the context (given, or retrieved here from the server's corpus
// or knowledge graph) becomes context items that the reuse strategies can
// find again in later requests: for a chat, inside the last user turn,
// between the chat format's opening and the question.
#include <optional>

#include "model/tokenizer.h"
#include "prompt/chat_template.h"
#include "prompt/prompt_parts.h"
#include "retrieval/corpus.h"
#include "retrieval/retriever.h"
#include "server/openai.h"

namespace depcache {

// What the server can draw a request's prompt from.
struct PromptSources {
  const Tokenizer* tokenizer = nullptr;
  std::optional<ChatFormat> chat;         // nullopt: chat requests are refused
  const ChunkIndex* corpus = nullptr;     // --corpus
  const GraphRetriever* graph = nullptr;  // --kg
  PromptTemplate prompt;                  // the model's, around a RAG context and question
  // Special-token strings in a client's text (prompt, messages) become those
  // tokens; off, they are plain text and only the chat format's own markers
  // are control tokens (serve --allow-special-tokens: trusted callers only).
  bool special_in_text = false;
};

// The corpus search a request asks the server for, or nullopt when it asks
// for none (or for the knowledge graph). Throws the same ApiError (400) as
// request_prompt for a source the server has not loaded.
struct CorpusSearch {
  std::string question;
  size_t top_k = 5;
};
std::optional<CorpusSearch> corpus_search(const CompletionRequest& r, const PromptSources& sources);

// A RAG request's context: given with it, or retrieved here from the
// server's corpus or graph (a question naming no entity of the graph gets
// none). ApiError (400) for a source the server has not loaded.
RagRequest request_context(const CompletionRequest& r, const PromptSources& sources);

// Throws ApiError (400) for a chat without a template, a retrieval from a
// source the server has not loaded, or a conversation the format rejects.
// `context`: the request's context when the caller has it already (a corpus
// search run in stages, a SubGCache cluster's subgraph); otherwise
// request_context's.
PromptParts request_prompt(const CompletionRequest& r, const PromptSources& sources,
                           const RagRequest* context = nullptr);

}  // namespace depcache

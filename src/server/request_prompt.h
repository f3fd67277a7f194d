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
#include "retrieval/corpus.h"
#include "retrieval/retriever.h"
#include "server/openai.h"
#include "strategy/prompt_parts.h"

namespace depcache {

// What the server can draw a request's prompt from.
struct PromptSources {
  const Tokenizer* tokenizer = nullptr;
  std::optional<ChatFamily> chat;         // nullopt: chat requests are refused
  const ChunkIndex* corpus = nullptr;     // --corpus
  const GraphRetriever* graph = nullptr;  // --kg
};

// Throws ApiError (400) for a chat without a template, a retrieval from a
// source the server has not loaded, or a conversation the format rejects.
PromptParts request_prompt(const CompletionRequest& r, const PromptSources& sources);

}  // namespace depcache

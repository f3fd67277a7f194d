#pragma once
// A client's request as the engine's prompt parts, whichever API it came by.
// A plain completion is its prompt; a chat is its messages in the model's
// chat format. With the RAG extension the context (given, or retrieved here
// from the server's corpus or knowledge graph) becomes context items that
// the reuse strategies can find again in later requests: for a chat, inside
// the last user turn, between the chat format's opening and the question.
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "model/tokenizer.h"
#include "prompt/chat_template.h"
#include "prompt/prompt_parts.h"
#include "retrieval/corpus.h"
#include "retrieval/rag_request.h"
#include "retrieval/retriever.h"
#include "util/error.h"

namespace depcache {

// Context a request asks the server to retrieve (the API's "rag.retrieve").
struct RetrieveSpec {
  std::string from;          // "corpus" or "kg"; empty: whichever the server loaded
  size_t top_k = 0;          // chunks, or paths per entity (0: 5 chunks, 30 paths)
  size_t max_entities = 10;  // entities linked from the question
  int hops = 2;              // longest relation path
};

// What a request says about its prompt (views into the parsed request).
struct PromptRequest {
  bool chat = false;
  std::string_view prompt;                // a completion's
  std::span<const ChatMessage> messages;  // a chat's
  // With the RAG extension: the context given with the request (its
  // question filled in); null for a plain request.
  const RagRequest* context = nullptr;
  const RetrieveSpec* retrieve = nullptr;  // context to retrieve here instead
  uint64_t cache_scope = 0;                // PromptParts::cache_scope
};

// A request whose prompt cannot be made: the parameter at fault (an API's
// field name, e.g. "rag.retrieve") and why. A front end answers it as the
// client's error (HTTP 400).
class PromptError : public Error {
 public:
  PromptError(std::string param, const std::string& what)
      : Error(ErrorKind::InvalidInput, what), param_(std::move(param)) {}
  const std::string& param() const { return param_; }

 private:
  std::string param_;
};

// What the server can draw a request's prompt from.
struct PromptSources {
  const Tokenizer* tokenizer = nullptr;
  std::optional<ChatFormat> chat;         // nullopt: chat requests are refused
  const ChunkIndex* corpus = nullptr;     // --corpus
  const GraphRetriever* graph = nullptr;  // --kg
  RagWrapper prompt;                      // the model's, around a RAG context and question
  // Special-token strings in a client's text (prompt, messages) become those
  // tokens; off, they are plain text and only the chat format's own markers
  // are control tokens (serve --allow-special-tokens: trusted callers only).
  bool special_in_text = false;
};

// The corpus search a request asks the server for, or nullopt when it asks
// for none (or for the knowledge graph). Throws the same PromptError as
// request_prompt for a source the server has not loaded.
struct CorpusSearch {
  std::string question;
  size_t top_k = 5;
};
std::optional<CorpusSearch> corpus_search(const PromptRequest& r, const PromptSources& sources);

// A RAG request's context: given with it, or retrieved here from the
// server's corpus or graph (a question naming no entity of the graph gets
// none). PromptError for a source the server has not loaded.
RagRequest request_context(const PromptRequest& r, const PromptSources& sources);

// Throws PromptError for a chat without a template, a retrieval from a
// source the server has not loaded, or a conversation the format rejects.
// `context`: the request's context when the caller has it already (a corpus
// search run in stages, a SubGCache cluster's subgraph); otherwise
// request_context's.
PromptParts request_prompt(const PromptRequest& r, const PromptSources& sources,
                           const RagRequest* context = nullptr);

}  // namespace depcache

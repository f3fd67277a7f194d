#include "server/request_prompt.h"

#include "util/error.h"

namespace depcache {
namespace {

// Where the context goes in a rendered chat; no tokenizer has it as text.
constexpr std::string_view kContextMark =
    "\x01"
    "depcache-context"
    "\x01";

// Where a request retrieves from: "corpus" or "kg" (checked against what the
// server loaded), or "" when it retrieves nothing.
std::string retrieval_source(const CompletionRequest& r, const PromptSources& sources) {
  if (!r.rag || !r.rag->retrieve) return {};
  std::string from = r.rag->retrieve->from;
  if (from.empty()) {
    if (sources.corpus && sources.graph)
      throw bad_request("rag.retrieve.from", "the server has both a corpus and a graph: say which ('from')");
    from = sources.graph ? "kg" : "corpus";
  }
  if (from == "corpus" && !sources.corpus)
    throw bad_request("rag.retrieve", "this server has no corpus to retrieve from (start it with --corpus)");
  if (from != "corpus" && !sources.graph)
    throw bad_request("rag.retrieve", "this server has no knowledge graph (start it with --kg)");
  return from;
}

}  // namespace

RagRequest request_context(const CompletionRequest& r, const PromptSources& sources) {
  if (!r.rag) return {};
  RagRequest context = r.rag->context;
  const std::string from = retrieval_source(r, sources);
  if (from.empty()) return context;
  const RetrieveSpec& spec = *r.rag->retrieve;
  if (from == "corpus") {
    context.documents =
        retrieve_documents(*sources.corpus, context.question, corpus_search(r, sources)->top_k);
    return context;
  }
  GraphRetrieveOptions o;
  o.max_entities = spec.max_entities;
  o.top_k = spec.top_k ? spec.top_k : 30;
  o.limits.hops = spec.hops;
  try {
    context.entities = sources.graph->retrieve(context.question, o);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::NotFound) throw;
    // A question naming no entity of the graph is answered without context.
  }
  return context;
}

namespace {

std::string rendered_chat(const PromptSources& sources, std::span<const ChatMessage> messages) {
  if (!sources.chat)
    throw ApiError(400,
                   "this model has no chat template the server recognises; start the server with "
                   "--chat-template NAME, or use /v1/completions");
  const Vocab& v = sources.tokenizer->vocab();
  const auto special = [&](int32_t id) { return id >= 0 ? sources.tokenizer->token_to_piece(id, true) : ""; };
  try {
    return render_chat(*sources.chat, messages, special(v.bos), special(v.eos));
  } catch (const Error& e) {
    throw bad_request("messages", e.what());
  }
}

// BOS (when the vocab has one), then the text with control markers parsed.
std::vector<int32_t> opening_tokens(const Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> out;
  if (tok.bos() >= 0) out.push_back(tok.bos());
  const std::vector<int32_t> body = tok.encode(text, false, true);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

}  // namespace

std::optional<CorpusSearch> corpus_search(const CompletionRequest& r, const PromptSources& sources) {
  if (retrieval_source(r, sources) != "corpus") return std::nullopt;
  const size_t k = r.rag->retrieve->top_k;
  return CorpusSearch{r.rag->context.question, k ? k : 5};
}

PromptParts request_prompt(const CompletionRequest& r, const PromptSources& sources,
                           const RagRequest* given) {
  const Tokenizer& tok = *sources.tokenizer;
  const PromptTemplate& rag_template = sources.prompt;
  PromptParts parts;
  if (!r.rag) {
    const std::string text = r.kind == ApiKind::Chat ? rendered_chat(sources, r.messages) : r.prompt;
    parts.task = tok.encode(text, true, true);
    return parts;
  }
  const RagRequest context = given ? *given : request_context(r, sources);
  parts = make_prompt_parts(tok, context, rag_template);
  if (r.kind == ApiKind::Completion) return parts;
  // The chat format around the context: everything before the mark opens
  // the prompt (with the RAG instruction), the question and the rest of the
  // format close it.
  std::vector<ChatMessage> messages = r.messages;
  messages.back().content = std::string(kContextMark) + rag_template.task_prefix + context.question;
  const std::string chat = rendered_chat(sources, messages);
  const size_t mark = chat.find(kContextMark);
  parts.system = opening_tokens(tok, chat.substr(0, mark) + rag_template.system);
  parts.task = tok.encode(chat.substr(mark + kContextMark.size()), false, true);
  return parts;
}

}  // namespace depcache

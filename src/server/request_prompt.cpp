#include "server/request_prompt.h"

namespace depcache {
namespace {

// Where the context goes in a rendered chat; no tokenizer has it as text.
constexpr std::string_view kContextMark =
    "\x01"
    "depcache-context"
    "\x01";

// Where a request retrieves from: "corpus" or "kg" (checked against what the
// server loaded), or "" when it retrieves nothing.
std::string retrieval_source(const PromptRequest& r, const PromptSources& sources) {
  if (!r.context || !r.retrieve) return {};
  std::string from = r.retrieve->from;
  if (from.empty()) {
    if (sources.corpus && sources.graph)
      throw PromptError("rag.retrieve.from", "the server has both a corpus and a graph: say which ('from')");
    from = sources.graph ? "kg" : "corpus";
  }
  if (from == "corpus" && !sources.corpus)
    throw PromptError("rag.retrieve", "this server has no corpus to retrieve from (start it with --corpus)");
  if (from != "corpus" && !sources.graph)
    throw PromptError("rag.retrieve", "this server has no knowledge graph (start it with --kg)");
  return from;
}

}  // namespace

RagRequest request_context(const PromptRequest& r, const PromptSources& sources) {
  if (!r.context) return {};
  RagRequest context = *r.context;
  const std::string from = retrieval_source(r, sources);
  if (from.empty()) return context;
  const RetrieveSpec& spec = *r.retrieve;
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

using Ranges = std::vector<std::pair<size_t, size_t>>;

RenderedChat rendered_chat(const PromptSources& sources, std::span<const ChatMessage> messages) {
  if (!sources.chat)
    throw PromptError("messages",
                      "this model has no chat template; start the server with --chat-template NAME, or use "
                      "/v1/completions");
  const Vocab& v = sources.tokenizer->vocab();
  const auto special = [&](int32_t id) { return id >= 0 ? sources.tokenizer->token_to_piece(id, true) : ""; };
  try {
    return sources.chat->render(messages, special(v.bos), special(v.eos));
  } catch (const Error& e) {
    throw PromptError("messages", e.what());
  }
}

// The ranges of [begin, end) of a rendered text, relative to begin.
Ranges ranges_within(const Ranges& ranges, size_t begin, size_t end) {
  Ranges out;
  for (auto [b, e] : ranges) {
    b = std::max(b, begin);
    e = std::min(e, end);
    if (b < e) out.emplace_back(b - begin, e - begin);
  }
  return out;
}

// BOS (when the vocab has one), then the text with control markers parsed
// outside the client's text.
std::vector<int32_t> opening_tokens(const Tokenizer& tok, const std::string& text, const Ranges& plain) {
  std::vector<int32_t> out;
  if (tok.bos() >= 0) out.push_back(tok.bos());
  const std::vector<int32_t> body = tok.encode(text, false, true, plain);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

}  // namespace

std::optional<CorpusSearch> corpus_search(const PromptRequest& r, const PromptSources& sources) {
  if (retrieval_source(r, sources) != "corpus") return std::nullopt;
  const size_t k = r.retrieve->top_k;
  return CorpusSearch{r.context->question, k ? k : 5};
}

PromptParts request_prompt(const PromptRequest& r, const PromptSources& sources, const RagRequest* given) {
  const Tokenizer& tok = *sources.tokenizer;
  // Where special tokens are not parsed: the client's text, unless the
  // server lets trusted callers write them.
  const auto plain = [&](Ranges ranges) { return sources.special_in_text ? Ranges{} : ranges; };
  const RagWrapper& rag_template = sources.prompt;
  PromptParts parts;
  if (!r.context) {
    if (r.chat) {
      const RenderedChat chat = rendered_chat(sources, r.messages);
      parts.task = tok.encode(chat.text, true, true, plain(chat.text_ranges));
    } else {
      parts.task = tok.encode(r.prompt, true, sources.special_in_text);
    }
    parts.cache_scope = r.cache_scope;
    return parts;
  }
  const RagRequest context = given ? *given : request_context(r, sources);
  parts = make_prompt_parts(tok, context, rag_template);
  parts.cache_scope = r.cache_scope;
  if (!r.chat) return parts;
  // The chat format around the context: everything before the mark opens
  // the prompt (with the RAG instruction), the question and the rest of the
  // format close it.
  std::vector<ChatMessage> messages(r.messages.begin(), r.messages.end());
  messages.back().content = std::string(kContextMark) + rag_template.task_prefix + context.question;
  const RenderedChat chat = rendered_chat(sources, messages);
  // The mark is the last message's first bytes: the last text range that
  // begins with it (the question, and earlier messages, may hold the same
  // bytes).
  size_t mark = chat.text.rfind(kContextMark);
  for (auto [b, e] : chat.text_ranges)
    if (chat.text.compare(b, kContextMark.size(), kContextMark) == 0) mark = b;
  const size_t rest = mark + kContextMark.size();
  parts.system = opening_tokens(tok, chat.text.substr(0, mark) + rag_template.system,
                                plain(ranges_within(chat.text_ranges, 0, mark)));
  // The model's task prefix opens the last message's text: it is the
  // template's, not the client's.
  Ranges task_ranges = ranges_within(chat.text_ranges, rest, chat.text.size());
  if (!task_ranges.empty() && task_ranges.front().first == 0)
    task_ranges.front().first = std::min(rag_template.task_prefix.size(), task_ranges.front().second);
  parts.task = tok.encode(chat.text.substr(rest), false, true, plain(task_ranges));
  return parts;
}

}  // namespace depcache

#include "prompt/prompt_parts.h"

#include "prompt/graph_prompt.h"

namespace depcache {

int64_t PromptParts::n_flat_tokens() const {
  auto n = static_cast<int64_t>(system.size() + text.size() + task.size());
  for (const ContextItem& item : items)
    for (const auto& p : item.paths) n += static_cast<int64_t>(p.size());
  return n;
}

std::vector<int32_t> PromptParts::flat() const {
  std::vector<int32_t> out = system;
  for (const ContextItem& item : items)
    for (const auto& p : item.paths) out.insert(out.end(), p.begin(), p.end());
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), task.begin(), task.end());
  return out;
}

std::vector<std::pair<int64_t, int64_t>> PromptParts::flat_item_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  auto at = static_cast<int64_t>(system.size());
  for (const ContextItem& item : items) {
    const int64_t begin = at;
    for (const auto& p : item.paths) at += static_cast<int64_t>(p.size());
    out.emplace_back(begin, at);
  }
  return out;
}

DepPrompt PromptParts::dep_prompt(TreeContext tree_context) const {
  DepPrompt p;
  p.add_linear("system", system);
  for (const ContextItem& item : items) p.add_tree(item.label, item.paths, tree_context);
  if (!text.empty()) p.add_linear("text", text);
  p.add_linear("task", task);
  return p;
}

namespace {

std::string task_text(const RagRequest& request, const RagWrapper& tmpl) {
  return tmpl.task_prefix + request.question + tmpl.task_suffix;
}

// A task that encodes to nothing still ends the prompt with the suffix.
std::vector<int32_t> encode_task(const Tokenizer& tok, const std::string& task, const RagWrapper& tmpl) {
  std::vector<int32_t> tokens = tok.encode(task, false, false);
  return tokens.empty() ? tok.encode(tmpl.task_suffix, false, false) : tokens;
}

}  // namespace

PromptTexts prompt_texts(const RagRequest& request, const RagWrapper& tmpl) {
  PromptTexts t;
  t.system = tmpl.system;
  for (const RequestEntity& e : request.entities) {
    PromptTexts::Item item{e.name, {}};
    for (const std::string& path : e.paths) item.pieces.push_back(path_text_line(path));
    if (!item.pieces.empty()) t.items.push_back(std::move(item));
  }
  for (const RequestDocument& d : request.documents)
    t.items.push_back({d.id, {d.title.empty() ? d.text + "\n" : d.title + ": " + d.text + "\n"}});
  if (!request.text.empty()) t.text = request.text + "\n";
  t.task = task_text(request, tmpl);
  return t;
}

PromptParts make_prompt_parts(const Tokenizer& tok, const RagRequest& request, const RagWrapper& tmpl) {
  const PromptTexts t = prompt_texts(request, tmpl);
  const auto encode = [&tok](const std::string& s) { return tok.encode(s, false, false); };
  PromptParts parts;
  parts.system = system_tokens(tok, t.system, /*add_bos=*/true);
  for (const PromptTexts::Item& i : t.items) {
    ContextItem item{i.label, {}};
    for (const std::string& piece : i.pieces) {
      std::vector<int32_t> tokens = encode(piece);
      if (!tokens.empty()) item.paths.push_back(std::move(tokens));
    }
    if (!item.paths.empty()) parts.items.push_back(std::move(item));
  }
  if (!t.text.empty()) parts.text = encode(t.text);
  parts.task = encode_task(tok, t.task, tmpl);
  return parts;
}

std::vector<int32_t> task_tokens(const Tokenizer& tok, const RagRequest& request, const RagWrapper& tmpl) {
  return encode_task(tok, task_text(request, tmpl), tmpl);
}

}  // namespace depcache

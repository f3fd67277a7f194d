#include "strategy/prompt_parts.h"

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

DepPrompt PromptParts::dep_prompt() const {
  DepPrompt p;
  p.add_linear("system", system);
  for (const ContextItem& item : items) p.add_tree(item.label, item.paths);
  if (!text.empty()) p.add_linear("text", text);
  p.add_linear("task", task);
  return p;
}

PromptParts make_prompt_parts(const Tokenizer& tok, const RagRequest& request, const PromptTemplate& tmpl) {
  PromptParts parts;
  parts.system = system_tokens(tok, tmpl.system, /*add_bos=*/true);
  for (const RequestEntity& e : request.entities) {
    ContextItem item{e.name, {}};
    for (const std::string& path : e.paths) item.paths.push_back(path_tokens(tok, path));
    if (!item.paths.empty()) parts.items.push_back(std::move(item));
  }
  for (const RequestDocument& d : request.documents) {
    const std::string body = d.title.empty() ? d.text + "\n" : d.title + ": " + d.text + "\n";
    ContextItem item{d.id, {tok.encode(body, false, false)}};
    if (!item.paths[0].empty()) parts.items.push_back(std::move(item));
  }
  if (!request.text.empty()) parts.text = tok.encode(request.text + "\n", false, false);
  parts.task = tok.encode(tmpl.task_prefix + request.question + tmpl.task_suffix, false, false);
  if (parts.task.empty()) parts.task = tok.encode(tmpl.task_suffix, false, false);
  return parts;
}

}  // namespace depcache

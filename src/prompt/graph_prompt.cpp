#include "prompt/graph_prompt.h"

namespace depcache {

std::string path_text_line(const std::string& path) { return path + "\n"; }

std::vector<int32_t> path_tokens(const Tokenizer& tok, const std::string& path) {
  return tok.encode(path_text_line(path), /*add_bos=*/false, /*parse_special=*/false);
}

std::vector<int32_t> system_tokens(const Tokenizer& tok, const std::string& system, bool add_bos) {
  // BOS by hand: encode(add_bos) would also append EOS for vocabs that ask for it.
  std::vector<int32_t> out;
  if (add_bos && tok.bos() >= 0) out.push_back(tok.bos());
  const std::vector<int32_t> body = tok.encode(system, /*add_bos=*/false, /*parse_special=*/false);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

DepPrompt build_graph_prompt(const Tokenizer& tok, const GraphPromptText& text, bool add_bos) {
  DepPrompt prompt;
  prompt.add_linear("system", system_tokens(tok, text.system, add_bos));
  for (const EntityPathsText& e : text.entities) {
    std::vector<std::vector<int32_t>> paths;
    paths.reserve(e.paths.size());
    for (const std::string& p : e.paths) paths.push_back(path_tokens(tok, p));
    prompt.add_tree(e.name, paths);
  }
  prompt.add_linear("task", tok.encode(text.task, /*add_bos=*/false, /*parse_special=*/false));
  return prompt;
}

}  // namespace depcache

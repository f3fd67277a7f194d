#pragma once
// Turns serialized relation paths into a DepPrompt with a tokenizer: system
// segment (with BOS), one tree segment per entity, then the task segment.
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "prompt/dep_prompt.h"

namespace depcache {

struct EntityPathsText {
  std::string name;                // unique entity key, used as the segment label
  std::vector<std::string> paths;  // "Alice -like-> Titanic -type-> Tragedy"
};

struct GraphPromptText {
  std::string system;
  std::vector<EntityPathsText> entities;
  std::string task;  // the question and the answer cue
};

// Each path is tokenized on its own with a trailing newline, so the same path
// text always yields the same tokens whatever surrounds it (which is what
// lets its KV be reused across prompts).
DepPrompt build_graph_prompt(const Tokenizer& tok, const GraphPromptText& text, bool add_bos = true);

// The system segment: BOS (when asked and the vocab has one) + the text.
std::vector<int32_t> system_tokens(const Tokenizer& tok, const std::string& system, bool add_bos);

// One path as the line build_graph_prompt inserts, and its token ids.
std::string path_text_line(const std::string& path);
std::vector<int32_t> path_tokens(const Tokenizer& tok, const std::string& path);

}  // namespace depcache

#pragma once
// The text a RAG prompt puts around its context and question. A model carries
// its own (GGUF keys depcache.prompt.*), written by `model new` and kept by
// the trainer, so that training, `run` and `serve` build the same prompt for
// it; a model without the keys gets the defaults.
#include <string>
#include <utility>
#include <vector>

#include "model/gguf.h"

namespace depcache {

inline constexpr const char* kPromptKeyPrefix = "depcache.prompt.";
inline constexpr const char* kPromptSystemKey = "depcache.prompt.system";
inline constexpr const char* kPromptTaskPrefixKey = "depcache.prompt.task_prefix";
inline constexpr const char* kPromptTaskSuffixKey = "depcache.prompt.task_suffix";

struct RagWrapper {
  std::string system = "Answer the question using the knowledge below.\n";  // after BOS
  std::string task_prefix = "Question: ";                                   // before the question
  std::string task_suffix = "\nAnswer:";                                    // after it; the answer follows

  // Each key the file has replaces its default.
  static RagWrapper from_gguf(const GgufFile& f);
  // All three keys, for a model file.
  std::vector<std::pair<std::string, GgufValue>> metadata() const;

  bool operator==(const RagWrapper&) const = default;
};

}  // namespace depcache

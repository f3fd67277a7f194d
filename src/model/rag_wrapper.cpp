#include "model/rag_wrapper.h"

namespace depcache {

RagWrapper RagWrapper::from_gguf(const GgufFile& f) {
  RagWrapper t;
  for (auto [key, field] :
       {std::pair{kPromptSystemKey, &t.system}, std::pair{kPromptTaskPrefixKey, &t.task_prefix},
        std::pair{kPromptTaskSuffixKey, &t.task_suffix}})
    if (auto v = f.get_string_or(key)) *field = *v;
  return t;
}

std::vector<std::pair<std::string, GgufValue>> RagWrapper::metadata() const {
  return {{kPromptSystemKey, GgufValue::string(system)},
          {kPromptTaskPrefixKey, GgufValue::string(task_prefix)},
          {kPromptTaskSuffixKey, GgufValue::string(task_suffix)}};
}

}  // namespace depcache

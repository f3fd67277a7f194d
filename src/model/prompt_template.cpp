#include "model/prompt_template.h"

namespace depcache {

PromptTemplate PromptTemplate::from_gguf(const GgufFile& f) {
  PromptTemplate t;
  for (auto [key, field] :
       {std::pair{kPromptSystemKey, &t.system}, std::pair{kPromptTaskPrefixKey, &t.task_prefix},
        std::pair{kPromptTaskSuffixKey, &t.task_suffix}})
    if (auto v = f.get_string_or(key)) *field = *v;
  return t;
}

std::vector<std::pair<std::string, GgufValue>> PromptTemplate::metadata() const {
  return {{kPromptSystemKey, GgufValue::string(system)},
          {kPromptTaskPrefixKey, GgufValue::string(task_prefix)},
          {kPromptTaskSuffixKey, GgufValue::string(task_suffix)}};
}

}  // namespace depcache

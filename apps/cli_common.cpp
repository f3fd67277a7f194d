#include "cli_common.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/gguf.h"
#include "model/vocab.h"

namespace depcache::cli {

Tokenizer tokenizer_from(const std::string& gguf_path) {
  return Tokenizer(gguf_path.empty() ? Vocab::builtin_bytes() : Vocab::from_gguf(GgufFile::open(gguf_path)));
}

std::string tokenizer_name(const std::string& gguf_path) {
  return gguf_path.empty() ? "built-in bytes" : gguf_path;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const size_t i = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(values.size()))) - 1;
  return values[i];
}

}  // namespace depcache::cli

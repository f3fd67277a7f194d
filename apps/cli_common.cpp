#include "cli_common.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "model/gguf.h"
#include "model/vocab.h"
#include "util/error.h"

namespace depcache::cli {

Tokenizer tokenizer_from(const std::string& gguf_path) {
  return Tokenizer(gguf_path.empty() ? Vocab::builtin_bytes() : Vocab::from_gguf(GgufFile::open(gguf_path)));
}

std::string tokenizer_name(const std::string& gguf_path) {
  return gguf_path.empty() ? "built-in bytes" : gguf_path;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

DType parse_kv_type(const std::string& name) {
  if (name == "f16") return DType::F16;
  if (name == "f32") return DType::F32;
  fail(ErrorKind::InvalidInput, "KV cache type '{}' is not supported (f16, f32)", name);
}

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  return percentile_sorted(values, p);
}

}  // namespace depcache::cli

#pragma once
// Small pieces several subcommands share.
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace depcache::cli {

// The tokenizer of a GGUF file, or the built-in byte vocab when path is empty.
Tokenizer tokenizer_from(const std::string& gguf_path);
// "built-in bytes" or the path, for reports.
std::string tokenizer_name(const std::string& gguf_path);

// p-th percentile (0..100) of values, nearest rank; 0 for none.
double percentile(std::vector<double> values, double p);

}  // namespace depcache::cli

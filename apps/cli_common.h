#pragma once
// Small pieces several subcommands share.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compute/dtype.h"
#include "compute/kv_format.h"
#include "eval/stats.h"
#include "eval/stream.h"
#include "model/rag_wrapper.h"
#include "model/tokenizer.h"
#include "retrieval/bm25.h"
#include "strategy/strategy.h"
#include "strategy/subgcache.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace depcache::cli {

// An option check that runs the value's parser: its error is the message.
template <typename Parse>
std::function<std::string(const std::string&)> parses_with(Parse parse) {
  return [parse](const std::string& s) {
    try {
      parse(s);
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  };
}

// The options every command that has them spells the same way: -m/--model
// (the GGUF file read), -o/--output (also --out: the file or folder
// written), -t/--threads (compute threads, 0: one per core). Callers add
// ->required() or a default.
CLI::Option* add_model_option(CLI::App& cmd, std::string& path, const std::string& what = "GGUF model file");
CLI::Option* add_output_option(CLI::App& cmd, std::string& path, const std::string& what);
CLI::Option* add_threads_option(CLI::App& cmd, int& threads);

// The options of the chunk strategies (recompute ratio; Cache-Craft's
// alpha, variants per chunk and focus window), for run and serve.
void add_chunk_options(CLI::App* cmd, StrategyOptions& so);
// --stage-order's names (retrieve, serve) and back.
const std::map<std::string, StageOrder>& stage_orders();
const char* stage_order_name(StageOrder order);
// SubGCache's clustering: --clusters, --linkage, --subgraph-embedding.
void add_subgcache_options(CLI::App* cmd, SubgcacheOptions& o);
// A replayed request stream: its graph form, SubGCache's clustering and
// query batches, arrivals (--rate, --rate-scale, --seed) and --limit.
void add_stream_options(CLI::App* cmd, StreamOptions& o);

// --prompt-system, --prompt-task-prefix, --prompt-task-suffix: the parts of
// a RAG wrapper given on the command line; apply() puts them over a base.
struct RagWrapperOptions {
  std::optional<std::string> system, task_prefix, task_suffix;
  bool any() const { return system || task_prefix || task_suffix; }
  RagWrapper apply(RagWrapper base) const;
};
void add_rag_wrapper_options(CLI::App* cmd, RagWrapperOptions& o);
// The RAG wrapper a GGUF file carries (the defaults for an empty path).
RagWrapper rag_wrapper_from(const std::string& gguf_path);

// The tokenizer of a GGUF file, or the built-in byte vocab when path is empty.
Tokenizer tokenizer_from(const std::string& gguf_path);
// "built-in bytes" or the path, for reports.
std::string tokenizer_name(const std::string& gguf_path);

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_list(const std::string& s);

// --kv-type, its names checked by the parser.
void add_kv_type_option(CLI::App& cmd, std::string& kv_type);

// Opens a file for writing or fails with a message naming it.
std::ofstream open_output(const std::filesystem::path& path);

// Beside a Markdown report: writes the plot's data (.dat) and gnuplot script
// (.gp), and runs gnuplot to draw the PNG. `commands` are gnuplot commands
// after the output settings; '$DATA' in them stands for the data file.
// Without gnuplot installed, says so and draws nothing.
void plot_beside(const std::filesystem::path& report, const std::string& data, const std::string& commands);

}  // namespace depcache::cli

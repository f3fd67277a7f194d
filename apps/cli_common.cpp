#include "cli_common.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <vector>

#include "compute/kv_format.h"
#include "eval/plot.h"
#include "model/gguf.h"
#include "model/vocab.h"
#include "util/error.h"

namespace depcache::cli {

CLI::Option* add_model_option(CLI::App& cmd, std::string& path, const std::string& what) {
  return cmd.add_option("-m,--model", path, what);
}

CLI::Option* add_output_option(CLI::App& cmd, std::string& path, const std::string& what) {
  return cmd.add_option("-o,--output,--out", path, what);
}

CLI::Option* add_threads_option(CLI::App& cmd, int& threads) {
  return cmd.add_option("-t,--threads", threads, "Compute threads (default: one per core)")
      ->check(CLI::NonNegativeNumber);
}

RagWrapper RagWrapperOptions::apply(RagWrapper base) const {
  if (system) base.system = *system;
  if (task_prefix) base.task_prefix = *task_prefix;
  if (task_suffix) base.task_suffix = *task_suffix;
  return base;
}

void add_rag_wrapper_options(CLI::App* cmd, RagWrapperOptions& o) {
  const RagWrapper d;
  // Shown quoted with \n for a newline; pass one with bash's $'...'.
  const auto shown = [](std::string s) {
    for (size_t at = 0; (at = s.find('\n', at)) != std::string::npos; at += 2) s.replace(at, 1, "\\n");
    return "\"" + s + "\"";
  };
  cmd->add_option("--prompt-system", o.system,
                  "RAG prompt: the text after BOS, before the context (default " + shown(d.system) + ")");
  cmd->add_option("--prompt-task-prefix", o.task_prefix,
                  "RAG prompt: the text before the question (default " + shown(d.task_prefix) + ")");
  cmd->add_option("--prompt-task-suffix", o.task_suffix,
                  "RAG prompt: the text after the question, where the answer follows (default " +
                      shown(d.task_suffix) + ")");
}

RagWrapper rag_wrapper_from(const std::string& gguf_path) {
  return gguf_path.empty() ? RagWrapper{} : RagWrapper::from_gguf(GgufFile::open(gguf_path));
}

Tokenizer tokenizer_from(const std::string& gguf_path) {
  return Tokenizer(gguf_path.empty() ? Vocab::builtin_bytes() : Vocab::from_gguf(GgufFile::open(gguf_path)));
}

void add_chunk_options(CLI::App* cmd, StrategyOptions& so) {
  cmd->add_option("--recompute-ratio", so.recompute_ratio,
                  "cacheblend, fusionrag: fraction of the chunk tokens recomputed with attention to the "
                  "chunks before them")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--cachecraft-alpha", so.cachecraft_alpha,
                  "cachecraft: scale of the cache-fix overhead (fraction of a chunk recomputed = alpha x "
                  "CCI x (1 - beta'), at most 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--chunk-variants", so.chunk_variants,
                  "cachecraft: variants (computed after different chunks) kept per chunk")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--focus-window", so.focus_window,
                  "cachecraft: layers the question's focused chunks must stay the same before the other "
                  "chunks stop being fixed (0: fix them in every layer)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
}

const std::map<std::string, StageOrder>& stage_orders() {
  static const std::map<std::string, StageOrder> names{{"documents", StageOrder::Documents},
                                                       {"terms", StageOrder::Terms}};
  return names;
}

const char* stage_order_name(StageOrder order) { return order == StageOrder::Terms ? "terms" : "documents"; }

void add_subgcache_options(CLI::App* cmd, SubgcacheOptions& o) {
  cmd->add_option("--clusters", o.clusters, "subgcache: clusters per query batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--linkage", o.linkage,
                  "subgcache: ward, single, average, complete or centroid; default ward")
      ->transform(CLI::CheckedTransformer(std::map<std::string, Linkage>{{"ward", Linkage::Ward},
                                                                         {"single", Linkage::Single},
                                                                         {"average", Linkage::Average},
                                                                         {"complete", Linkage::Complete},
                                                                         {"centroid", Linkage::Centroid}}));
  cmd->add_option("--subgraph-embedding", o.embedding,
                  "subgcache: ids (a bag of node and edge ids) or text (hashed words of the subgraph's CSV); "
                  "default ids")
      ->transform(CLI::CheckedTransformer(std::map<std::string, SubgraphEmbedding>{
          {"ids", SubgraphEmbedding::Ids}, {"text", SubgraphEmbedding::Text}}));
}

void add_stream_options(CLI::App* cmd, StreamOptions& o) {
  cmd->add_option("--graph-format", o.graph_format,
                  "How requests with entities show their graph: paths (relation paths, one tree per entity; "
                  "subgcache then shows a cluster's union of relation paths), csv (the request's subgraph "
                  "as G-Retriever CSV, SubGCache's form), auto (csv when subgcache is in the run, else "
                  "paths)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "paths", "csv"}));
  add_subgcache_options(cmd, o.subgcache_options);
  cmd->add_option("--query-batch", o.subgcache_options.batch,
                  "subgcache: queries clustered together (consecutive in arrival order; a batch is served "
                  "once its last query has arrived)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--rate", o.rate,
                  "Poisson arrivals at this many requests/s instead of the file's arrival times")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--rate-scale", o.rate_scale, "Divide the file's arrival times by this (2: twice the load)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o.seed, "Seed of --rate's arrivals")->capture_default_str();
  cmd->add_option("--limit", o.limit, "Process at most this many requests (0: all)")->capture_default_str();
}

std::string tokenizer_name(const std::string& gguf_path) {
  return gguf_path.empty() ? "built-in bytes" : gguf_path;
}

std::ofstream open_output(const std::filesystem::path& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(ErrorKind::NotFound, "cannot write {} (does its directory exist?)", path.string());
  return out;
}

void plot_beside(const std::filesystem::path& report, const std::string& data, const std::string& commands) {
  depcache::plot_png(std::filesystem::path(report).replace_extension(".png"), data, commands);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void add_kv_type_option(CLI::App& cmd, std::string& kv_type) {
  cmd.add_option("--kv-type", kv_type,
                 "KV cache storage: f16, f32 or q8_0 (8-bit blocks: half the bytes of f16, approximate)")
      ->capture_default_str()
      ->check(CLI::IsMember(kv_type_names()));
}

}  // namespace depcache::cli

#pragma once
// The evaluation's sections (eval/eval_run.h runs them), one file per seed
// paper, and what they share: the options, the report, the speed model, the
// request streams and the runs of a strategy over them.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_args.h"
#include "eval/eval_report.h"
#include "eval/eval_run.h"
#include "eval/replay.h"
#include "kv/cost_table.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "retrieval/corpus.h"
#include "retrieval/knowledge_graph.h"
#include "retrieval/rag_request.h"
#include "retrieval/workload.h"
#include "strategy/subgcache.h"

namespace depcache::experiments {

// What every section shares: the options, the report, the speed model.
struct EvalContext {
  const EvalOptions& o;
  EvalReport& report;
  std::shared_ptr<const Model> speed;  // random weights: speed only
  std::string speed_path;
  size_t n(size_t quick, size_t full) const { return o.quick ? quick : full; }
  EngineArgs args() const {
    EngineArgs a;
    a.threads = o.threads;
    return a;
  }
};

// Progress on stderr, with the minutes since the first call.
void stage(const std::string& what);

// ---- Streams ----------------------------------------------------------------

// A world of made-up entities (names from a shared pool, as the QA models
// were trained on; the seeds 9001 and 9002 are held out of their training).
KnowledgeGraph world(uint64_t seed);

struct AskOptions {
  int question_hops = 1;
  int context_hops = 2;  // of each entity's relation paths
  QuestionForm form = QuestionForm::Cloze;
  bool documents = false;
  size_t requests = 50;   // each_once: QA items asked, once each
  size_t entities = 3;    // per request
  bool each_once = true;  // else Zipf over the items
  uint64_t seed = 1;
};
// Requests over the world's QA items: each entity's relation paths as context.
std::vector<RagRequest> ask(const KnowledgeGraph& kg, const AskOptions& a);

// A corpus in chunks of `chunk_tokens` (no overlap) for BM25 search.
ChunkIndex chunk_corpus(const std::filesystem::path& corpus, const Tokenizer& tok, size_t chunk_tokens);
// n questions drawn Zipf-skewed from a QA file, as a service sees popular ones again.
std::vector<QaItem> zipf_questions(const std::filesystem::path& questions, size_t n, uint64_t seed);
// Chunk RAG over a corpus: Zipf-drawn questions with their BM25 top-k chunks.
std::vector<RagRequest> corpus_stream(const std::filesystem::path& corpus,
                                      const std::filesystem::path& questions, const Tokenizer& tok, size_t n,
                                      size_t chunk_tokens, uint64_t seed);
// The requests with Poisson arrivals at `rate` per second.
std::vector<RagRequest> with_arrivals(std::vector<RagRequest> reqs, double rate, uint64_t seed);

struct DocStream {
  std::vector<RagRequest> requests;
  std::string what;
  // Another draw from the same stream, served first and unmeasured: the
  // caches start warm, as a service's do (empty unless asked for).
  std::vector<RagRequest> warmup;
};
// MuSiQue's BM25 top-2 streams when the data is there, else documents of a
// made-up world.
DocStream document_stream(const EvalContext& c, const Tokenizer& tok, size_t n, size_t chunk_tokens,
                          uint64_t seed = 7);
// The same tokenized as the speed model reads it, with another draw of it as
// warm-up.
DocStream warm_document_stream(const EvalContext& c, size_t n, size_t chunk_tokens);

// ---- Runs -------------------------------------------------------------------

// One strategy over `reqs` on `model`, as `run` replays it, the graph as
// relation paths or as CSV (`graph_format`); warmup: served first, one at a
// time, unmeasured; clusters: SubGCache's clustering (the queries served in
// cluster order).
StrategyRun serve(const std::string& strategy, const std::vector<RagRequest>& reqs,
                  const std::shared_ptr<const Model>& model, const EngineArgs& args, int max_tokens,
                  bool serial, const std::vector<FullAnswer>* full = nullptr,
                  SubgcacheOptions* clusters = nullptr, const std::vector<RagRequest>& warmup = {},
                  const std::string& graph_format = "paths");
// Full attention's answers to `reqs`, each request alone.
std::vector<FullAnswer> reference_answers(const std::vector<RagRequest>& reqs,
                                          const std::shared_ptr<const Model>& model, int max_tokens,
                                          int threads);

struct Summary {
  double p50 = 0, p99 = 0, mean = 0;
  double prompt = 0, computed = 0;  // tokens per request
  double exact = 0, f1 = 0, rouge = 0;
  double per_s = 0;  // requests served per second of the run's wall time
};
Summary summarize(const StrategyRun& run);

// A shipped QA model's file in `models_dir`; NotFound, naming it, if missing.
std::filesystem::path shipped_model_path(const std::string& models_dir, const std::string& name);
std::shared_ptr<const Model> load_shipped(const EvalContext& c, const std::string& name);

// What every line plot of the report starts with.
inline constexpr const char* kLinePlot = "set key outside right; set grid; ";

// A table row and the same figures as a line of a plot's data: the row
// starts with `labels`, the line with `key`; each figure adds its cell to the
// row and its value to the line.
class FigureRow {
 public:
  FigureRow(std::vector<std::string> labels, std::string key)
      : cells_(std::move(labels)), line_(std::move(key)) {}
  void add(std::string cell, double figure);
  // The row appended to `rows`, the line (ended) to `dat`.
  void append_to(std::vector<std::vector<std::string>>& rows, std::string& dat) &&;

 private:
  std::vector<std::string> cells_;
  std::string line_;
};

// PGDSF's prefill cost table, profiled up to 2048 tokens on `model` by an
// engine of `eo` without a cache.
PrefillCostTable prefill_cost_table(const std::shared_ptr<const Model>& model, EngineOptions eo);
// The same on the speed model, with a pool of 2048 rows.
PrefillCostTable speed_cost_table(const EvalContext& c);

// ---- The sections, one file per seed paper ------------------------------------

void depcache_length(EvalContext& c);    // TTFT and throughput against prompt length
void depcache_policies(EvalContext& c);  // replacement policies
void depcache_accuracy(EvalContext& c);  // answers under reuse
void ragcache_policies(EvalContext& c);  // document hit rate by policy and capacity
void ragcache_ttft(EvalContext& c);
void ragcache_speculation(EvalContext& c);
void subgcache(EvalContext& c);
void chunk_quality(EvalContext& c);  // CacheBlend, FusionRAG, Cache-Craft
void throughput(EvalContext& c);     // within an SLO (RAGCache, Cache-Craft)
void engine_table(EvalContext& c);   // prompt and generation speed by weight type

}  // namespace depcache::experiments

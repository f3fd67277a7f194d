// What the evaluation's sections share: streams of requests, runs of a
// strategy over them, their summary, the shipped QA models.
#include "eval/experiments.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "eval/stats.h"
#include "eval/strategy_run.h"
#include "eval/stream.h"
#include "model/vocab.h"
#include "retrieval/synthetic_kg.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache::experiments {

namespace fs = std::filesystem;

void stage(const std::string& what) {
  static const auto t0 = Clock::now();
  const int s = static_cast<int>(seconds_since(t0));
  fmt::print(stderr, "[{:2d}:{:02d}] {}\n", s / 60, s % 60, what);
}

// ---- Streams ----------------------------------------------------------------

// A world of made-up entities (names from a shared pool, as the QA models
// were trained on; the seeds 9001 and 9002 are held out of their training).
KnowledgeGraph world(uint64_t seed) {
  SyntheticKgOptions k;
  k.n_entities = 300;
  k.n_relations = 12;
  k.facts_per_entity = 3;
  k.name_pool = 1000;
  k.seed = seed;
  return make_synthetic_kg(k);
}

std::vector<RagRequest> ask(const KnowledgeGraph& kg, const AskOptions& a) {
  GraphQaOptions q;
  q.n_items = a.each_once ? a.requests : 300;
  q.paths_per_entity = 9;
  q.min_paths = 1;
  q.hops = a.context_hops;
  q.question_hops = a.question_hops;
  q.seed = a.seed;
  GraphWorkloadOptions w;
  w.n_requests = a.requests;
  w.entities_per_request = a.entities;
  w.documents = a.documents;
  w.question_form = a.form;
  w.each_once = a.each_once;
  w.access.pattern = AccessPattern::Zipf;
  w.seed = a.seed;
  return make_graph_workload(kg, make_graph_qa(kg, q), w);
}

// A corpus in chunks of `chunk_tokens` (no overlap) for BM25 search.
ChunkIndex chunk_corpus(const fs::path& corpus, const Tokenizer& tok, size_t chunk_tokens) {
  ChunkOptions chunking;
  chunking.chunk_tokens = chunk_tokens;
  chunking.overlap = 0;
  return ChunkIndex::build(load_corpus(corpus), tok, chunking);
}

// n questions drawn Zipf-skewed from a QA file, as a service sees popular ones again.
std::vector<QaItem> zipf_questions(const fs::path& questions, size_t n, uint64_t seed) {
  const std::vector<QaItem> qa = load_qa(questions);
  if (qa.empty()) fail(ErrorKind::InvalidInput, "{}: no questions", questions.string());
  AccessSampler sampler(qa.size(), AccessOptions{}, seed);
  std::vector<QaItem> out;
  for (size_t i = 0; i < n; ++i) out.push_back(qa[sampler.next()]);
  return out;
}

// Chunk RAG over a corpus: Zipf-drawn questions with their BM25 top-k chunks.
std::vector<RagRequest> corpus_stream(const fs::path& corpus, const fs::path& questions, const Tokenizer& tok,
                                      size_t n, size_t chunk_tokens, uint64_t seed) {
  const ChunkIndex index = chunk_corpus(corpus, tok, chunk_tokens);
  std::vector<RagRequest> out;
  for (const QaItem& q : zipf_questions(questions, n, seed)) {
    RagRequest r;
    r.id = std::to_string(out.size());
    r.question = q.question;
    r.answers = q.answers;
    for (const ChunkHit& hit : index.search(q.question, 2))
      r.documents.push_back(index.request_document(hit.chunk));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<RagRequest> with_arrivals(std::vector<RagRequest> reqs, double rate, uint64_t seed) {
  const std::vector<double> at = poisson_arrivals(reqs.size(), rate, seed);
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].arrival_s = at[i];
  return reqs;
}

// ---- Runs -------------------------------------------------------------------

// One strategy over `reqs` on `model`, as `run` replays it, the graph as
// relation paths or as CSV (`graph_format`); warmup: served first, one at a
// time, unmeasured.
StrategyRun serve(const std::string& strategy, const std::vector<RagRequest>& reqs,
                  const std::shared_ptr<const Model>& model, const EngineArgs& args, int max_tokens,
                  bool serial, const std::vector<FullAnswer>* full, SubgcacheOptions* clusters,
                  const std::vector<RagRequest>& warmup, const std::string& graph_format) {
  const Tokenizer tok(Vocab::from_gguf(model->file()));
  StreamOptions so;
  so.graph_format = graph_format;
  so.subgcache = clusters != nullptr;
  if (clusters) so.subgcache_options = *clusters;
  const Stream s = prepare_stream(reqs, warmup, so, tok, model->config().prompt, max_tokens);
  const int64_t n_ctx = pool_rows(s, 0, max_tokens);
  ReplayOptions ro;
  ro.max_tokens = max_tokens;
  ro.serial = serial;
  const bool dependency = strategy == "depcache";
  StrategyRun run = clusters ? run_clustered(s, model, args, ro, *clusters, n_ctx, dependency, full)
                             : run_strategy(strategy, s.requests, s.parts, model, args, ro, n_ctx, dependency,
                                            full, &s.warmup_parts);
  score_answers(run, reqs, tok);
  return run;
}

std::vector<FullAnswer> reference_answers(const std::vector<RagRequest>& reqs,
                                          const std::shared_ptr<const Model>& model, int max_tokens,
                                          int threads) {
  const Tokenizer tok(Vocab::from_gguf(model->file()));
  StreamOptions so;
  so.graph_format = "paths";
  const Stream s = prepare_stream(reqs, {}, so, tok, model->config().prompt, max_tokens);
  EngineOptions alone;
  alone.pool_rows = s.largest_rows;
  alone.threads = threads;
  return full_answers(model, alone, s.parts, max_tokens);
}

Summary summarize(const StrategyRun& run) {
  Summary s;
  const std::vector<double> t = ttfts(run);
  s.p50 = percentile(t, 50);
  s.p99 = percentile(t, 99);
  s.mean = mean(t);
  size_t scored = 0, judged = 0;
  for (const RequestRow& r : run.rows) {
    s.prompt += static_cast<double>(r.report.prompt_tokens);
    s.computed += static_cast<double>(r.report.computed_tokens);
    if (r.answer) {
      ++judged;
      s.exact += r.exact_match ? 1 : 0;
      s.f1 += r.f1;
    }
    if (r.fidelity) {
      ++scored;
      s.rouge += r.fidelity->rouge_l;
    }
  }
  const double n = static_cast<double>(std::max<size_t>(run.rows.size(), 1));
  s.prompt /= n;
  s.computed /= n;
  s.exact = judged ? 100.0 * s.exact / static_cast<double>(judged) : 0;
  s.f1 = judged ? s.f1 / static_cast<double>(judged) : 0;
  s.rouge = scored ? s.rouge / static_cast<double>(scored) : 0;
  s.per_s = run.wall_s > 0 ? static_cast<double>(run.rows.size()) / run.wall_s : 0;
  return s;
}

void FigureRow::add(std::string cell, double figure) {
  cells_.push_back(std::move(cell));
  line_ += fmt::format(" {:.2f}", figure);
}

void FigureRow::append_to(std::vector<std::vector<std::string>>& rows, std::string& dat) && {
  rows.push_back(std::move(cells_));
  dat += line_ + "\n";
}

PrefillCostTable prefill_cost_table(const std::shared_ptr<const Model>& model, EngineOptions eo) {
  eo.cache_bytes = 0;
  return Engine(model, eo).profile_prefill_cost(2048);
}

PrefillCostTable speed_cost_table(const EvalContext& c) {
  EngineOptions eo;
  eo.pool_rows = 2048;
  eo.threads = c.o.threads;
  return prefill_cost_table(c.speed, eo);
}

// A shipped QA model's file in `models_dir`; NotFound, naming it, if missing.
fs::path shipped_model_path(const std::string& models_dir, const std::string& name) {
  const fs::path p = fs::path(models_dir) / name;
  if (!fs::exists(p))
    fail(ErrorKind::NotFound, "{}: the shipped QA model is missing (--models names their directory)",
         p.string());
  return p;
}

std::shared_ptr<const Model> load_shipped(const EvalContext& c, const std::string& name) {
  return Model::load(shipped_model_path(c.o.models_dir, name));
}

// MuSiQue's BM25 top-2 streams when the data is there, else documents of a
// made-up world.
DocStream document_stream(const EvalContext& c, const Tokenizer& tok, size_t n, size_t chunk_tokens,
                          uint64_t seed) {
  const fs::path d = fs::path(c.o.data_dir) / "musique";
  if (fs::exists(d / "musique_train_corpus.json"))
    return {
        corpus_stream(d / "musique_train_corpus.json", d / "musique_train.json", tok, n, chunk_tokens, seed),
        fmt::format("MuSiQue (Zipf over its questions, BM25 top-2 chunks of {} tokens)", chunk_tokens),
        {}};
  AskOptions a;
  a.documents = true;
  a.each_once = false;
  a.requests = n;
  a.entities = 4;
  a.seed = seed;
  return {ask(world(21), a), "documents of a made-up world (MuSiQue not found under --data)", {}};
}

DocStream warm_document_stream(const EvalContext& c, size_t n, size_t chunk_tokens) {
  const Tokenizer tok(Vocab::from_gguf(c.speed->file()));
  DocStream s = document_stream(c, tok, n, chunk_tokens);
  s.warmup = document_stream(c, tok, n, chunk_tokens, 8).requests;
  return s;
}

}  // namespace depcache::experiments

// `depcache retrieve`: BM25 over token chunks of a corpus, for one question or
// a whole QA set (latency percentiles and supporting-title recall@k), so the
// retrieval stage can be checked on real data before any model is involved.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "retrieval/corpus.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache::cli {
namespace {

using Json = nlohmann::ordered_json;
// At most max_bytes of s on one line, cut at a character boundary.
std::string preview(const std::string& s, size_t max_bytes = 100) {
  size_t n = std::min(s.size(), max_bytes);
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  std::string out = s.substr(0, n);
  std::replace_if(
      out.begin(), out.end(), [](char c) { return c == '\n' || c == '\r' || c == '\t'; }, ' ');
  if (n < s.size()) out += "...";
  return out;
}

Json hits_json(const ChunkIndex& index, const std::vector<ChunkHit>& hits) {
  Json out = Json::array();
  for (size_t r = 0; r < hits.size(); ++r) {
    const Chunk& c = index.chunk(hits[r].chunk);
    const Document& d = index.doc_of(hits[r].chunk);
    out.push_back({{"rank", r + 1},
                   {"score", hits[r].score},
                   {"chunk", hits[r].chunk},
                   {"doc", c.doc},
                   {"doc_id", d.id},
                   {"title", d.title},
                   {"index_in_doc", c.index_in_doc},
                   {"text", c.text}});
  }
  return out;
}

void print_hits(const ChunkIndex& index, const std::vector<ChunkHit>& hits) {
  if (hits.empty()) fmt::print("  (no chunk shares a term with the question)\n");
  for (size_t r = 0; r < hits.size(); ++r) {
    const Chunk& c = index.chunk(hits[r].chunk);
    fmt::print("  {:>2}. {:8.4f}  {} [chunk {}]  {}\n", r + 1, hits[r].score,
               index.doc_of(hits[r].chunk).title, c.index_in_doc, preview(c.text));
  }
}

struct Options {
  std::string corpus_path, format = "auto", question, qa_path, vocab_path;
  size_t limit = 0, top_k = 5, staged = 0;
  StageOrder stage_order = StageOrder::Documents;
  ChunkOptions chunking;
  bool json = false;
};

// Runs one question; stages are printed (or collected) when --staged is given.
// `settled`: with --staged, the first stage from which the top-k is the final
// one (1-based; what a speculative prefill started then would keep).
std::vector<ChunkHit> run_query(const ChunkIndex& index, const Options& o, const std::string& question,
                                bool show_stages, Json* stages_json, double& ms, size_t& settled,
                                size_t& n_stages) {
  std::vector<SearchStage> stages;
  settled = n_stages = 0;
  const Clock::time_point t0 = Clock::now();
  std::vector<ChunkHit> hits;
  if (o.staged > 0) {
    hits = index.search_staged(
        question, o.top_k, o.staged,
        [&](const SearchStage& s) {
          stages.push_back(s);
          return true;
        },
        o.stage_order);
  } else {
    hits = index.search(question, o.top_k);
  }
  ms = ms_since(t0);
  if (!stages.empty()) {
    n_stages = stages.size();
    settled = n_stages;
    while (settled > 1) {
      const auto& before = stages[settled - 2].top;
      const bool same = std::equal(before.begin(), before.end(), hits.begin(), hits.end(),
                                   [](const ScoredDoc& d, const ChunkHit& h) { return d.doc == h.chunk; });
      if (!same) break;
      --settled;
    }
  }
  if (!show_stages && !stages_json) stages.clear();
  for (const SearchStage& s : stages) {
    std::vector<ChunkHit> top;
    for (const ScoredDoc& d : s.top) top.push_back({d.doc, d.score});
    if (stages_json) {
      stages_json->push_back({{"stage", s.stage + 1},
                              {"n_stages", s.n_stages},
                              {"n_scanned", s.n_scanned},
                              {"n_terms", s.n_terms},
                              {"top", hits_json(index, top)}});
    } else {
      if (o.stage_order == StageOrder::Terms)
        fmt::print("stage {}/{} ({} rarest query terms applied):\n", s.stage + 1, s.n_stages, s.n_terms);
      else
        fmt::print("stage {}/{} ({} of {} chunks scanned):\n", s.stage + 1, s.n_stages, s.n_scanned,
                   index.chunks().size());
      print_hits(index, top);
    }
  }
  return hits;
}

// What a run over a batch of questions (--qa) adds up to.
struct BatchStats {
  std::vector<double> latencies;
  // With --staged: how early the top-k settles (stage / stages, summed) and
  // how many settle before the last stage.
  double settled_fraction_sum = 0;
  size_t n_settled_early = 0;
  double recall_sum = 0;
  size_t n_with_support = 0, n_titles = 0, n_found = 0, n_all_found = 0;

  // The question's supporting titles among the hits, added to the totals;
  // returns how many were found.
  size_t count_support(const ChunkIndex& index, const QaItem& item, const std::vector<ChunkHit>& hits) {
    size_t found = 0;
    for (const std::string& title : item.supporting_titles)
      found += std::any_of(hits.begin(), hits.end(),
                           [&](const ChunkHit& h) { return index.doc_of(h.chunk).title == title; });
    if (!item.supporting_titles.empty()) {
      ++n_with_support;
      n_titles += item.supporting_titles.size();
      n_found += found;
      n_all_found += found == item.supporting_titles.size();
      recall_sum += static_cast<double>(found) / static_cast<double>(item.supporting_titles.size());
    }
    return found;
  }
};

// One question searched, its result printed (or added to `out`'s queries).
void answer(const ChunkIndex& index, const Options& o, const QaItem& item, size_t qi, BatchStats& st,
            Json& out) {
  const bool batch = !o.qa_path.empty();
  Json stages = Json::array();
  double ms = 0;
  if (!batch && !o.json) fmt::print("\nquestion: {}\n", item.question);
  size_t settled = 0, n_stages = 0;
  const std::vector<ChunkHit> hits = run_query(index, o, item.question, !batch && o.staged > 0,
                                               o.json ? &stages : nullptr, ms, settled, n_stages);
  st.latencies.push_back(ms);
  if (n_stages > 0) {
    st.settled_fraction_sum += static_cast<double>(settled) / static_cast<double>(n_stages);
    st.n_settled_early += settled < n_stages;
  }
  const size_t found = st.count_support(index, item, hits);
  if (o.json) {
    Json q = {{"question", item.question}, {"search_ms", ms}, {"results", hits_json(index, hits)}};
    if (batch) {
      q["id"] = item.id;
      q["supporting_titles"] = item.supporting_titles;
      q["supporting_found"] = found;
    }
    if (!stages.empty()) {
      q["stages"] = std::move(stages);
      q["settled_stage"] = settled;
    }
    out["queries"].push_back(std::move(q));
  } else if (batch) {
    fmt::print("[{:>3}] found {}/{}  {:7.3f} ms  {}\n", qi + 1, found, item.supporting_titles.size(), ms,
               preview(item.question, 90));
  } else {
    if (o.staged > 0) fmt::print("final:\n");
    print_hits(index, hits);
    fmt::print("search: {:.3f} ms\n", ms);
  }
}

// A batch's latency, recall and (with --staged) settling, printed or as
// `out`'s summary.
void summarize(const Options& o, BatchStats& st, size_t n_questions, Json& out) {
  std::vector<double>& latencies = st.latencies;
  std::sort(latencies.begin(), latencies.end());
  double mean = 0;
  for (double l : latencies) mean += l;
  mean = latencies.empty() ? 0 : mean / static_cast<double>(latencies.size());
  // Macro average: each question counts once, however many titles support it.
  const double recall = st.n_with_support ? st.recall_sum / static_cast<double>(st.n_with_support) : 0.0;
  const double n = static_cast<double>(n_questions);
  if (o.json) {
    out["summary"] = {
        {"questions", n_questions},
        {"top_k", o.top_k},
        {"latency_ms",
         {{"p50", percentile(latencies, 50)}, {"p99", percentile(latencies, 99)}, {"mean", mean}}},
        {"recall_at_k", recall},
        {"titles_found", st.n_found},
        {"titles", st.n_titles},
        {"questions_all_found", st.n_all_found},
        {"questions_with_support", st.n_with_support}};
    if (o.staged > 0)
      out["summary"]["staged"] = {{"stages", o.staged},
                                  {"order", stage_order_name(o.stage_order)},
                                  {"settled_before_last", static_cast<double>(st.n_settled_early) / n},
                                  {"mean_settled_fraction", st.settled_fraction_sum / n}};
    return;
  }
  fmt::print("\nquestions: {}  top-k: {}\n", n_questions, o.top_k);
  fmt::print("latency: p50 {:.3f} ms  p99 {:.3f} ms  mean {:.3f} ms\n", percentile(latencies, 50),
             percentile(latencies, 99), mean);
  fmt::print(
      "recall@{} of supporting titles: {:.3f} (mean per question; {}/{} titles; all found for {}/{} "
      "questions)\n",
      o.top_k, recall, st.n_found, st.n_titles, st.n_all_found, st.n_with_support);
  if (o.staged > 0)
    fmt::print(
        "staged ({} stages by {}): the top-k is final before the last stage for {:.1f}% of questions; "
        "on average from {:.1f}% of the stages on\n",
        o.staged, stage_order_name(o.stage_order), 100.0 * static_cast<double>(st.n_settled_early) / n,
        100.0 * st.settled_fraction_sum / n);
}

// The questions: --qa's (at most --limit), or the one --question.
std::vector<QaItem> questions(const Options& o) {
  std::vector<QaItem> qa;
  if (!o.qa_path.empty()) {
    qa = load_qa(o.qa_path);
    if (o.limit > 0 && qa.size() > o.limit) qa.resize(o.limit);
  } else {
    qa.push_back({"", o.question, {}, {}});
  }
  return qa;
}

void run(const Options& o) {
  Clock::time_point t0 = Clock::now();
  const Tokenizer tok = tokenizer_from(o.vocab_path);
  CorpusFormat format = parse_corpus_format(o.format);
  if (format == CorpusFormat::Auto) format = detect_corpus_format(o.corpus_path);
  Corpus corpus = load_corpus(o.corpus_path, format);
  const double load_ms = ms_since(t0);
  const size_t n_docs = corpus.docs.size();
  // Read the questions before the slow part, so a bad QA file fails fast.
  const std::vector<QaItem> qa = questions(o);

  t0 = Clock::now();
  const ChunkIndex index = ChunkIndex::build(std::move(corpus), tok, o.chunking);
  const double build_ms = ms_since(t0);
  const std::string vocab_name = tokenizer_name(o.vocab_path);

  Json out;
  if (o.json) {
    out["corpus"] = {{"path", o.corpus_path},
                     {"format", corpus_format_name(format)},
                     {"docs", n_docs},
                     {"chunks", index.chunks().size()},
                     {"terms", index.bm25().n_terms()},
                     {"chunk_tokens", o.chunking.chunk_tokens},
                     {"overlap", o.chunking.overlap},
                     {"vocab", vocab_name},
                     {"load_ms", load_ms},
                     {"build_ms", build_ms}};
    out["queries"] = Json::array();
  } else {
    fmt::print("corpus: {} ({}): {} docs -> {} chunks of <= {} tokens (overlap {}), vocab: {}\n",
               o.corpus_path, corpus_format_name(format), n_docs, index.chunks().size(),
               o.chunking.chunk_tokens, o.chunking.overlap, vocab_name);
    fmt::print("index: {} terms, built in {:.1f} ms (tokenize + chunk + BM25); load {:.1f} ms\n",
               index.bm25().n_terms(), build_ms, load_ms);
  }
  BatchStats st;
  for (size_t qi = 0; qi < qa.size(); ++qi) answer(index, o, qa[qi], qi, st, out);
  if (!o.qa_path.empty()) summarize(o, st, qa.size(), out);
  if (o.json) fmt::print("{}\n", out.dump(2, ' ', false, Json::error_handler_t::replace));
}

}  // namespace

void add_retrieve_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("retrieve", "Rank corpus chunks for questions with BM25");
  static Options o;
  cmd->add_option("--corpus", o.corpus_path, "Corpus file: MuSiQue or HotpotQA corpus JSON, or JSONL")
      ->required();
  cmd->add_option("--format", o.format, "Corpus format")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "musique", "hotpotqa", "jsonl"}));
  CLI::Option_group* ask = cmd->add_option_group("question", "What to ask (exactly one)");
  ask->add_option("--question", o.question, "One question");
  CLI::Option* qa = ask->add_option("--questions", o.qa_path, "QA file (MuSiQue or HotpotQA) to evaluate");
  ask->require_option(1);
  cmd->add_option("--limit", o.limit, "Evaluate at most this many questions (0: all)")
      ->capture_default_str()
      ->needs(qa);
  cmd->add_option("--top-k", o.top_k, "Chunks to return per question")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--chunk-tokens", o.chunking.chunk_tokens, "Tokens per chunk")->capture_default_str();
  cmd->add_option("--overlap", o.chunking.overlap, "Tokens shared by consecutive chunks")
      ->capture_default_str();
  cmd->add_option("--vocab", o.vocab_path,
                  "GGUF file whose tokenizer cuts the chunks (default: built-in bytes)");
  cmd->add_option("--staged", o.staged, "Search in N stages and print each stage's top-k")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--stage-order", o.stage_order,
                  "How --staged splits the search: documents (doc-id ranges, like shards) or terms (the "
                  "rarest query terms first, over every chunk); default documents")
      ->transform(CLI::CheckedTransformer(stage_orders()));
  cmd->add_flag("--json", o.json, "Print one JSON object instead of text");
  cmd->callback([] { run(o); });
}

}  // namespace depcache::cli

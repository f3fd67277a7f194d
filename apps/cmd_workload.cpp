// `depcache workload generate|stats`: request streams for cache experiments
// (GraphRAG over a KG file, or chunk RAG over a corpus and its QA set) and the
// locality report that bounds what any cache could reuse in them.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_map>

#include "cli_common.h"
#include "commands.h"
#include "prompt/dep_prompt.h"
#include "prompt/graph_prompt.h"
#include "retrieval/corpus.h"
#include "retrieval/knowledge_graph.h"
#include "retrieval/rag_request.h"
#include "retrieval/workload.h"
#include "strategy/subgcache.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache::cli {
namespace {

struct GenerateOptions {
  std::string kg_path, corpus_path, corpus_format = "auto", qa_path, vocab_path, out_path;
  std::string pattern = "zipf";
  AccessOptions access;
  size_t n_requests = 100;
  double rate = 0;
  uint64_t seed = 1;
  // GraphRAG
  size_t questions_per_context = 1;
  size_t qa_items = 500, entities_per_request = 10, paths_per_entity = 30, min_paths = 10, max_fanout = 64;
  int hops = 2, question_hops = 0;
  std::string context = "paths";
  std::string question_form = "words";
  // chunk RAG
  size_t top_k = 5;
  ChunkOptions chunking;
  bool shuffle_chunks = false;
};

std::vector<RagRequest> generate_graph(const GenerateOptions& o) {
  if (o.question_form == "cloze" && o.context == "csv")
    fail(ErrorKind::InvalidInput,
         "--question-form cloze follows the notation of paths or documents; CSV text has none to follow");
  auto t0 = std::chrono::steady_clock::now();
  const KnowledgeGraph kg = KnowledgeGraph::load(o.kg_path);
  fmt::print("kg: {} entities, {} triples (loaded in {:.2f} s)\n", kg.n_entities(), kg.n_triples(),
             seconds_since(t0));
  t0 = std::chrono::steady_clock::now();
  GraphQaOptions qopt;
  qopt.n_items = o.qa_items;
  qopt.paths_per_entity = o.paths_per_entity;
  qopt.min_paths = o.min_paths;
  qopt.hops = o.hops;
  qopt.question_hops = o.question_hops;
  qopt.max_fanout = o.max_fanout;
  qopt.seed = o.seed;
  const std::vector<GraphQa> qa = make_graph_qa(kg, qopt);
  size_t n_paths = 0;
  for (const GraphQa& q : qa) n_paths += q.paths.size();
  fmt::print("qa items: {} entities, {:.1f} paths each on average ({:.2f} s)\n", qa.size(),
             static_cast<double>(n_paths) / static_cast<double>(qa.size()), seconds_since(t0));
  GraphWorkloadOptions wopt;
  wopt.n_requests = o.n_requests;
  wopt.entities_per_request = o.entities_per_request;
  wopt.questions_per_context = o.questions_per_context;
  wopt.documents = o.context == "documents";
  wopt.question_form = *parse_question_form(o.question_form);
  wopt.access = o.access;
  wopt.each_once = o.pattern == "dataset";
  if (!wopt.each_once) wopt.access.pattern = parse_access_pattern(o.pattern);
  wopt.rate = o.rate;
  wopt.seed = o.seed;
  std::vector<RagRequest> out = make_graph_workload(kg, qa, wopt);
  // G-Retriever's textual graph of the same paths, as SubGCache serves them
  // (so a QA model can be trained on that form too).
  if (o.context == "csv")
    for (RagRequest& r : out) r = with_subgraph_csv(r, request_subgraph(r));
  return out;
}

std::vector<RagRequest> generate_chunks(const GenerateOptions& o) {
  if (o.qa_path.empty())
    fail(ErrorKind::InvalidInput, "--corpus needs --questions (a QA file to draw questions from)");
  auto t0 = std::chrono::steady_clock::now();
  const Tokenizer tok = tokenizer_from(o.vocab_path);
  const ChunkIndex index =
      ChunkIndex::build(load_corpus(o.corpus_path, parse_corpus_format(o.corpus_format)), tok, o.chunking);
  const std::vector<QaItem> qa = load_qa(o.qa_path);
  if (qa.empty()) fail(ErrorKind::InvalidInput, "{}: no questions", o.qa_path);
  fmt::print("corpus: {} docs, {} chunks; {} questions ({:.2f} s)\n", index.corpus().docs.size(),
             index.chunks().size(), qa.size(), seconds_since(t0));
  // Retrieval is deterministic per question: do it once per QA item.
  std::vector<std::vector<RequestDocument>> retrieved(qa.size());
  for (size_t i = 0; i < qa.size(); ++i)
    for (const ChunkHit& hit : index.search(qa[i].question, o.top_k))
      retrieved[i].push_back(index.request_document(hit.chunk));
  std::vector<size_t> order;
  if (o.pattern == "dataset") {
    for (size_t i = 0; i < qa.size(); ++i) order.push_back(i);
  } else {
    AccessOptions access = o.access;
    access.pattern = parse_access_pattern(o.pattern);
    AccessSampler sampler(qa.size(), access, o.seed);
    for (size_t i = 0; i < o.n_requests; ++i) order.push_back(sampler.next());
  }
  const std::vector<double> arrivals = poisson_arrivals(order.size(), o.rate, o.seed ^ 0x9E3779B97F4A7C15ULL);
  std::vector<RagRequest> out;
  std::mt19937_64 rng(o.seed ^ 0x5EEDC0DEULL);
  for (size_t i = 0; i < order.size(); ++i) {
    const QaItem& q = qa[order[i]];
    RagRequest r;
    r.id = std::to_string(i);
    r.arrival_s = arrivals[i];
    r.question = q.question;
    r.answers = q.answers;
    r.documents = retrieved[order[i]];
    if (o.shuffle_chunks) std::shuffle(r.documents.begin(), r.documents.end(), rng);
    out.push_back(std::move(r));
  }
  return out;
}

// GraphRAG: the QA pool, the requests' entities and paths, how contexts and
// questions read.
void add_graph_workload_options(CLI::App* cmd, GenerateOptions& o) {
  cmd->add_option("--qa-items", o.qa_items, "GraphRAG: QA items (entities) in the pool")
      ->capture_default_str();
  cmd->add_option("--entities-per-request", o.entities_per_request,
                  "GraphRAG: entities (subgraphs) per request")
      ->capture_default_str();
  cmd->add_option("--questions-per-context", o.questions_per_context,
                  "GraphRAG: consecutive requests over each drawn context, asking about its entities in "
                  "turn, then about their other relations (fewer when none is left; for `train "
                  "--pack-shared-context`; not with --pattern dataset)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--paths-per-entity", o.paths_per_entity, "GraphRAG: relation paths per entity")
      ->capture_default_str();
  cmd->add_option("--min-paths", o.min_paths, "GraphRAG: skip entities with fewer paths")
      ->capture_default_str();
  cmd->add_option("--hops", o.hops, "GraphRAG: path length in hops")
      ->capture_default_str()
      ->check(CLI::Range(1, 8));
  cmd->add_option(
         "--question-hops", o.question_hops,
         "GraphRAG: hops each question asks about (0: --hops); shorter ones ask for a path's first steps")
      ->capture_default_str()
      ->check(CLI::Range(0, 8));
  cmd->add_option("--context", o.context,
                  "GraphRAG: each entity as its relation paths (a DepPrompt tree), as a document of fact "
                  "sentences, or the request's subgraph as G-Retriever CSV text (csv: what SubGCache serves)")
      ->capture_default_str()
      ->check(CLI::IsMember({"paths", "documents", "csv"}));
  cmd->add_option("--question-form", o.question_form,
                  "GraphRAG: the question in words (\"What is the r of A?\") or as a cloze in the context's "
                  "notation, the fact up to its answer (\"A -r->\" over paths, \"The r of A is\" over "
                  "documents); a model for cloze questions wants `model new --prompt-task-prefix '' "
                  "--prompt-task-suffix ''`")
      ->capture_default_str()
      ->check(CLI::IsMember({"words", "cloze"}));
  cmd->add_option("--max-fanout", o.max_fanout, "GraphRAG: edges followed per entity")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{100000}));
}

// Chunk RAG: chunks per request, their order, chunking.
void add_chunk_workload_options(CLI::App* cmd, GenerateOptions& o) {
  cmd->add_option("--top-k", o.top_k, "Chunk RAG: chunks per request")->capture_default_str();
  cmd->add_flag(
      "--shuffle-chunks", o.shuffle_chunks,
      "Chunk RAG: each request's chunks in a random order (seeded), as when the same documents come "
      "back ranked differently");
  cmd->add_option("--chunk-tokens", o.chunking.chunk_tokens, "Chunk RAG: tokens per chunk")
      ->capture_default_str();
  cmd->add_option("--overlap", o.chunking.overlap, "Chunk RAG: tokens shared by neighbouring chunks")
      ->capture_default_str();
  cmd->add_option("--vocab", o.vocab_path,
                  "GGUF file whose tokenizer chunks the corpus (default: built-in bytes)");
}

void add_generate(CLI::App& parent) {
  static GenerateOptions o;
  CLI::App* cmd = parent.add_subcommand("generate", "Write a request stream (JSONL) for cache experiments");
  auto* kg = cmd->add_option("--kg", o.kg_path,
                             "KG file: synthetic GraphRAG QA over it (DepCache's cache workload)");
  auto* corpus =
      cmd->add_option("--corpus", o.corpus_path, "Corpus file: chunk RAG with BM25 top-k per question");
  kg->excludes(corpus);
  cmd->add_option("--questions", o.qa_path,
                  "QA file (MuSiQue/HotpotQA) the chunk workload draws questions from");
  cmd->add_option("--corpus-format", o.corpus_format, "auto, musique, hotpotqa or jsonl")
      ->capture_default_str();
  cmd->add_option("--out", o.out_path, "Output JSONL file")->required();
  cmd->add_option("--pattern", o.pattern,
                  "Access pattern: uniform, temporal, zipf (or dataset: every question once, in order)")
      ->capture_default_str();
  cmd->add_option("--zipf-s", o.access.zipf_s, "Zipf exponent s: P(rank r) ∝ r^-s")->capture_default_str();
  cmd->add_option("--temporal-reuse", o.access.temporal_reuse, "Temporal: chance to reuse a recent item")
      ->capture_default_str();
  cmd->add_option("--temporal-window", o.access.temporal_window, "Temporal: how many recent items count")
      ->capture_default_str();
  cmd->add_option("--requests", o.n_requests, "Number of requests")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--rate", o.rate, "Poisson arrival rate in requests/s (0: all at t=0)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o.seed, "Random seed")->capture_default_str();
  add_graph_workload_options(cmd, o);
  add_chunk_workload_options(cmd, o);
  cmd->callback([] {
    if (o.kg_path.empty() && o.corpus_path.empty()) throw CLI::ValidationError("give --kg or --corpus");
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<RagRequest> reqs = o.kg_path.empty() ? generate_chunks(o) : generate_graph(o);
    write_requests(o.out_path, reqs);
    fmt::print("wrote {} requests to {} ({:.2f} s)\n", reqs.size(), o.out_path, seconds_since(t0));
  });
}

// Token cost, identity and token runs of every context item of every
// request. Streams repeat the same documents and paths, so each distinct text
// is tokenized once.
std::vector<std::vector<ItemUse>> item_uses(const std::vector<RagRequest>& reqs, const Tokenizer& tok,
                                            int64_t& flat_tokens) {
  std::unordered_map<std::string, std::vector<int32_t>> doc_tokens, path_tokens_of;
  const auto tokens_of = [&](auto& memo, const std::string& text,
                             auto&& encode) -> const std::vector<int32_t>& {
    auto it = memo.find(text);
    if (it == memo.end()) it = memo.emplace(text, encode(text)).first;
    return it->second;
  };
  std::vector<std::vector<ItemUse>> out;
  flat_tokens = 0;
  for (const RagRequest& r : reqs) {
    std::vector<ItemUse> uses;
    for (const RequestDocument& d : r.documents) {
      const std::vector<int32_t>& ids =
          tokens_of(doc_tokens, d.text, [&](const std::string& t) { return tok.encode(t, false, false); });
      const auto n = static_cast<int64_t>(ids.size());
      // The key includes the text: the same id with other text is other content.
      uses.push_back({"doc:" + d.id, "doc:" + d.id + '\n' + d.text, n, {ids}});
      flat_tokens += n;
    }
    for (const RequestEntity& e : r.entities) {
      // An entity's cost is its merged subtree; its content is its path set.
      ItemUse use{"entity:" + e.name, "entity:" + e.name, 0, {}};
      for (const std::string& p : e.paths) {
        use.sequences.push_back(
            tokens_of(path_tokens_of, p, [&](const std::string& t) { return path_tokens(tok, t); }));
        use.key += '\n' + p;
      }
      DepPrompt tree;
      tree.add_tree(e.name, use.sequences);
      use.tokens = static_cast<int64_t>(tree.size());
      flat_tokens += tree.n_flat_tokens();
      uses.push_back(std::move(use));
    }
    out.push_back(std::move(uses));
  }
  return out;
}

void add_stats(CLI::App& parent) {
  static std::string requests_path, vocab_path;
  static bool json = false;
  CLI::App* cmd =
      parent.add_subcommand("stats", "Locality of a request stream: top-20% share and reuse bound");
  cmd->add_option("--requests", requests_path, "Request file (JSONL)")->required();
  cmd->add_option("--vocab", vocab_path, "GGUF file whose tokenizer counts tokens (default: built-in bytes)");
  cmd->add_flag("--json", json, "Print one JSON object");
  cmd->callback([] {
    const std::vector<RagRequest> reqs = read_requests(requests_path);
    const Tokenizer tok = tokenizer_from(vocab_path);
    int64_t flat = 0;
    const LocalityReport r = locality_report(item_uses(reqs, tok, flat));
    if (json) {
      const nlohmann::json j = {{"requests", r.n_requests},
                                {"item_uses", r.n_item_uses},
                                {"distinct_items", r.n_distinct_items},
                                {"distinct_contents", r.n_distinct_contents},
                                {"top20_request_share", r.top20_request_share},
                                {"top20_use_share", r.top20_use_share},
                                {"top20_cut_ties", r.top20_cut_ties},
                                {"context_tokens", r.total_tokens},
                                {"flat_context_tokens", flat},
                                {"distinct_tokens", r.distinct_tokens},
                                {"reuse_upper_bound", r.reuse_upper_bound},
                                {"mean_request_hit_bound", r.mean_request_hit_bound},
                                {"prefix_reuse_upper_bound", r.prefix_reuse_upper_bound},
                                {"mean_request_prefix_hit_bound", r.mean_request_prefix_hit_bound},
                                {"tokenizer", tokenizer_name(vocab_path)}};
      fmt::print("{}\n", j.dump(2));
      return;
    }
    fmt::print("requests:                 {}\n", r.n_requests);
    fmt::print("context items used:       {} ({} distinct items, {} distinct contents)\n", r.n_item_uses,
               r.n_distinct_items, r.n_distinct_contents);
    fmt::print("top 20% = the {} most used of the items seen in the stream\n",
               std::max<size_t>(1, (r.n_distinct_items + 4) / 5));
    fmt::print("requests touching top 20% items: {:.1f}%{}\n", 100 * r.top20_request_share,
               r.top20_cut_ties
                   ? fmt::format(" ({} more items tie at the cut; broken by name)", r.top20_cut_ties)
                   : "");
    fmt::print("uses going to top 20% items:     {:.1f}%\n", 100 * r.top20_use_share);
    fmt::print("context tokens:           {} ({} before prefix merging; tokenizer: {})\n", r.total_tokens,
               flat, tokenizer_name(vocab_path));
    fmt::print("distinct context tokens:  {}\n", r.distinct_tokens);
    fmt::print("token reuse upper bound (infinite cache):\n");
    fmt::print("  whole items (identical content): {:.1f}% of tokens, {:.1f}% per request\n",
               100 * r.reuse_upper_bound, 100 * r.mean_request_hit_bound);
    fmt::print("  token prefixes per item:          {:.1f}% of tokens, {:.1f}% per request\n",
               100 * r.prefix_reuse_upper_bound, 100 * r.mean_request_prefix_hit_bound);
  });
}

}  // namespace

void add_workload_commands(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("workload", "Generate request streams and measure their locality");
  cmd->require_subcommand(1);
  add_generate(*cmd);
  add_stats(*cmd);
}

}  // namespace depcache::cli

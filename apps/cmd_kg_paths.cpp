// `depcache kg paths`: relation-path retrieval on a KG file, as GraphRAG runs
// it per request: link entities, extract L-hop paths, prune to the top-k for
// the question, serialize, and count what the DepPrompt saves over a flat
// serialization. `--benchmark N` times every stage over N sampled questions.
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "prompt/dep_prompt.h"
#include "prompt/graph_prompt.h"
#include "retrieval/entity_linker.h"
#include "retrieval/knowledge_graph.h"
#include "retrieval/relation_paths.h"
#include "retrieval/retriever.h"
#include "retrieval/text_ranker.h"
#include "retrieval/workload.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache::cli {
namespace {

struct PathsOptions {
  std::string kg_path, entity, question, scorer = "bm25", format = "path", vocab_path;
  PathLimits limits;
  size_t top_k = 30;
  size_t n_entities = 10;  // linked from the question when --entity is absent
  size_t benchmark = 0;
  uint64_t seed = 1;
  bool json = false;
};

void print_paths(const KnowledgeGraph& kg, const EntityPaths& r, const std::string& format) {
  if (format == "triplet")
    fmt::print("{}", triplet_text(kg, r.kept));
  else if (format == "csv")
    fmt::print("{}", graph_csv_text(kg, r.kept));
  else
    for (const std::string& t : r.kept_text) fmt::print("{}\n", t);
}

// The entities a query starts from (--entity, or linked from --question)
// and how each was found.
struct LinkedEntities {
  std::vector<EntityId> entities;
  std::vector<std::string> how;
  double link_ms = 0;
};

LinkedEntities link_entities(const EntityLinker& linker, const PathsOptions& o) {
  LinkedEntities out;
  const auto t0 = Clock::now();
  if (!o.entity.empty()) {
    out.entities.push_back(linker.resolve(o.entity));
    out.how.push_back(fmt::format("resolved from \"{}\"", o.entity));
  } else {
    if (o.question.empty()) throw CLI::ValidationError("give --entity, --question or --benchmark");
    LinkOptions lopt;
    lopt.max_entities = o.n_entities;
    for (const LinkedEntity& l : linker.link(o.question, lopt)) {
      out.entities.push_back(l.entity);
      out.how.push_back(fmt::format("{} match \"{}\"",
                                    l.how == LinkKind::Label   ? "label"
                                    : l.how == LinkKind::Alias ? "alias"
                                                               : "bm25",
                                    l.mention));
    }
    if (out.entities.empty())
      fail(ErrorKind::NotFound, "no entity of the graph is mentioned in the question");
  }
  out.link_ms = ms_since(t0);
  return out;
}

// Tokens of the prompt's context (its tree segments), merged and flat.
struct ContextSize {
  int64_t merged = 0, flat = 0;
};

ContextSize context_size(const DepPrompt& prompt) {
  ContextSize c;
  for (const PromptSegment& s : prompt.segments())
    if (s.kind == SegmentKind::Tree) {
      c.merged += s.tokens.size();
      c.flat += s.n_flat_tokens;
    }
  return c;
}

void print_query_json(const KnowledgeGraph& kg, const PathsOptions& o, const LinkedEntities& linked,
                      const std::vector<EntityPaths>& all, const DepPrompt& prompt) {
  const ContextSize context = context_size(prompt);
  nlohmann::json j;
  for (size_t i = 0; i < all.size(); ++i) {
    const EntityPaths& r = all[i];
    j["entities"].push_back({{"name", kg.entity_name(r.entity)},
                             {"label", kg.entity_label(r.entity)},
                             {"linked_by", linked.how[i]},
                             {"candidates", r.candidates.paths.size()},
                             {"truncated", r.candidates.truncated},
                             {"paths", r.kept_text},
                             {"extract_ms", r.extract_ms},
                             {"prune_ms", r.prune_ms}});
  }
  j["link_ms"] = linked.link_ms;
  j["prompt"] = {{"tokens", prompt.size()},
                 {"nodes", prompt.nodes().size()},
                 {"flat_tokens", prompt.n_flat_tokens()},
                 {"context_tokens", context.merged},
                 {"context_flat_tokens", context.flat},
                 {"attention_pairs", prompt.n_attention_pairs()},
                 {"flat_attention_pairs", prompt.n_flat_attention_pairs()},
                 {"tokenizer", tokenizer_name(o.vocab_path)}};
  fmt::print("{}\n", j.dump(2));
}

void print_query_text(const KnowledgeGraph& kg, const PathsOptions& o, double index_ms,
                      const LinkedEntities& linked, const std::vector<EntityPaths>& all,
                      const DepPrompt& prompt) {
  const ContextSize context = context_size(prompt);
  fmt::print("linker index built in {:.1f} ms; linking took {:.3f} ms\n", index_ms, linked.link_ms);
  for (size_t i = 0; i < all.size(); ++i) {
    const EntityPaths& r = all[i];
    fmt::print("\n# {} ({}), {}\n", kg.entity_name(r.entity), kg.entity_label(r.entity), linked.how[i]);
    fmt::print("# {} candidate paths{} in {:.3f} ms; kept {} by {} in {:.3f} ms\n", r.candidates.paths.size(),
               r.candidates.truncated ? " (limits cut the enumeration)" : "", r.extract_ms, r.kept.size(),
               o.question.empty() ? "enumeration order" : o.scorer, r.prune_ms);
    print_paths(kg, r, o.format);
  }
  fmt::print(
      "\nDepPrompt ({}): {} tokens in {} nodes; flat serialization {} tokens ({:.2f}x)\n",
      tokenizer_name(o.vocab_path), prompt.size(), prompt.nodes().size(), prompt.n_flat_tokens(),
      static_cast<double>(prompt.n_flat_tokens()) / static_cast<double>(std::max<size_t>(1, prompt.size())));
  fmt::print(
      "context: {} tokens merged vs {} flat; attention pairs {} vs {} causal over the flat prompt "
      "({:.2f}x)\n",
      context.merged, context.flat, prompt.n_attention_pairs(), prompt.n_flat_attention_pairs(),
      static_cast<double>(prompt.n_flat_attention_pairs()) /
          static_cast<double>(std::max<int64_t>(1, prompt.n_attention_pairs())));
}

void run_query(const KnowledgeGraph& kg, const PathsOptions& o) {
  const auto t_link = Clock::now();
  const EntityLinker linker(kg);
  const double index_ms = ms_since(t_link);
  const LinkedEntities linked = link_entities(linker, o);
  const auto scorer = make_text_scorer(o.scorer);
  const Tokenizer tok = tokenizer_from(o.vocab_path);
  GraphPromptText text;
  text.system = "Answer the question using the knowledge graph paths below.";
  text.task = "Question: " + o.question + "\nAnswer:";
  std::vector<EntityPaths> all;
  for (EntityId e : linked.entities) {
    all.push_back(retrieve_entity_paths(kg, e, o.question, *scorer, o.limits, o.top_k));
    text.entities.push_back({std::string(kg.entity_name(e)), all.back().kept_text});
  }
  const DepPrompt prompt = build_graph_prompt(tok, text);
  if (o.json)
    print_query_json(kg, o, linked, all, prompt);
  else
    print_query_text(kg, o, index_ms, linked, all, prompt);
}

// Times each retrieval stage over sampled synthetic questions.
void run_benchmark(const KnowledgeGraph& kg, const PathsOptions& o) {
  GraphQaOptions qopt;
  qopt.n_items = o.benchmark;
  qopt.seed = o.seed;
  qopt.min_paths = 1;
  qopt.hops = o.limits.hops;
  const std::vector<GraphQa> qa = make_graph_qa(kg, qopt);
  auto t0 = Clock::now();
  const EntityLinker linker(kg);
  const double index_ms = ms_since(t0);
  const auto scorer = make_text_scorer(o.scorer);
  const Tokenizer tok = tokenizer_from(o.vocab_path);
  std::vector<double> link_ms, extract_ms, prune_ms, prompt_ms, total_ms;
  size_t topic_linked = 0, n_candidates = 0, n_truncated = 0;
  for (const GraphQa& q : qa) {
    const auto start = Clock::now();
    t0 = Clock::now();
    const std::vector<LinkedEntity> linked = linker.link(q.question);
    link_ms.push_back(ms_since(t0));
    for (const LinkedEntity& l : linked) topic_linked += l.entity == q.topic;
    const EntityPaths r = retrieve_entity_paths(kg, q.topic, q.question, *scorer, o.limits, o.top_k);
    extract_ms.push_back(r.extract_ms);
    prune_ms.push_back(r.prune_ms);
    n_candidates += r.candidates.paths.size();
    n_truncated += r.candidates.truncated;
    t0 = Clock::now();
    GraphPromptText text{"system", {{std::string(kg.entity_name(q.topic)), r.kept_text}}, q.question};
    const DepPrompt prompt = build_graph_prompt(tok, text);
    prompt_ms.push_back(ms_since(t0));
    total_ms.push_back(ms_since(start));
  }
  fmt::print(
      "{} questions over {} entities / {} triples; scorer {}, hops {}, top-k {}, max paths {}, fan-out {}\n",
      qa.size(), kg.n_entities(), kg.n_triples(), o.scorer, o.limits.hops, o.top_k, o.limits.max_paths,
      o.limits.max_fanout);
  fmt::print("linker index build: {:.1f} ms (once per process)\n", index_ms);
  fmt::print("candidates per entity: {:.1f} on average; enumeration cut by limits for {} of {}\n",
             static_cast<double>(n_candidates) / static_cast<double>(qa.size()), n_truncated, qa.size());
  fmt::print("topic entity among the linked entities: {}/{}\n", topic_linked, qa.size());
  fmt::print("{:<22} {:>10} {:>10} {:>10}\n", "stage (ms per query)", "p50", "p99", "max");
  const auto row = [](const char* name, const std::vector<double>& v) {
    fmt::print("{:<22} {:>10.3f} {:>10.3f} {:>10.3f}\n", name, percentile(v, 50), percentile(v, 99),
               percentile(v, 100));
  };
  row("link entities", link_ms);
  row("extract paths", extract_ms);
  row("prune (score+top-k)", prune_ms);
  row("tokenize + DepPrompt", prompt_ms);
  row("total", total_ms);
}

}  // namespace

void add_kg_paths_command(CLI::App& kg) {
  static PathsOptions o;
  CLI::App* cmd = kg.add_subcommand("paths", "Retrieve and prune relation paths for an entity or a question");
  cmd->add_option("--kg", o.kg_path, "KG file (from `kg import`)")->required();
  cmd->add_option("--entity", o.entity, "Entity name or label (else: entities linked from --question)");
  cmd->add_option("--question", o.question, "Question the paths are ranked against");
  cmd->add_option("--entities", o.n_entities, "Entities linked from the question")->capture_default_str();
  cmd->add_option("--hops", o.limits.hops, "Path length in hops")
      ->capture_default_str()
      ->check(CLI::Range(1, 8));
  cmd->add_option("--top-k", o.top_k, "Paths kept per entity")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{100000}));
  // Bounded so a typo cannot ask for an unbounded walk over a hub.
  cmd->add_option("--max-paths", o.limits.max_paths, "Candidate paths enumerated per entity")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1000000}));
  cmd->add_option("--max-fanout", o.limits.max_fanout, "Edges followed per entity")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{100000}));
  cmd->add_flag("--inverse", o.limits.follow_inverse, "Also walk edges backwards (for one-way KGs)");
  cmd->add_option("--scorer", o.scorer, "Path relevance: bm25, tfidf or hash-embedding")
      ->capture_default_str();
  cmd->add_option("--format", o.format, "Printed form: path, triplet or csv (G-Retriever)")
      ->capture_default_str()
      ->check(CLI::IsMember({"path", "triplet", "csv"}));
  cmd->add_option("--vocab", o.vocab_path,
                  "GGUF file whose tokenizer counts DepPrompt tokens (default: built-in bytes)");
  cmd->add_option("--benchmark", o.benchmark, "Time link/extract/prune over N sampled synthetic questions");
  cmd->add_option("--seed", o.seed, "Seed for --benchmark")->capture_default_str();
  cmd->add_flag("--json", o.json, "Print one JSON object");
  cmd->callback([] {
    make_text_scorer(o.scorer);  // reject a bad name before loading anything
    const KnowledgeGraph graph = KnowledgeGraph::load(o.kg_path);
    if (o.benchmark > 0)
      run_benchmark(graph, o);
    else
      run_query(graph, o);
  });
}

}  // namespace depcache::cli

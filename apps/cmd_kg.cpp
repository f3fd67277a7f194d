// `depcache kg ...`: build knowledge-graph files from WordNet or text triples,
// and describe them.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "retrieval/knowledge_graph.h"
#include "retrieval/synthetic_kg.h"
#include "retrieval/wordnet.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache::cli {
namespace {

std::string human_size(uintmax_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{:.1f} MiB", bytes / 1048576.0);
}

TripleFormat parse_format(const std::string& s) {
  if (s == "tsv") return TripleFormat::Tsv;
  if (s == "csv") return TripleFormat::Csv;
  if (s == "jsonl") return TripleFormat::Jsonl;
  return TripleFormat::Auto;  // the option's check admits nothing else
}

void add_import_command(CLI::App* kg) {
  CLI::App* cmd = kg->add_subcommand(
      "import", "Build a KG file from WordNet, a triples file or a random synthetic world");
  static bool wordnet = false;
  static std::string wordnet_dir = kDefaultWordnetDir.string(), triples, format = "auto", out;
  // Exactly one source; CLI11 reports anything else as a usage error (exit 2).
  CLI::Option_group* source = cmd->add_option_group("source", "Where the graph comes from (exactly one)");
  CLI::Option* wordnet_opt =
      source->add_flag("--wordnet", wordnet, "Import the WordNet 3.0 database (Debian package wordnet-base)");
  CLI::Option* triples_opt =
      source->add_option("--triples", triples, "Import a TSV, CSV or JSONL triples file");
  static bool synthetic = false;
  static SyntheticKgOptions so;
  CLI::Option* synthetic_opt = source->add_flag("--synthetic", synthetic,
                                                "Make a random world: made-up entity names, one tail per "
                                                "(entity, relation), for training and evaluation");
  source->require_option(1);
  cmd->add_option("--entities", so.n_entities, "Synthetic: entities")
      ->capture_default_str()
      ->check(CLI::Range(size_t{2}, size_t{1} << 20))
      ->needs(synthetic_opt);
  cmd->add_option("--relations", so.n_relations, "Synthetic: relation types")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, synthetic_relation_count()))
      ->needs(synthetic_opt);
  cmd->add_option("--facts-per-entity", so.facts_per_entity,
                  "Synthetic: facts (distinct relations) per entity")
      ->capture_default_str()
      ->needs(synthetic_opt);
  cmd->add_option("--name-pool", so.name_pool,
                  "Synthetic: draw names from one fixed pool of N made-up names shared by every world "
                  "(0: each world makes up its own)")
      ->capture_default_str()
      ->needs(synthetic_opt);
  cmd->add_option("--seed", so.seed, "Synthetic: seed of the world")
      ->capture_default_str()
      ->needs(synthetic_opt);
  cmd->add_option("--wordnet-dir", wordnet_dir, "Directory with WordNet's data.* and index.* files")
      ->capture_default_str()
      ->needs(wordnet_opt);
  cmd->add_option("--format", format,
                  "Triples file format; auto picks by extension (.tsv/.txt, .csv, .jsonl)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "tsv", "csv", "jsonl"}))
      ->needs(triples_opt);
  add_output_option(*cmd, out, "KG file to write")->required();
  cmd->callback([] {
    const auto t0 = std::chrono::steady_clock::now();
    KnowledgeGraph g;
    WordnetImportStats ws;
    if (wordnet) {
      g = import_wordnet(wordnet_dir, &ws);
    } else if (synthetic) {
      g = make_synthetic_kg(so);
    } else {
      g = load_triples(triples, parse_format(format));
    }
    const double import_s = seconds_since(t0);
    const auto t1 = std::chrono::steady_clock::now();
    g.save(out);
    const double save_s = seconds_since(t1);

    if (wordnet)
      fmt::print("WordNet {}: {} synsets, {} pointers ({} lexical)\n", wordnet_dir, ws.n_synsets,
                 ws.n_pointers, ws.n_lexical_pointers);
    else if (synthetic)
      fmt::print("synthetic world, seed {}\n", so.seed);
    else
      fmt::print("triples file {}\n", triples);
    fmt::print("entities:  {}\n", g.n_entities());
    fmt::print("relations: {}\n", g.n_relations());
    fmt::print("triples:   {}\n", g.n_triples());
    fmt::print("aliases:   {}\n", g.n_aliases());
    fmt::print("time:      {:.3f} s import, {:.3f} s save\n", import_s, save_s);
    fmt::print("output:    {} ({})\n", out, human_size(std::filesystem::file_size(out)));
  });
}

// Relations, most triples first (ties by name), at most `top` (0: all).
std::vector<RelationId> relations_by_triples(const KnowledgeGraph& g, const std::vector<size_t>& per_relation,
                                             size_t top) {
  std::vector<RelationId> order(g.n_relations());
  for (RelationId r = 0; r < order.size(); ++r) order[r] = r;
  std::sort(order.begin(), order.end(), [&](RelationId a, RelationId b) {
    return per_relation[a] != per_relation[b] ? per_relation[a] > per_relation[b]
                                              : g.relation_name(a) < g.relation_name(b);
  });
  if (top != 0 && order.size() > top) order.resize(top);
  return order;
}

// What `kg stats` reports of a graph besides its sizes.
struct GraphStats {
  std::vector<size_t> sorted_degree;  // out-degrees, ascending
  double mean_degree = 0;
  size_t max_degree = 0;
  EntityId busiest = 0;
  size_t n_isolated = 0, n_self_loops = 0;
  std::vector<size_t> per_relation;  // triples of each relation
  std::vector<RelationId> order;     // the relations listed, most triples first
};

GraphStats graph_stats(const KnowledgeGraph& g, size_t top) {
  GraphStats s;
  const size_t n = g.n_entities();
  std::vector<size_t> degree(n);
  size_t total = 0;
  for (EntityId e = 0; e < n; ++e) {
    degree[e] = g.out_edges(e).size();
    total += degree[e];
    if (degree[e] > degree[s.busiest]) s.busiest = e;
    if (degree[e] == 0 && g.in_edges(e).empty()) ++s.n_isolated;
  }
  s.per_relation.assign(g.n_relations(), 0);
  for (const Triple& t : g.triples()) {
    s.n_self_loops += t.head == t.tail;
    ++s.per_relation[t.relation];
  }
  s.order = relations_by_triples(g, s.per_relation, top);
  s.mean_degree = n ? static_cast<double>(total) / static_cast<double>(n) : 0.0;
  s.max_degree = n ? degree[s.busiest] : 0;
  s.sorted_degree = std::move(degree);
  std::sort(s.sorted_degree.begin(), s.sorted_degree.end());
  return s;
}

void print_stats_json(const KnowledgeGraph& g, const GraphStats& s, const std::string& path,
                      uintmax_t file_size, double load_s) {
  nlohmann::json rel = nlohmann::json::array();
  for (RelationId r : s.order)
    rel.push_back({{"relation", g.relation_name(r)}, {"triples", s.per_relation[r]}});
  const nlohmann::json j = {
      {"file", path},
      {"file_size_bytes", file_size},
      {"load_seconds", load_s},
      {"entities", g.n_entities()},
      {"relations", g.n_relations()},
      {"triples", g.n_triples()},
      {"aliases", g.n_aliases()},
      {"out_degree",
       {{"mean", s.mean_degree},
        {"max", s.max_degree},
        {"p50", percentile_sorted(s.sorted_degree, 50)},
        {"p90", percentile_sorted(s.sorted_degree, 90)},
        {"p99", percentile_sorted(s.sorted_degree, 99)}}},
      {"isolated_entities", s.n_isolated},
      {"self_loops", s.n_self_loops},
      {"relations_by_triples", rel},
  };
  fmt::print("{}\n", j.dump());
}

void print_stats_text(const KnowledgeGraph& g, const GraphStats& s, const std::string& path,
                      uintmax_t file_size, double load_s, size_t top) {
  const size_t n = g.n_entities();
  fmt::print("file:       {} ({}, loaded in {:.3f} s)\n", path, human_size(file_size), load_s);
  fmt::print("entities:   {}\n", n);
  fmt::print("relations:  {}\n", g.n_relations());
  fmt::print("triples:    {}\n", g.n_triples());
  fmt::print("aliases:    {}\n", g.n_aliases());
  fmt::print("out-degree: mean {:.2f}, p50 {}, p90 {}, p99 {}, max {}{}\n", s.mean_degree,
             percentile_sorted(s.sorted_degree, 50), percentile_sorted(s.sorted_degree, 90),
             percentile_sorted(s.sorted_degree, 99), s.max_degree,
             n ? fmt::format(" ({})", g.entity_name(s.busiest)) : std::string());
  fmt::print("isolated:   {} entities without edges\n", s.n_isolated);
  fmt::print("self-loops: {}\n", s.n_self_loops);
  fmt::print("triples per relation{}:\n",
             top != 0 && g.n_relations() > top ? fmt::format(" (top {})", top) : "");
  for (RelationId r : s.order) fmt::print("  {:>10}  {}\n", s.per_relation[r], g.relation_name(r));
}

void add_stats_command(CLI::App* kg) {
  CLI::App* cmd = kg->add_subcommand("stats", "Describe a KG file: sizes, degrees, relations");
  static std::string path;
  static size_t top = 20;
  static bool json = false;
  cmd->add_option("-k,--kg", path, "KG file written by `kg import`")->required();
  cmd->add_option("--top", top, "Relations to list, most triples first (0: all)")->capture_default_str();
  cmd->add_flag("--json", json, "Print one JSON object instead of text");
  cmd->callback([] {
    const auto t0 = std::chrono::steady_clock::now();
    const KnowledgeGraph g = KnowledgeGraph::load(path);
    const double load_s = seconds_since(t0);
    const GraphStats s = graph_stats(g, top);
    const uintmax_t file_size = std::filesystem::file_size(path);
    if (json)
      print_stats_json(g, s, path, file_size, load_s);
    else
      print_stats_text(g, s, path, file_size, load_s, top);
  });
}

}  // namespace

void add_kg_commands(CLI::App& app) {
  static CLI::App* kg = app.add_subcommand("kg", "Build and inspect knowledge-graph (KG) files");
  kg->require_subcommand(1);
  add_import_command(kg);
  add_stats_command(kg);
  add_kg_paths_command(*kg);
}

}  // namespace depcache::cli

// The shipped question-answering model (models/depcache-qa.gguf, made by
// scripts/make_qa_model.sh): on a fixed small held-out set — a world it never
// saw, with names from the shared pool — its exact match under full
// attention stays above a floor, for relation paths and for documents. A
// quality regression test: a change to the tokenizer, the forward pass or
// the prompt layout that hurts its answers fails here.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::run_cli;

// "fullreuse  answers: 7 of 40 exact (17.5%), ..." -> 17.5. Without such a
// line the calling test fails, and the NaN returned passes no comparison.
double strategy_exact_match(const std::string& out, const std::string& strategy) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(strategy + R"( +answers: \d+ of \d+ exact \(([0-9.]+)%\))"))) {
    ADD_FAILURE() << "no '" << strategy << "  answers:' line in:\n" << out;
    return std::numeric_limits<double>::quiet_NaN();
  }
  return std::stod(m[1]);
}

// Each request's answer by its id, from the rows `run --json` wrote for one strategy.
using Answers = std::map<std::string, std::string>;
Answers answers_of(const std::string& rows, const std::string& strategy) {
  Answers answers;
  std::ifstream in(rows);
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line);
    if (row.at("strategy") != strategy) continue;
    EXPECT_TRUE(answers.emplace(row.at("id"), row.at("answer")).second)
        << "request " << row["id"] << " twice";
  }
  return answers;
}

// The requests a and b answer differently, one "id: a | b" line each; a
// request only one of them answered counts too.
std::string answer_differences(const Answers& a, const Answers& b) {
  std::string out;
  for (const auto& [id, answer] : a)
    if (const auto it = b.find(id); it == b.end() || it->second != answer)
      out += id + ": \"" + answer + "\" | " + (it == b.end() ? "none" : "\"" + it->second + "\"") + "\n";
  for (const auto& [id, answer] : b)
    if (!a.contains(id)) out += id + ": none | \"" + answer + "\"\n";
  return out;
}

// A world the model never saw (names from the shared pool), written to dir.
std::string held_out_world(const std::filesystem::path& dir) {
  const std::string world = (dir / "world.dkg").string();
  const auto r = run_cli(
      "kg import --synthetic --entities 300 --relations 12 --facts-per-entity 3 --name-pool 1000 --seed 9101 "
      "-o " +
      world);
  EXPECT_EQ(r.code, 0) << r.out;
  return world;
}

// Cloze questions of 1 hop over world, each over `entities` entities' relation
// paths or documents (`context`), as the shipped models were trained on,
// written to file.
std::string cloze_requests(const std::string& world, const std::string& context, int qa_items, int entities,
                           const std::string& file) {
  const auto g =
      run_cli("workload generate --kg " + world + " --pattern dataset --qa-items " +
              std::to_string(qa_items) + " --entities-per-request " + std::to_string(entities) +
              " --paths-per-entity 9 --min-paths 1 --hops 2 --question-hops 1 --question-form cloze "
              "--context " +
              context + " --seed 77 --out " + file);
  EXPECT_EQ(g.code, 0) << g.out;
  return file;
}

std::string shipped_model(const char* name) {
  return (std::filesystem::path(DEPCACHE_MODELS_DIR) / name).string();
}

TEST(QaModel, ShippedModelAnswersHeldOutQuestionsAboveAFloor) {
  const std::string model = shipped_model("depcache-qa.gguf");
  ASSERT_TRUE(std::filesystem::exists(model)) << model << " is part of the repository";
  const auto dir = test::temp_path("qa-model");
  std::filesystem::create_directories(dir);
  const std::string world = held_out_world(dir);
  // Floors: 10 points under what the model scored when it was made (100%
  // and 99%, docs/training.md), room for another CPU's kernels to flip a
  // few argmaxes; a model that does not answer scores 0, and one that finds
  // the asked entity's sentences but not the asked relation about 33.
  const std::pair<const char*, double> forms[] = {{"paths", 90.0}, {"documents", 89.0}};
  for (const auto& [form, floor] : forms) {
    const std::string requests =
        cloze_requests(world, form, 100, 3, (dir / (std::string(form) + ".jsonl")).string());
    const auto r = run_cli("run -m " + model + " --requests " + requests + " -s full -n 12 -q");
    ASSERT_EQ(r.code, 0) << r.out;
    const double em = strategy_exact_match(r.out, "full");
    EXPECT_GE(em, floor) << form << ":\n" << r.out;
  }
  std::filesystem::remove_all(dir);
}

// A dependency-tuned shipped model through depcache on the fixed world's
// relation-path questions, with subtree reuse and computing every subtree
// afresh (`--no-reuse`), under the scheme the model records.
struct ReuseRuns {
  test::CliRun reused, fresh;
  double reused_em = 0, fresh_em = 0;
  Answers reused_answers, fresh_answers;  // of the 100 questions, by request id
};
ReuseRuns depcache_with_and_without_reuse(const char* name, const std::string& options = "") {
  const std::string model = shipped_model(name);
  EXPECT_TRUE(std::filesystem::exists(model)) << model << " is part of the repository";
  const auto dir = test::temp_path(std::string("qa-") + name);
  std::filesystem::create_directories(dir);
  const std::string requests =
      cloze_requests(held_out_world(dir), "paths", 100, 3, (dir / "paths.jsonl").string());
  const std::string run = "run -m " + model + " --requests " + requests + " -s depcache -n 12 -q" + options;
  const std::string reused_rows = (dir / "reused.jsonl").string(),
                    fresh_rows = (dir / "fresh.jsonl").string();
  ReuseRuns r{};
  r.reused = run_cli(run + " --json " + reused_rows);
  r.fresh = run_cli(run + " --no-reuse --json " + fresh_rows);
  EXPECT_EQ(r.reused.code, 0) << r.reused.out;
  EXPECT_EQ(r.fresh.code, 0) << r.fresh.out;
  r.reused_em = strategy_exact_match(r.reused.out, "depcache");
  r.fresh_em = strategy_exact_match(r.fresh.out, "depcache");
  r.reused_answers = answers_of(reused_rows, "depcache");
  r.fresh_answers = answers_of(fresh_rows, "depcache");
  EXPECT_EQ(r.reused_answers.size(), 100u) << "one answer per question asked";
  EXPECT_EQ(r.fresh_answers.size(), 100u) << "one answer per question asked";
  std::filesystem::remove_all(dir);
  return r;
}

// The model fine-tuned under dependency attention with depth positions
// (models/depcache-qa-depth.gguf) answers above a floor (10 points under the
// 66% it scored when it was made), and reusing subtrees' caches gives
// exactly the answers of computing them afresh: depth positions make the
// reuse exact.
TEST(QaModel, DependencyTunedModelAnswersAsWellWithReuseAsWithout) {
  const ReuseRuns r = depcache_with_and_without_reuse("depcache-qa-depth.gguf");
  EXPECT_NE(r.reused.out.find("positions depth"), std::string::npos) << r.reused.out;
  EXPECT_GE(r.reused_em, 56.0) << r.reused.out;
  EXPECT_EQ(answer_differences(r.reused_answers, r.fresh_answers), "") << "reused | fresh";
}

// The copy fine-tuned with sequential positions
// (models/depcache-qa-sequential.gguf) answers every question when each
// subtree is computed afresh (100% when it was made; floor 90%). Reuse under
// sequential positions is approximate by design: a cached entity tree sits
// at another offset from the system text in a later request, and this model
// reads that offset, so reuse costs answers (41% with 68% of the prompt
// reused, when the model was made); held here strictly below the fresh
// figure, with answers of reuse that differ from the fresh ones.
TEST(QaModel, SequentialTunedModelAnswersFreshAndReuseIsApproximate) {
  const ReuseRuns r = depcache_with_and_without_reuse("depcache-qa-sequential.gguf");
  EXPECT_NE(r.reused.out.find("positions sequential"), std::string::npos) << r.reused.out;
  EXPECT_GE(r.fresh_em, 90.0) << r.fresh.out;
  EXPECT_LT(r.reused_em, r.fresh_em) << "reuse at another offset costs answers:\n" << r.reused.out;
  EXPECT_NE(answer_differences(r.reused_answers, r.fresh_answers), "") << "reuse answered as fresh did";
}

// The copy fine-tuned with DepCache's layout and position gaps
// (models/depcache-qa-gaps.gguf, `train --position-gap 128`): its trees sat
// at random distances from the system text in training, as a cached tree
// reused at another offset does. Reuse keeps its answers, unlike the copy
// fine-tuned at the served positions only (the test above): 93% of the
// questions right with reuse, 91% computed afresh when it was made; held
// here above a floor 10 points under the first, and no more than 10 points
// below computing afresh.
TEST(QaModel, GapTunedModelKeepsItsAnswersUnderReuse) {
  const ReuseRuns r = depcache_with_and_without_reuse("depcache-qa-gaps.gguf");
  EXPECT_NE(r.reused.out.find("positions sequential (the model's metadata)\n"), std::string::npos)
      << "trees see the system text:\n"
      << r.reused.out;
  EXPECT_GE(r.reused_em, 83.0) << r.reused.out;
  EXPECT_GE(r.reused_em, r.fresh_em - 10.0) << "reuse at another offset cost answers:\n" << r.reused.out;
  // "depcache  100 ... 68.3%  71855": most of the prompt was reused.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.reused.out, m, std::regex(R"(depcache +100 .* ([0-9.]+)% +\d+)")))
      << r.reused.out;
  EXPECT_GT(std::stod(m[1]), 30.0) << "most trees are reused";
}

// The copy fine-tuned with sequential positions and trees that see only
// themselves (models/depcache-qa-alone.gguf): a tree's cache depends on its
// own tokens, so a tree reused at another offset is re-encoded exactly by
// rotating its keys. Reuse gives the answers of computing afresh, and
// `--verify` finds the logits equal to float rounding with f32 KV (1.9e-5
// when it was made; f16 KV adds a rounding of each rotated key, 1.4e-2) with
// most of the prompt reused.
TEST(QaModel, TreesAloneModelReusesExactlyUnderSequentialPositions) {
  const ReuseRuns r = depcache_with_and_without_reuse("depcache-qa-alone.gguf", " --verify --kv-type f32");
  EXPECT_NE(r.reused.out.find("positions sequential (the model's metadata); trees see only themselves (the "
                              "model's metadata)"),
            std::string::npos)
      << r.reused.out;
  EXPECT_GE(r.fresh_em, 90.0) << r.fresh.out;
  EXPECT_EQ(answer_differences(r.reused_answers, r.fresh_answers), "") << "reused | fresh";
  // "depcache  100 ... 68.3%  37855  1.91e-05  100/100": hit rate, attention pairs, max |dlogit|, top-1.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.reused.out, m,
                                std::regex(R"(depcache +100 .* ([0-9.]+)% +\d+ +([0-9.e+-]+) +(\d+)/100)")))
      << r.reused.out;
  EXPECT_GT(std::stod(m[1]), 30.0) << "most trees are reused";
  EXPECT_LT(std::stod(m[2]), 1e-3) << "reuse moved trees inexactly";
  EXPECT_EQ(m[3].str(), "100");
}

// `generate --request` builds a request's prompt as `run` does (the model's
// template, each context piece tokenized on its own), so it answers each
// question exactly as `run -s full` does, and judges the answer; a prompt
// typed as one text tokenizes the lines' first names otherwise. Bad lines and
// a missing prompt are clear errors.
TEST(QaModel, GenerateAnswersARequestAsRunDoes) {
  const std::string model = shipped_model("depcache-qa.gguf");
  const auto dir = test::temp_path("qa-model-generate");
  std::filesystem::create_directories(dir);
  const std::string requests =
      cloze_requests(held_out_world(dir), "paths", 12, 3, (dir / "paths.jsonl").string());
  const std::string rows = (dir / "rows.jsonl").string();
  const auto r = run_cli("run -m " + model + " --requests " + requests + " -s full -n 12 -q --json " + rows);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(rows);
  std::string line;
  int n = 0, matched = 0;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    ++n;
    const auto g = run_cli("generate -m " + model + " --request " + requests + " --line " +
                           std::to_string(n) + " -n 12 --temp 0");
    ASSERT_EQ(g.code, 0) << g.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(g.out, m, std::regex(R"re(answer: "([^"]*)" \((exact match|no match);)re")))
        << g.out;
    EXPECT_EQ(m[1].str(), row["answer"].get<std::string>()) << "request " << n << ":\n" << g.out;
    EXPECT_EQ(m[2].str() == "exact match", row["exact_match"].get<bool>()) << g.out;
    matched += row["exact_match"].get<bool>();
  }
  EXPECT_EQ(n, 12);
  EXPECT_GT(matched, 0) << "the model answers some of them";

  const auto beyond = run_cli("generate -m " + model + " --request " + requests + " --line 13");
  EXPECT_EQ(beyond.code, 3) << beyond.out;
  EXPECT_NE(beyond.out.find("has 12 requests"), std::string::npos) << beyond.out;
  EXPECT_EQ(run_cli("generate -m " + model).code, 2) << "neither --prompt nor --request";
  EXPECT_EQ(run_cli("generate -m " + model + " -p x --request " + requests).code, 2) << "both";
  EXPECT_EQ(run_cli("generate -m " + model + " -p x --line 2").code, 2) << "--line without --request";
  EXPECT_EQ(run_cli("generate -m " + model + " --request " + (dir / "none.jsonl").string()).code, 4);
  std::filesystem::remove_all(dir);
}

// The CSV model (models/depcache-qa-csv.gguf, made by
// scripts/make_csv_qa_model.sh) reads subgraphs as G-Retriever's CSV,
// SubGCache's form, where a fact takes lookups in a chain (name -> node id
// -> edge row -> target id -> name). On the fixed held-out world, questions
// in words over one entity's direct facts scored 96% when it was made and
// over two entities' 56% (naming one of the asked entity's neighbours at
// random: about 33%; docs/training.md); held here 10 points under that.
// With one query per cluster SubGCache shows each query its own subgraph:
// the answers of per-query prompts exactly.
TEST(QaModel, CsvModelReadsSubgraphsShownAsCsv) {
  const std::string model = shipped_model("depcache-qa-csv.gguf");
  ASSERT_TRUE(std::filesystem::exists(model)) << model << " is part of the repository";
  const auto dir = test::temp_path("qa-model-csv");
  std::filesystem::create_directories(dir);
  const std::string world = held_out_world(dir);
  for (const int entities : {1, 2}) {
    const std::string requests = (dir / ("csv" + std::to_string(entities) + ".jsonl")).string();
    const auto g =
        run_cli("workload generate --kg " + world + " --pattern dataset --qa-items 100 " +
                "--entities-per-request " + std::to_string(entities) +
                " --paths-per-entity 9 --min-paths 1 --hops 1 --question-hops 1 --question-form words "
                "--seed 77 --out " +
                requests);
    ASSERT_EQ(g.code, 0) << g.out;
    const std::string rows = (dir / ("rows" + std::to_string(entities) + ".jsonl")).string();
    const auto r = run_cli("run -m " + model + " --requests " + requests +
                           " -s full,subgcache --graph-format csv --clusters 100 -n 12 -q --json " + rows);
    ASSERT_EQ(r.code, 0) << r.out;
    const double full = strategy_exact_match(r.out, "full");
    EXPECT_GE(full, entities == 1 ? 86.0 : 46.0) << entities << " entities:\n" << r.out;
    const Answers per_query = answers_of(rows, "full");
    EXPECT_EQ(per_query.size(), 100u);
    EXPECT_EQ(answer_differences(answers_of(rows, "subgcache"), per_query), "")
        << entities << " entities, subgcache | full";
  }
  std::filesystem::remove_all(dir);
}

// scripts/csv_variants.py, which makes the CSV model's easier training
// contexts, on requests of three entities from `workload generate`: "all"
// gives the request back unchanged; "1" keeps the asked edge alone (its
// target the answer, every node row kept); "src" one edge row per source,
// each of the asked relation; "edge" an edge-row drill whose answer is that
// row's target id; the short forms name the relation. Checked by reading
// the rows back, not with the script's own parser.
TEST(QaModel, CsvVariantsRewriteRequestsAsDocumented) {
  const auto dir = test::temp_path("qa-csv-variants");
  std::filesystem::create_directories(dir);
  const std::string world = held_out_world(dir);
  const std::string in = (dir / "in.jsonl").string();
  ASSERT_EQ(run_cli("workload generate --kg " + world +
                    " --pattern dataset --qa-items 40 --entities-per-request 3 " +
                    "--paths-per-entity 9 --min-paths 1 --hops 1 --question-hops 1 --context csv " +
                    "--question-form words --seed 5 --out " + in)
                .code,
            0);
  const std::string script =
      (std::filesystem::path(DEPCACHE_MODELS_DIR).parent_path() / "scripts/csv_variants.py").string();
  const auto read_jsonl = [](const std::string& path) {
    std::vector<nlohmann::json> rows;
    std::ifstream f(path);
    for (std::string line; std::getline(f, line);) rows.push_back(nlohmann::json::parse(line));
    return rows;
  };
  const auto variants = [&](const std::string& spec) {
    const std::string out = (dir / "out.jsonl").string();
    const auto r = test::run_shell("/usr/bin/python3 " + script + " " + in + " " + out + " --variants " +
                                   spec + " 2>&1");
    EXPECT_EQ(r.code, 0) << r.out;
    return read_jsonl(out);
  };
  const std::vector<nlohmann::json> original = read_jsonl(in);
  ASSERT_EQ(original.size(), 40u);
  // Node rows before the blank line, edge rows after the edge header.
  struct Csv {
    std::string nodes;
    std::vector<std::array<std::string, 3>> edges;
    std::map<std::string, std::string> names;  // id -> name
  };
  const auto read = [](const std::string& text) {
    Csv c;
    const size_t blank = text.find("\n\nsrc,edge_attr,dst\n");
    c.nodes = text.substr(0, blank);
    std::istringstream nodes(c.nodes), edges(text.substr(blank + 20));
    std::string row;
    std::getline(nodes, row);  // header
    while (std::getline(nodes, row)) c.names[row.substr(0, row.find(','))] = row.substr(row.find(',') + 1);
    while (std::getline(edges, row)) {
      const size_t a = row.find(','), b = row.rfind(',');
      c.edges.push_back({row.substr(0, a), row.substr(a + 1, b - a - 1), row.substr(b + 1)});
    }
    return c;
  };
  const auto all = variants("all");
  ASSERT_EQ(all.size(), original.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], original[i]) << i;

  const auto one = variants("1+short");
  ASSERT_EQ(one.size(), original.size());
  for (size_t i = 0; i < one.size(); ++i) {
    const Csv before = read(original[i]["text"]), after = read(one[i]["text"]);
    EXPECT_EQ(after.nodes, before.nodes) << i;
    ASSERT_EQ(after.edges.size(), 1u) << one[i]["text"];
    const auto& [src, rel, dst] = after.edges[0];
    EXPECT_EQ(after.names.at(dst), original[i]["answers"][0]) << i;
    EXPECT_EQ(one[i]["question"], rel + "?");
    EXPECT_NE(original[i]["question"].get<std::string>().find(" " + rel + " of " + after.names.at(src) + "?"),
              std::string::npos)
        << i;
  }
  const auto src = variants("src+mid");
  for (size_t i = 0; i < src.size(); ++i) {
    const Csv before = read(original[i]["text"]), after = read(src[i]["text"]);
    std::set<std::string> sources_before, sources_after;
    for (const auto& e : before.edges) sources_before.insert(e[0]);
    const std::string question = src[i]["question"];
    const std::string rel = question.substr(0, question.find(" of "));
    for (const auto& e : after.edges) {
      EXPECT_TRUE(sources_after.insert(e[0]).second) << "a source twice: " << src[i]["text"];
      EXPECT_EQ(e[1], rel) << src[i]["text"];
    }
    EXPECT_EQ(sources_after, sources_before) << i;
    EXPECT_EQ(src[i]["answers"], original[i]["answers"]) << i;
  }
  for (const auto& r : variants("all+edge")) {
    const Csv c = read(r["text"]);
    const std::string q = r["question"];
    bool found = false;
    for (const auto& e : c.edges) found |= q == e[0] + "," + e[1] + "," && r["answers"][0] == e[2];
    EXPECT_TRUE(found) << q << " -> " << r["answers"][0];
  }
  const auto bad = test::run_shell("/usr/bin/python3 " + script + " " + in + " " +
                                   (dir / "x.jsonl").string() + " --variants 3 2>&1");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("unknown variant '3'"), std::string::npos) << bad.out;
  std::filesystem::remove_all(dir);
}

// FusionRAG's normalized F1 as `run` reports it. With one document per
// question the chunk, realigned, is read as full attention reads it, the
// two score alike and the ratio is undefined. With three, each document's
// cache was computed without the ones before it: this model answers worse
// from that (fullreuse loses answers), and FusionRAG's recomputing 15% of
// the chunk tokens wins part of them back; without the RoPE fix full reuse
// loses at least as many. CacheBlend picks its tokens at layer 1 after
// recomputing layers 0 and 1 for every token, which on this 2-layer model
// is all of it: it answers as full attention does.
TEST(QaModel, RecomputationWinsBackTheAnswersFullReuseLoses) {
  const auto dir = test::temp_path("qa-model-f1");
  std::filesystem::create_directories(dir);
  const std::string world = held_out_world(dir);
  const auto requests = [&](int documents) {
    return cloze_requests(world, "documents", 40, documents,
                          (dir / ("documents" + std::to_string(documents) + ".jsonl")).string());
  };
  const std::string run = "run -m " + shipped_model("depcache-qa.gguf") +
                          " -s full,fullreuse,fusionrag,cacheblend --recompute-ratio 0.15 -n 12 -q";
  auto r = run_cli(run + " --requests " + requests(1));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fusionrag  normalized F1: undefined"), std::string::npos) << r.out;

  const std::string three = requests(3), rows = (dir / "rows.jsonl").string();
  r = run_cli(run + " --requests " + three + " --json " + rows);
  ASSERT_EQ(r.code, 0) << r.out;
  const double full = strategy_exact_match(r.out, "full"), reuse = strategy_exact_match(r.out, "fullreuse");
  EXPECT_GT(full, 0) << r.out;
  EXPECT_LT(reuse, full) << "each document read without the ones before it costs answers:\n" << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m,
      std::regex(
          R"(fusionrag  normalized F1 \(F1 - F1 fullreuse\) / \(F1 full - F1 fullreuse\): ([-0-9.]+))")))
      << r.out;
  EXPECT_GT(std::stod(m[1]), 0.2) << "recomputing 15% wins back part of what fullreuse lost:\n" << r.out;
  const Answers full_answers = answers_of(rows, "full");
  EXPECT_EQ(full_answers.size(), 40u);
  EXPECT_EQ(answer_differences(answers_of(rows, "cacheblend"), full_answers), "") << "cacheblend | full";

  r = run_cli(run + " --requests " + three + " --no-realign");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_LE(strategy_exact_match(r.out, "fullreuse"), reuse) << r.out;
  std::filesystem::remove_all(dir);
}

// FusionRAG's offline step checked before it stores: on the QA model a
// chunk's cache computed after even one neighbour document moves its answers
// away from full attention's (docs/eval: exact match 98% to 5.5%), so the
// check refuses it (exit 7) and nothing reaches the tier; with no neighbour
// the fused cache is the plain one, the check passes and it is stored.
TEST(QaModel, AFusionThatAnswersWorseThanThePlainCachesIsNotStored) {
  const std::string model = shipped_model("depcache-qa.gguf");
  ASSERT_TRUE(std::filesystem::exists(model)) << model << " is part of the repository";
  const auto dir = test::temp_path("qa-fusion-check");
  std::filesystem::create_directories(dir);
  const std::string requests =
      cloze_requests(held_out_world(dir), "documents", 16, 3, (dir / "docs.jsonl").string());
  const auto fuse = [&](int neighbours, const std::string& cache) {
    return run_cli(
        fmt::format("chunks fuse -m {} --requests {} --neighbours {} --check 12 -t 2 --cache-dir {} 2>&1",
                    model, requests, neighbours, cache));
  };
  const auto stored = [](const std::filesystem::path& cache) {
    return std::filesystem::exists(cache) && !std::filesystem::is_empty(cache);
  };
  const std::regex sides(
      R"(check against full attention on 12 requests: fused first token (\d+)/12, 8 tokens identical \d+/12, KL [^;]+; plain first token (\d+)/12)");
  std::smatch m;
  const auto refused = fuse(1, (dir / "one").string());
  EXPECT_EQ(refused.code, 7) << refused.out;
  EXPECT_NE(refused.out.find("refused: the fused caches answer worse than the plain ones"), std::string::npos)
      << refused.out;
  ASSERT_TRUE(std::regex_search(refused.out, m, sides)) << refused.out;
  EXPECT_LT(std::stoi(m[1]), std::stoi(m[2])) << refused.out;
  EXPECT_FALSE(stored(dir / "one")) << "a refused fusion stores nothing";
  const auto kept = fuse(0, (dir / "none").string());
  EXPECT_EQ(kept.code, 0) << kept.out;
  ASSERT_TRUE(std::regex_search(kept.out, m, sides)) << kept.out;
  EXPECT_GE(std::stoi(m[1]), std::stoi(m[2])) << kept.out;
  EXPECT_TRUE(std::regex_search(kept.out, std::regex(R"(; fused [1-9]\d* chunks \(0 already fused\))")))
      << kept.out;
  EXPECT_TRUE(stored(dir / "none"));
  std::filesystem::remove_all(dir);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

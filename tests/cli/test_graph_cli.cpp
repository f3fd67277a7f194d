// `depcache kg paths` and `depcache workload generate|stats` as a user runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "graph_requests.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::run_cli;

class GraphCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(test::temp_path("graph-cli"));
    std::filesystem::create_directories(*dir_);
    std::ofstream tsv(*dir_ / "movies.tsv");
    tsv << test::film_triples_tsv();
    tsv.close();
    const auto r = run_cli("kg import --triples " + (*dir_ / "movies.tsv").string() + " --out " + kg());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string kg() { return (*dir_ / "movies.dkg").string(); }
  static std::string file(const char* name) { return (*dir_ / name).string(); }
  static std::filesystem::path* dir_;
};
std::filesystem::path* GraphCli::dir_ = nullptr;

TEST_F(GraphCli, Help) {
  for (const char* sub : {"kg paths", "workload", "workload generate", "workload stats"}) {
    const auto r = run_cli(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub << ": " << r.out;
    EXPECT_NE(r.out.find("--help"), std::string::npos) << sub;
  }
}

TEST_F(GraphCli, PathsForAnEntityRankedByTheQuestion) {
  const auto r =
      run_cli("kg paths --kg " + kg() + " --entity alice --question 'who directed the film' --top-k 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Alice -like-> Titanic -directed by-> James Cameron"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Alice -friend-> Bob"), std::string::npos) << "only the top 2 are kept:\n" << r.out;
  EXPECT_NE(r.out.find("DepPrompt"), std::string::npos);

  const auto j =
      run_cli("kg paths --kg " + kg() + " --question 'What did Bob like?' --json --format triplet");
  ASSERT_EQ(j.code, 0) << j.out;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["entities"][0]["name"], "Bob");
  EXPECT_LT(doc["prompt"]["tokens"].get<int>(), doc["prompt"]["flat_tokens"].get<int>());
  EXPECT_LT(doc["prompt"]["attention_pairs"].get<int64_t>(),
            doc["prompt"]["flat_attention_pairs"].get<int64_t>());

  const auto csv = run_cli("kg paths --kg " + kg() + " --entity Avatar --format csv");
  ASSERT_EQ(csv.code, 0) << csv.out;
  EXPECT_NE(csv.out.find("node_id,node_attr\n0,Avatar\n"), std::string::npos) << csv.out;
}

TEST_F(GraphCli, PathsErrors) {
  EXPECT_EQ(run_cli("kg paths --kg " + kg() + " --entity 'nobody at all'").code, 4);
  EXPECT_EQ(run_cli("kg paths --kg " + kg()).code, 2);  // no entity, question or benchmark
  EXPECT_EQ(run_cli("kg paths --kg " + kg() + " --entity Alice --scorer magic").code, 3);
  EXPECT_EQ(run_cli("kg paths --kg " + kg() + " --entity Alice --hops 0").code, 2);
  EXPECT_EQ(run_cli("kg paths --kg /nonexistent.dkg --entity Alice").code, 4);
  std::ofstream(file("junk.dkg")) << "not a graph";
  EXPECT_EQ(run_cli("kg paths --kg " + file("junk.dkg") + " --entity Alice").code, 3);
}

TEST_F(GraphCli, BenchmarkPrintsStageTimes) {
  const auto r = run_cli("kg paths --kg " + kg() + " --benchmark 3");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* stage : {"link entities", "extract paths", "prune", "total"})
    EXPECT_NE(r.out.find(stage), std::string::npos) << r.out;
}

TEST_F(GraphCli, GraphWorkloadAndItsLocality) {
  const std::string out = file("zipf.jsonl");
  const auto g =
      run_cli("workload generate --kg " + kg() +
              " --requests 40 --entities-per-request 2 --min-paths 1 --pattern zipf --rate 5 --out " + out);
  ASSERT_EQ(g.code, 0) << g.out;
  std::ifstream in(out);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["entities"].size(), 2u);
    ++n;
  }
  EXPECT_EQ(n, 40u);
  const auto s = run_cli("workload stats --json --requests " + out);
  ASSERT_EQ(s.code, 0) << s.out;
  const auto rep = nlohmann::json::parse(s.out);
  EXPECT_EQ(rep["requests"], 40);
  EXPECT_GT(rep["reuse_upper_bound"].get<double>(), 0.5);  // a handful of entities, 40 requests
  EXPECT_LE(rep["reuse_upper_bound"].get<double>(), 1.0);
  EXPECT_LT(rep["context_tokens"].get<int64_t>(), rep["flat_context_tokens"].get<int64_t>());
  // The same requests with their subgraphs as CSV text: no entities, the text
  // names every entity the paths did.
  const std::string csv = file("csv.jsonl");
  const auto c = run_cli("workload generate --kg " + kg() +
                         " --requests 40 --entities-per-request 2 --min-paths 1 --pattern zipf --rate 5 "
                         "--context csv --out " +
                         csv);
  ASSERT_EQ(c.code, 0) << c.out;
  std::ifstream in_paths(out), in_csv(csv);
  std::string a, b;
  while (std::getline(in_paths, a) && std::getline(in_csv, b)) {
    const auto pj = nlohmann::json::parse(a), cj = nlohmann::json::parse(b);
    EXPECT_FALSE(cj.contains("entities") && !cj["entities"].empty()) << b;
    const std::string text = cj["text"];
    EXPECT_EQ(text.rfind("node_id,node_attr\n", 0), 0u) << text;
    EXPECT_EQ(cj["question"], pj["question"]);
    for (const auto& e : pj["entities"])
      EXPECT_NE(text.find(e["label"].get<std::string>()), std::string::npos) << e << " in " << text;
  }
}

TEST_F(GraphCli, WorkloadErrors) {
  EXPECT_EQ(run_cli("workload generate --out " + file("x.jsonl")).code, 2);  // no source
  EXPECT_EQ(
      run_cli("workload generate --kg " + kg() + " --min-paths 1 --pattern gauss --out " + file("x.jsonl"))
          .code,
      3);
  EXPECT_EQ(run_cli("workload generate --kg " + kg() + " --corpus c.json --out " + file("x.jsonl")).code, 2);
  EXPECT_EQ(run_cli("workload stats --requests /nonexistent.jsonl").code, 4);
  const auto cloze_csv = run_cli("workload generate --kg " + kg() +
                                 " --question-form cloze --context csv --out " + file("x.jsonl"));
  EXPECT_EQ(cloze_csv.code, 3) << cloze_csv.out;
  EXPECT_NE(cloze_csv.out.find("CSV"), std::string::npos) << cloze_csv.out;
  EXPECT_EQ(
      run_cli("workload generate --kg " + kg() + " --question-form riddle --out " + file("x.jsonl")).code, 2);
  std::ofstream(file("bad.jsonl")) << "{\"question\": 3}\n";
  const auto bad = run_cli("workload stats --requests " + file("bad.jsonl"));
  EXPECT_EQ(bad.code, 3);
  EXPECT_NE(bad.out.find("bad.jsonl:1"), std::string::npos) << bad.out;
}

TEST(ChunkWorkloadCli, MusiqueRetrievalLocality) {
  DEPCACHE_REQUIRE_SHARED(corpus, "data/musique/musique_train_corpus.json");
  const auto questions = test::shared_dir() / "data/musique/musique_train.json";
  const auto out = test::temp_path("musique") += ".jsonl";
  const auto g = run_cli("workload generate --corpus " + corpus.string() + " --questions " +
                         questions.string() + " --pattern dataset --top-k 5 --out " + out.string());
  ASSERT_EQ(g.code, 0) << g.out;
  const auto s = run_cli("workload stats --json --requests " + out.string());
  ASSERT_EQ(s.code, 0) << s.out;
  const auto rep = nlohmann::json::parse(s.out);
  EXPECT_EQ(rep["requests"], 100);
  EXPECT_EQ(rep["item_uses"], 500);
  // --shuffle-chunks: the same chunks per question, in another order for some.
  const auto shuffled = test::temp_path("musique-shuffled") += ".jsonl";
  ASSERT_EQ(run_cli("workload generate --corpus " + corpus.string() + " --questions " + questions.string() +
                    " --pattern dataset --top-k 5 --shuffle-chunks --seed 3 --out " + shuffled.string())
                .code,
            0);
  std::ifstream a(out), b(shuffled);
  int reordered = 0, lines = 0;
  for (std::string x, y; std::getline(a, x) && std::getline(b, y); ++lines) {
    const auto jx = nlohmann::json::parse(x), jy = nlohmann::json::parse(y);
    std::vector<std::string> ix, iy;
    for (const auto& d : jx["documents"]) ix.push_back(d["id"]);
    for (const auto& d : jy["documents"]) iy.push_back(d["id"]);
    reordered += ix != iy;
    std::sort(ix.begin(), ix.end());
    std::sort(iy.begin(), iy.end());
    EXPECT_EQ(ix, iy) << "line " << lines;
  }
  EXPECT_EQ(lines, 100);
  EXPECT_GT(reordered, 80);
  std::filesystem::remove(out);
  std::filesystem::remove(shuffled);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

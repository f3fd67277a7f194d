// `depcache retrieve` as a user runs it: output, help and exit codes.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using CliResult = test::CliRun;
CliResult retrieve(const std::string& args) { return test::run_cli("retrieve " + args); }

class RetrieveCli : public ::testing::Test {
 protected:
  void SetUp() override {
    corpus_ = test::temp_path("retrieve-corpus") += ".jsonl";
    std::ofstream(corpus_)
        << R"({"id": "v", "title": "Volcano", "text": "Mount Etna is an active volcano in Sicily."}
{"id": "g", "title": "Glacier", "text": "The Aletsch Glacier is the largest glacier in the Alps."}
{"id": "d", "title": "Desert", "text": "The Atacama is a very dry desert plateau in South America."}
)";
    qa_ = test::temp_path("retrieve-qa") += ".json";
    std::ofstream(qa_)
        << R"([{"_id": "q1", "question": "Where is the Atacama desert?", "answer": "South America",
                               "supporting_facts": [["Desert", 0]]},
                              {"_id": "q2", "question": "Which volcano is in Sicily?", "answer": "Etna",
                               "supporting_facts": [["Volcano", 0], ["Glacier", 0]]}])";
  }
  void TearDown() override {
    std::filesystem::remove(corpus_);
    std::filesystem::remove(qa_);
  }
  std::filesystem::path corpus_, qa_;
};

TEST_F(RetrieveCli, Help) {
  const CliResult r = retrieve("--help");
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* opt : {"--corpus", "--question", "--questions", "--top-k", "--chunk-tokens", "--overlap",
                          "--vocab", "--staged", "--stage-order", "--json", "--limit", "--format"})
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
}

TEST_F(RetrieveCli, RanksTheMatchingDocumentFirst) {
  const CliResult r =
      retrieve("--corpus " + corpus_.string() + " --question 'Which glacier is the largest?' --top-k 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("3 docs"), std::string::npos) << r.out;
  const size_t first = r.out.find(" 1. ");
  ASSERT_NE(first, std::string::npos) << r.out;
  const std::string top_line = r.out.substr(first, r.out.find('\n', first) - first);
  EXPECT_NE(top_line.find("Glacier [chunk 0]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("search:"), std::string::npos);
}

TEST_F(RetrieveCli, JsonAndStages) {
  const CliResult r = retrieve("--corpus " + corpus_.string() +
                               " --question 'dry desert plateau' --json --staged 3 --chunk-tokens 16 "
                               "--overlap 4");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["corpus"]["docs"], 3);
  EXPECT_EQ(j["corpus"]["format"], "jsonl");
  const auto& q = j["queries"].at(0);
  EXPECT_EQ(q["results"].at(0)["title"], "Desert");
  EXPECT_EQ(q["results"].at(0)["doc_id"], "d");
  ASSERT_EQ(q["stages"].size(), 3u);
  EXPECT_EQ(q["stages"].back()["top"], q["results"]) << "the last stage is the final ranking";
  // By terms: three distinct query terms, one stage each, over every chunk.
  const CliResult t = retrieve("--corpus " + corpus_.string() +
                               " --question 'dry desert plateau' --json --staged 5 --stage-order terms");
  ASSERT_EQ(t.code, 0) << t.out;
  const nlohmann::json tj = nlohmann::json::parse(t.out);
  const auto& tq = tj["queries"].at(0);
  ASSERT_EQ(tq["stages"].size(), 3u);
  EXPECT_EQ(tq["stages"].at(0)["n_terms"], 1);
  EXPECT_EQ(tq["stages"].back()["top"], tq["results"]);
  EXPECT_EQ(tq["settled_stage"], 1) << "any one of the three terms finds the desert";
}

// With --staged over a QA file: how early the top-k settles, as a share.
TEST_F(RetrieveCli, StagedSearchReportsWhenTheTopKSettles) {
  const CliResult r = retrieve("--corpus " + corpus_.string() + " --questions " + qa_.string() +
                               " --top-k 1 --staged 3 --stage-order documents --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const auto& staged = j["summary"]["staged"];
  EXPECT_EQ(staged["order"], "documents");
  // q1 (the desert, the third chunk) settles at stage 3 of 3, q2 (the volcano, the first) at stage 1.
  EXPECT_EQ(j["queries"].at(0)["settled_stage"], 3);
  EXPECT_EQ(j["queries"].at(1)["settled_stage"], 1);
  EXPECT_DOUBLE_EQ(staged["settled_before_last"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(staged["mean_settled_fraction"].get<double>(), (1.0 + 1.0 / 3) / 2);
  EXPECT_EQ(retrieve("--corpus " + corpus_.string() + " --question x --staged 2 --stage-order random").code,
            2);
}

TEST_F(RetrieveCli, EvaluatesAQaFile) {
  const CliResult r =
      retrieve("--corpus " + corpus_.string() + " --questions " + qa_.string() + " --top-k 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("p50"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("p99"), std::string::npos) << r.out;
  // q1: 1 of 1 title; q2: 1 of 2 with k = 1.
  EXPECT_NE(r.out.find("recall@1 of supporting titles: 0.750"), std::string::npos) << r.out;
  const CliResult limited =
      retrieve("--corpus " + corpus_.string() + " --questions " + qa_.string() + " --limit 1 --json");
  ASSERT_EQ(limited.code, 0) << limited.out;
  const nlohmann::json j = nlohmann::json::parse(limited.out);
  EXPECT_EQ(j["summary"]["questions"], 1);
  EXPECT_EQ(j["summary"]["recall_at_k"], 1.0);
}

TEST_F(RetrieveCli, ExitCodes) {
  EXPECT_EQ(retrieve("--corpus /nonexistent/corpus.jsonl --question x").code, 4);
  EXPECT_EQ(retrieve("--corpus " + corpus_.string() + " --questions /nonexistent/qa.json").code, 4);
  const auto junk = test::temp_path("junk") += ".jsonl";
  std::ofstream(junk) << "{\"text\": \"fine\"}\nnot json at all\n";
  const CliResult bad = retrieve("--corpus " + junk.string() + " --question x");
  EXPECT_EQ(bad.code, 3) << bad.out;
  EXPECT_NE(bad.out.find(junk.string() + ":2:"), std::string::npos) << bad.out;
  std::filesystem::remove(junk);
  EXPECT_EQ(retrieve("--corpus " + corpus_.string() + " --question x --overlap 256").code, 3)
      << "overlap >= chunk";
  EXPECT_EQ(retrieve("--corpus " + corpus_.string()).code, 2) << "no question";
  EXPECT_EQ(retrieve("--corpus " + corpus_.string() + " --question x --questions " + qa_.string()).code, 2);
  EXPECT_EQ(retrieve("--question x").code, 2) << "no corpus";
  EXPECT_EQ(retrieve("--corpus " + corpus_.string() + " --question x --top-k 0").code, 2);
  EXPECT_EQ(retrieve("--corpus " + corpus_.string() + " --question x --format csv").code, 2);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// The WordNet importer on the real database (skipped without wordnet-base) and
// on tiny hand-written files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "retrieval/wordnet.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

bool has_edge(const KnowledgeGraph& g, const std::string& head, const std::string& relation,
              const std::string& tail) {
  const auto h = g.find_entity(head), t = g.find_entity(tail);
  const auto r = g.find_relation(relation);
  if (!h || !t || !r) return false;
  const auto out = g.out_edges(*h);
  return std::any_of(out.begin(), out.end(),
                     [&](const Edge& e) { return e.relation == *r && e.target == *t; });
}

std::vector<std::string> aliases_of(const KnowledgeGraph& g, const std::string& name) {
  const auto s = g.aliases(*g.find_entity(name));
  return {s.begin(), s.end()};
}

class Wordnet : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kDefaultWordnetDir / "data.noun")) return;
    stats_ = new WordnetImportStats;
    graph_ = new KnowledgeGraph(import_wordnet(kDefaultWordnetDir, stats_));
  }
  static void TearDownTestSuite() {
    delete graph_;
    delete stats_;
    graph_ = nullptr;
    stats_ = nullptr;
  }
  void SetUp() override {
    if (!graph_)
      DEPCACHE_SKIP("WordNet not installed (" + (kDefaultWordnetDir / "data.noun").string() +
                    " missing); apt-get install wordnet-base");
  }
  static KnowledgeGraph* graph_;
  static WordnetImportStats* stats_;
};
KnowledgeGraph* Wordnet::graph_ = nullptr;
WordnetImportStats* Wordnet::stats_ = nullptr;

TEST_F(Wordnet, Counts) {
  const KnowledgeGraph& g = *graph_;
  EXPECT_EQ(stats_->n_synsets, 117659u) << "WordNet 3.0";
  EXPECT_EQ(g.n_entities(), 117659u);
  EXPECT_GT(g.n_triples(), 200000u);
  EXPECT_EQ(stats_->n_triples, g.n_triples());
  EXPECT_EQ(stats_->n_relations, g.n_relations());
  EXPECT_GT(stats_->n_lexical_pointers, 0u);
  EXPECT_LT(stats_->n_lexical_pointers, stats_->n_pointers);
  ASSERT_FALSE(stats_->per_relation.empty());
  EXPECT_EQ(stats_->per_relation[0].first, "hypernym");
  size_t sum = 0;
  for (const auto& [name, n] : stats_->per_relation) sum += n;
  EXPECT_EQ(sum, g.n_triples());
  std::printf("[wordnet] %zu synsets, %zu triples, %zu relations, %.3f s\n", stats_->n_synsets, g.n_triples(),
              g.n_relations(), stats_->seconds);
}

TEST_F(Wordnet, Dog) {
  const KnowledgeGraph& g = *graph_;
  ASSERT_TRUE(g.find_entity("dog.n.01").has_value());
  EXPECT_EQ(g.entity_label(*g.find_entity("dog.n.01")), "dog");
  EXPECT_EQ(aliases_of(g, "dog.n.01"), (std::vector<std::string>{"domestic dog", "Canis familiaris"}));
  EXPECT_TRUE(has_edge(g, "dog.n.01", "hypernym", "canine.n.02"));
  EXPECT_TRUE(has_edge(g, "dog.n.01", "hypernym", "domestic_animal.n.01"));
  EXPECT_TRUE(has_edge(g, "canine.n.02", "hyponym", "dog.n.01"));
  EXPECT_TRUE(has_edge(g, "dog.n.01", "member holonym", "pack.n.06"));
  // The reverse direction through in_edges.
  const auto canine = *g.find_entity("canine.n.02");
  const auto hypernym = *g.find_relation("hypernym");
  const auto in = g.in_edges(canine);
  EXPECT_TRUE(std::any_of(in.begin(), in.end(), [&](const Edge& e) {
    return e.relation == hypernym && e.target == *g.find_entity("dog.n.01");
  }));
}

TEST_F(Wordnet, AdjectivesAndInstances) {
  const KnowledgeGraph& g = *graph_;
  EXPECT_TRUE(has_edge(g, "good.a.01", "antonym", "bad.a.01"));
  EXPECT_TRUE(has_edge(g, "bad.a.01", "antonym", "good.a.01"));
  // Markers such as "(p)" and "(ip)" are not part of names, labels or aliases.
  ASSERT_TRUE(g.find_entity("afraid.a.01").has_value());
  EXPECT_EQ(g.entity_label(*g.find_entity("afraid.a.01")), "afraid");
  // A satellite is named with 'a', like its head synset.
  EXPECT_EQ(aliases_of(g, "abounding.a.01"), std::vector<std::string>{"galore"});
  EXPECT_TRUE(has_edge(g, "einstein.n.01", "instance hypernym", "physicist.n.01"));
  EXPECT_EQ(g.entity_label(*g.find_entity("einstein.n.01")), "Einstein");
  EXPECT_EQ(aliases_of(g, "einstein.n.01"), std::vector<std::string>{"Albert Einstein"});
}

// A tiny WordNet in a temporary directory; tests break one line of it.
class WordnetFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_path("wordnet");
    std::filesystem::create_directories(dir_);
    for (const char* pos : {"verb", "adj", "adv"}) {
      write(std::string("data.") + pos, kLicense);
      write(std::string("index.") + pos, kLicense);
    }
    write("index.noun", std::string(kLicense) +
                            "animal n 1 1 ~ 1 0 00000100  \n"
                            "cat n 1 1 @ 1 0 00000200  \n"
                            "true_cat n 1 1 @ 1 0 00000200  \n");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  void write_noun_data(const std::string& cat_line) {
    write("data.noun", std::string(kLicense) +
                           "00000100 03 n 01 animal 0 001 ~ 00000200 n 0000 | a living thing  \n" + cat_line);
  }
  // The InvalidInput message of importing the directory.
  std::string error() {
    try {
      import_wordnet(dir_);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  }
  static constexpr const char* kLicense = "  1 This is a license line.  \n  2 \n";
  std::filesystem::path dir_;
};

TEST_F(WordnetFiles, ImportsAHandWrittenDatabase) {
  write_noun_data("00000200 05 n 02 cat 0 true_cat 0 001 @ 00000100 n 0000 | a feline  \n");
  WordnetImportStats stats;
  const KnowledgeGraph g = import_wordnet(dir_, &stats);
  EXPECT_EQ(stats.n_synsets, 2u);
  EXPECT_EQ(g.n_triples(), 2u);
  EXPECT_TRUE(has_edge(g, "cat.n.01", "hypernym", "animal.n.01"));
  EXPECT_TRUE(has_edge(g, "animal.n.01", "hyponym", "cat.n.01"));
  EXPECT_EQ(aliases_of(g, "cat.n.01"), std::vector<std::string>{"true cat"});
}

TEST_F(WordnetFiles, MalformedLinesNameFileAndLine) {
  const std::string data = (dir_ / "data.noun").string();
  write_noun_data("00000200 05 n 02 cat 0 true_cat 0 001 @ 00000100 n 00 | a feline  \n");
  std::string msg = error();
  EXPECT_NE(msg.find(data + ":4:"), std::string::npos) << msg;
  write_noun_data("00000200 05 n 02 cat 0 true_cat 0 002 @ 00000100 n 0000 | a feline  \n");
  msg = error();
  EXPECT_NE(msg.find(data + ":4:"), std::string::npos) << msg;
  write_noun_data("00000200 05 n 02 cat 0 true_cat 0 001 !! 00000100 n 0000 | a feline  \n");
  msg = error();
  EXPECT_NE(msg.find(data + ":4: unknown pointer symbol '!!'"), std::string::npos) << msg;
  write_noun_data("00000200 05 n 02 cat 0 true_cat 0 001 @ 00000999 n 0000 | a feline  \n");
  msg = error();
  EXPECT_NE(msg.find(data + ":4: pointer '@' to synset 00000999"), std::string::npos) << msg;
  write_noun_data("00000200 05 v 02 cat 0 true_cat 0 001 @ 00000100 n 0000 | a feline  \n");
  EXPECT_NE(error().find(data + ":4:"), std::string::npos);
  write_noun_data("00000200 05 n 01 dog 0 001 @ 00000100 n 0000 | not in the index  \n");
  EXPECT_NE(error().find(data + ":4:"), std::string::npos);
  write_noun_data("00000200 05 n 0x cat 0 | a feline  \n");
  EXPECT_NE(error().find(data + ":4: bad w_cnt"), std::string::npos);
  write_noun_data("00000200 05 n 02 cat 0 true_cat 0 001 @ 00000100 n 0000 a feline  \n");
  EXPECT_NE(error().find(data + ":4: expected '|'"), std::string::npos);

  write_noun_data("00000200 05 n 02 cat 0 true_cat 0 001 @ 00000100 n 0000 | a feline  \n");
  write("index.noun", std::string(kLicense) + "animal n 1 1 ~ 1 0 00000100  \ncat n two\n");
  msg = error();
  EXPECT_NE(msg.find((dir_ / "index.noun").string() + ":4: bad synset_cnt"), std::string::npos) << msg;
}

TEST_F(WordnetFiles, MissingFilesAreNotFound) {
  write_noun_data("00000200 05 n 02 cat 0 true_cat 0 001 @ 00000100 n 0000 | a feline  \n");
  std::filesystem::remove(dir_ / "data.adv");
  try {
    import_wordnet(dir_);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_NE(std::string(e.what()).find("data.adv"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("wordnet-base"), std::string::npos) << e.what();
  }
  try {
    import_wordnet(dir_ / "nonexistent");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_NE(std::string(e.what()).find("apt-get install wordnet-base"), std::string::npos) << e.what();
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// L-hop path enumeration, its limits, the three serializers and path pruning,
// on small hand-made graphs.
#include <gtest/gtest.h>

#include <chrono>
#include <set>

#include "retrieval/knowledge_graph.h"
#include "retrieval/relation_paths.h"
#include "retrieval/text_ranker.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// Alice likes Titanic (a tragedy directed by Cameron); Alice and Bob are
// friends both ways (a cycle); Cameron has a self-loop; Tragedy is a dead end.
KnowledgeGraph movie_graph() {
  KnowledgeGraph kg;
  kg.add_triple("Alice", "like", "Titanic");
  kg.add_triple("Titanic", "type", "Tragedy");
  kg.add_triple("Titanic", "directed by", "Cameron");
  kg.add_triple("Alice", "friend", "Bob");
  kg.add_triple("Bob", "like", "Titanic");
  kg.add_triple("Bob", "friend", "Alice");
  kg.add_triple("Cameron", "self", "Cameron");
  kg.finalize();
  return kg;
}

std::vector<std::string> texts(const KnowledgeGraph& kg, const PathSet& set) {
  std::vector<std::string> out;
  for (const RelationPath& p : set.paths) out.push_back(path_text(kg, p));
  return out;
}

EntityId id(const KnowledgeGraph& kg, const char* name) { return kg.find_entity(name).value(); }

TEST(RelationPaths, TwoHopMaximalSimplePaths) {
  const KnowledgeGraph kg = movie_graph();
  PathLimits limits;
  limits.hops = 2;
  const PathSet set = enumerate_paths(kg, id(kg, "Alice"), limits);
  EXPECT_FALSE(set.truncated);
  EXPECT_EQ(texts(kg, set), (std::vector<std::string>{"Alice -like-> Titanic -type-> Tragedy",
                                                      "Alice -like-> Titanic -directed by-> Cameron",
                                                      "Alice -friend-> Bob -like-> Titanic"}));
  for (const RelationPath& p : set.paths) EXPECT_EQ(p.root, id(kg, "Alice"));
}

TEST(RelationPaths, DeadEndsCyclesAndSelfLoopsEndAPath) {
  const KnowledgeGraph kg = movie_graph();
  PathLimits limits;
  limits.hops = 3;
  // Tragedy is a dead end after two hops, Cameron's self-loop is not followed,
  // Bob -friend-> Alice would revisit the root.
  EXPECT_EQ(texts(kg, enumerate_paths(kg, id(kg, "Alice"), limits)),
            (std::vector<std::string>{"Alice -like-> Titanic -type-> Tragedy",
                                      "Alice -like-> Titanic -directed by-> Cameron",
                                      "Alice -friend-> Bob -like-> Titanic -type-> Tragedy",
                                      "Alice -friend-> Bob -like-> Titanic -directed by-> Cameron"}));
  EXPECT_TRUE(enumerate_paths(kg, id(kg, "Cameron"), limits).paths.empty());
  EXPECT_TRUE(enumerate_paths(kg, id(kg, "Tragedy"), limits).paths.empty());
}

TEST(RelationPaths, InverseEdges) {
  const KnowledgeGraph kg = movie_graph();
  PathLimits limits;
  limits.hops = 2;
  limits.follow_inverse = true;
  const auto t = texts(kg, enumerate_paths(kg, id(kg, "Tragedy"), limits));
  EXPECT_NE(std::find(t.begin(), t.end(), "Tragedy <-type- Titanic <-like- Alice"), t.end());
  EXPECT_NE(std::find(t.begin(), t.end(), "Tragedy <-type- Titanic -directed by-> Cameron"), t.end());
}

TEST(RelationPaths, BadArguments) {
  const KnowledgeGraph kg = movie_graph();
  PathLimits limits;
  EXPECT_THROW(enumerate_paths(kg, 1000, limits), Error);
  limits.hops = 0;
  EXPECT_THROW(enumerate_paths(kg, 0, limits), Error);
  limits.hops = 2;
  limits.max_paths = 0;
  EXPECT_TRUE(enumerate_paths(kg, 0, limits).paths.empty());
}

TEST(RelationPaths, BudgetIsSharedAcrossFirstHops) {
  KnowledgeGraph kg;
  for (int i = 0; i < 10; ++i) {
    kg.add_triple("hub", "r", fmt::format("c{}", i));
    for (int j = 0; j < 10; ++j) kg.add_triple(fmt::format("c{}", i), "s", fmt::format("g{}_{}", i, j));
  }
  kg.finalize();
  PathLimits limits;
  limits.max_paths = 20;
  const PathSet set = enumerate_paths(kg, id(kg, "hub"), limits);
  EXPECT_EQ(set.paths.size(), 20u);
  EXPECT_TRUE(set.truncated);
  std::set<EntityId> first_hops;
  for (const RelationPath& p : set.paths) first_hops.insert(p.steps.front().target);
  EXPECT_EQ(first_hops.size(), 10u);
}

// Fewer paths than first-hop branches: the kept paths are spread over the
// (relation-sorted) branches rather than taken from the first relation only.
TEST(RelationPaths, SmallBudgetSpansAllRelations) {
  KnowledgeGraph kg;
  for (const char* rel : {"a", "b", "c", "d"})
    for (int i = 0; i < 8; ++i) kg.add_triple("root", rel, fmt::format("{}{}", rel, i));
  kg.finalize();
  PathLimits limits;
  limits.hops = 1;
  limits.max_paths = 4;
  const PathSet set = enumerate_paths(kg, id(kg, "root"), limits);
  ASSERT_EQ(set.paths.size(), 4u);
  EXPECT_TRUE(set.truncated);
  std::set<std::string> relations;
  for (const RelationPath& p : set.paths)
    relations.insert(std::string(kg.relation_name(p.steps[0].relation)));
  EXPECT_EQ(relations, (std::set<std::string>{"a", "b", "c", "d"}));
}

TEST(RelationPaths, HopsAreCapped) {
  const KnowledgeGraph kg = movie_graph();
  PathLimits limits;
  limits.hops = kMaxPathHops + 1;
  EXPECT_THROW(enumerate_paths(kg, id(kg, "Alice"), limits), Error);
  limits.hops = kMaxPathHops;
  limits.max_fanout = SIZE_MAX;  // must not overflow the per-visit cap
  EXPECT_FALSE(enumerate_paths(kg, id(kg, "Alice"), limits).paths.empty());
}

TEST(RelationPaths, HugeFanOutStaysBounded) {
  KnowledgeGraph kg;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    kg.add_triple("hub", "r", fmt::format("leaf{}", i));
    kg.add_triple(fmt::format("leaf{}", i), "back", "hub");  // every leaf points back to the hub
  }
  kg.finalize();
  PathLimits limits;
  limits.hops = 3;
  limits.max_fanout = 32;
  limits.max_paths = 500;
  limits.follow_inverse = true;
  const auto t0 = std::chrono::steady_clock::now();
  const PathSet set = enumerate_paths(kg, id(kg, "hub"), limits);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LE(set.paths.size(), 500u);
  EXPECT_GT(set.paths.size(), 0u);
  EXPECT_TRUE(set.truncated);
  std::printf("hub with %d edges each way: %zu paths in %.2f ms\n", n, set.paths.size(), ms);
}

TEST(Serializers, PathTripletAndCsvForms) {
  const KnowledgeGraph kg = movie_graph();
  PathLimits limits;
  const PathSet set = enumerate_paths(kg, id(kg, "Alice"), limits);
  EXPECT_EQ(triplet_text(kg, set.paths),
            "(Alice, like, Titanic)\n(Titanic, type, Tragedy)\n(Titanic, directed by, Cameron)\n"
            "(Alice, friend, Bob)\n(Bob, like, Titanic)\n");
  EXPECT_EQ(graph_csv_text(kg, set.paths),
            "node_id,node_attr\n0,Alice\n1,Titanic\n2,Tragedy\n3,Cameron\n4,Bob\n\n"
            "src,edge_attr,dst\n0,like,1\n1,type,2\n1,directed by,3\n0,friend,4\n4,like,1\n");
  KnowledgeGraph odd;
  odd.add_triple("a, b", "say \"hi\"", "c");
  odd.finalize();
  EXPECT_EQ(graph_csv_text(odd, enumerate_paths(odd, 0, limits).paths),
            "node_id,node_attr\n0,\"a, b\"\n1,c\n\nsrc,edge_attr,dst\n0,\"say \"\"hi\"\"\",1\n");
}

TEST(PathPruning, EveryScorerPutsTheRelevantPathFirst) {
  const std::vector<std::string> paths = {"Alice -like-> Titanic -type-> Tragedy",
                                          "Alice -like-> Titanic -directed by-> Cameron",
                                          "Alice -friend-> Bob -like-> Titanic"};
  for (const char* name : {"bm25", "tfidf", "hash-embedding"}) {
    const auto scorer = make_text_scorer(name);
    const std::vector<double> s = scorer->score("Who directed the film Alice likes?", paths);
    ASSERT_EQ(s.size(), 3u);
    EXPECT_EQ(top_k_indices(s, 1), (std::vector<size_t>{1})) << name;
    const std::vector<double> friends = scorer->score("Which friend of Alice?", paths);
    EXPECT_EQ(top_k_indices(friends, 1), (std::vector<size_t>{2})) << name;
  }
  EXPECT_THROW(make_text_scorer("nope"), Error);
}

TEST(PathPruning, TopKIsStableAndBounded) {
  const std::vector<double> s = {0.5, 2.0, 0.5, 2.0, 1.0};
  EXPECT_EQ(top_k_indices(s, 3), (std::vector<size_t>{1, 3, 4}));
  EXPECT_EQ(top_k_indices(s, 10), (std::vector<size_t>{1, 3, 4, 0, 2}));
  EXPECT_TRUE(top_k_indices(s, 0).empty());
  // No signal at all: the enumeration order is kept.
  const Bm25Scorer bm25;
  const std::vector<std::string> paths = {"a -r-> b", "c -r-> d"};
  EXPECT_EQ(top_k_indices(bm25.score("", paths), 2), (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(bm25.score("q", std::vector<std::string>{}).empty());
}

TEST(PathPruning, HashingEmbedderIsNormalisedAndDeterministic) {
  const HashingEmbedder emb(64);
  const auto a = emb.embed("Titanic directed by Cameron");
  const auto b = emb.embed("titanic, DIRECTED by cameron!");
  ASSERT_EQ(a.size(), 64u);
  EXPECT_EQ(a, b);
  double norm = 0;
  for (float x : a) norm += static_cast<double>(x) * x;
  EXPECT_NEAR(norm, 1.0, 1e-5);
  for (float x : emb.embed("")) EXPECT_EQ(x, 0.0f);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

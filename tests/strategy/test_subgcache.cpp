// SubGCache's planning: subgraphs read from relation paths, their union and
// its CSV in a fixed order, and a batch clustered into representatives that
// contain each member's subgraph, served cluster by cluster.
#include <gtest/gtest.h>

#include <algorithm>

#include "strategy/subgcache.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

RagRequest graph_query(const std::string& id, std::vector<RequestEntity> entities, double arrival = 0) {
  RagRequest r;
  r.id = id;
  r.question = "What about " + id + "?";
  r.entities = std::move(entities);
  r.arrival_s = arrival;
  return r;
}

TEST(Subgcache, SubgraphsFromRelationPaths) {
  const RagRequest r = graph_query(
      "q",
      {{"dog", "dog", {"dog -hypernym-> canine -part holonym-> pack", "dog <-member meronym- kennel club"}},
       {"cat", "cat", {}}});
  const Subgraph g = request_subgraph(r);
  EXPECT_EQ(g.nodes, (std::vector<std::string>{"canine", "cat", "dog", "kennel club", "pack"}));
  using E = std::tuple<std::string, std::string, std::string>;
  EXPECT_EQ(g.edges, (std::vector<E>{E{"canine", "part holonym", "pack"}, E{"dog", "hypernym", "canine"},
                                     E{"kennel club", "member meronym", "dog"}}));
  EXPECT_EQ(g.csv(),
            "node_id,node_attr\n0,canine\n1,cat\n2,dog\n3,kennel club\n4,pack\n\nsrc,edge_attr,dst\n"
            "0,part holonym,4\n2,hypernym,0\n3,member meronym,2\n");
  // Order-free: the same subgraph read from paths in another order.
  const RagRequest shuffled = graph_query(
      "q",
      {{"cat", "cat", {}},
       {"dog", "dog", {"dog <-member meronym- kennel club", "dog -hypernym-> canine -part holonym-> pack"}}});
  EXPECT_EQ(request_subgraph(shuffled).csv(), g.csv());
  const RagRequest with_csv = with_subgraph_csv(r, g);
  EXPECT_TRUE(with_csv.entities.empty());
  EXPECT_EQ(with_csv.text, g.csv());
  EXPECT_EQ(with_csv.question, r.question);
  for (const char* bad : {"dog -hypernym canine", "dog -> canine", " -x-> y"})
    EXPECT_THROW(request_subgraph(graph_query("b", {{"dog", "dog", {bad}}})), Error) << bad;
}

TEST(Subgcache, BatchesAreClusteredIntoRepresentativesThatHoldEveryMember) {
  // Two topics: queries about dogs and queries about ships.
  std::vector<RagRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    const bool dog = i % 2 == 0;
    const std::string e = dog ? "dog" : "ship";
    reqs.push_back(graph_query(
        "q" + std::to_string(i),
        {{e, e, {e + " -is-> thing", e + " -kind-> k" + std::to_string(i % 4), e + " -has-> part"}}},
        0.1 * i));
  }
  SubgcacheOptions o;
  o.clusters = 2;
  o.batch = 6;
  const SubgcachePlan plan = plan_subgcache(reqs, o);
  EXPECT_EQ(plan.n_clusters, 2u);
  EXPECT_EQ(plan.cluster, (std::vector<size_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(plan.order, (std::vector<size_t>{0, 2, 4, 1, 3, 5}));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Subgraph own = request_subgraph(reqs[i]);
    const RagRequest& r = plan.requests[i];
    EXPECT_EQ(r.question, reqs[i].question);
    EXPECT_TRUE(r.entities.empty());
    EXPECT_DOUBLE_EQ(r.arrival_s, 0.5) << "the batch is served once complete";
    for (const std::string& n : own.nodes) EXPECT_NE(r.text.find("," + n + "\n"), std::string::npos) << n;
  }
  EXPECT_EQ(plan.requests[0].text, plan.requests[4].text) << "one representative per cluster";
  EXPECT_NE(plan.requests[0].text, plan.requests[1].text);
  // One cluster per query: every query keeps exactly its own subgraph.
  o.clusters = 6;
  const SubgcachePlan own = plan_subgcache(reqs, o);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(own.requests[i].text, request_subgraph(reqs[i]).csv());
  // Batches of 4: the last batch has 2 queries and its own clusters.
  o.batch = 4;
  o.clusters = 1;
  const SubgcachePlan batched = plan_subgcache(reqs, o);
  EXPECT_EQ(batched.n_clusters, 2u);
  EXPECT_EQ(batched.batch, (std::vector<size_t>{0, 0, 0, 0, 1, 1}));
  o.embedding = SubgraphEmbedding::Text;
  EXPECT_EQ(plan_subgcache(reqs, o).n_clusters, 2u);
  reqs[3].entities.clear();
  EXPECT_THROW(plan_subgcache(reqs, o), Error) << "a query without a subgraph";
}

// The paths form: a cluster's representative is its members' entities, each
// once with every distinct path any member gave it, in the order the members
// first give them; with one cluster per query a query keeps its own context.
TEST(Subgcache, RepresentativesAsRelationPathsHoldEveryMembersPaths) {
  std::vector<RagRequest> reqs = {
      graph_query("a", {{"dog", "dog", {"dog -is-> animal", "dog -has-> tail"}}}),
      graph_query("b", {{"dog", "dog", {"dog -has-> tail", "dog -eats-> meat"}},
                        {"cat", "cat", {"cat -is-> animal"}}}),
      graph_query("c", {{"ship", "ship", {"ship -has-> hull"}}}),
  };
  SubgcacheOptions o;
  o.clusters = 1;
  o.batch = 3;
  o.form = SubgraphForm::Paths;
  const SubgcachePlan plan = plan_subgcache(reqs, o);
  const std::vector<RequestEntity> expected = {
      {"dog", "dog", {"dog -is-> animal", "dog -has-> tail", "dog -eats-> meat"}},
      {"cat", "cat", {"cat -is-> animal"}},
      {"ship", "ship", {"ship -has-> hull"}}};
  for (const RagRequest& r : plan.requests) {
    EXPECT_TRUE(r.text.empty());
    EXPECT_EQ(r.entities, expected) << r.id;
  }
  o.clusters = 3;
  const SubgcachePlan own = plan_subgcache(reqs, o);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(own.requests[i].entities, reqs[i].entities);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

#pragma once
// L-hop relation paths from a root entity, with limits that keep hub
// entities (tens of thousands of edges) bounded in time and memory.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "retrieval/knowledge_graph.h"

namespace depcache {

struct PathStep {
  RelationId relation = 0;
  EntityId target = 0;
  bool inverse = false;  // walked against the edge direction (tail -> head)
};

struct RelationPath {
  EntityId root = 0;
  std::vector<PathStep> steps;
  EntityId leaf() const { return steps.empty() ? root : steps.back().target; }
};

// Paths longer than this are never useful as prompt context, and the walk's
// recursion depth equals the hop count.
inline constexpr int kMaxPathHops = 16;

struct PathLimits {
  int hops = 2;
  size_t max_paths = 2000;      // enumeration stops here (candidates before pruning)
  size_t max_fanout = 256;      // edges followed per entity; more are sampled evenly
  bool follow_inverse = false;  // also walk incoming edges (for KGs stored one-way)
};

struct PathSet {
  std::vector<RelationPath> paths;
  bool truncated = false;  // a limit cut the enumeration short
  size_t n_edges_considered = 0;
};

// Maximal simple paths from root: each stops after `hops` steps or where no
// unvisited neighbour is left; no entity repeats on a path (cycles and
// self-loops end there). When max_paths cuts in, the budget is shared evenly
// across first-hop branches so every neighbour type stays represented.
// Deterministic for a given graph and limits.
PathSet enumerate_paths(const KnowledgeGraph& kg, EntityId root, const PathLimits& limits);

// "Alice -like-> Titanic -type-> Tragedy"; inverse steps read "Titanic <-like- Alice".
std::string path_text(const KnowledgeGraph& kg, const RelationPath& path);

// Each distinct triple on the paths once, in first-seen order.
void for_each_triple(const std::vector<RelationPath>& paths,
                     const std::function<void(EntityId head, RelationId relation, EntityId tail)>& fn);

// Unique triples of the paths, one "(head, relation, tail)" per line, in first-seen order.
std::string triplet_text(const KnowledgeGraph& kg, const std::vector<RelationPath>& paths);

// The same triples as a short document: "The <relation> of <head> is <tail>." each.
std::string fact_sentences(const KnowledgeGraph& kg, const std::vector<RelationPath>& paths);

// A CSV field: quoted (quotes doubled) when it holds a comma, quote or line break.
std::string csv_field(std::string_view s);

// G-Retriever's textual graph (the SubGCache form): "node_id,node_attr" rows,
// a blank line, then "src,edge_attr,dst" rows; node ids local to the subgraph.
std::string graph_csv_text(const KnowledgeGraph& kg, const std::vector<RelationPath>& paths);

}  // namespace depcache

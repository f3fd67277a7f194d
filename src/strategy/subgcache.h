#pragma once
// SubGCache: a batch of GraphRAG queries whose retrieved subgraphs overlap is
// served with one prefill per cluster of similar subgraphs. Each query's
// subgraph (the nodes and edges of its relation paths) is embedded, the
// batch is clustered (agglomerative, retrieval/clustering.h), each
// cluster's representative subgraph is the union of its members' nodes and
// edges, serialized in a fixed order as G-Retriever's CSV, and every query
// of the cluster is asked after it: the representative's KV is computed
// once (by the first query) and reused as an exact prefix by the others.
// Answers are approximate by design: a query sees its cluster's union, not
// only its own subgraph.
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "retrieval/clustering.h"
#include "retrieval/rag_request.h"

namespace depcache {

// The name requests give SubGCache. It is not one of the engine's strategies
// but a batch mode over prefix: `run` clusters a stream's batches, `serve`
// batches requests as they arrive.
inline constexpr std::string_view kSubgcache = "subgcache";
// What a request may name: the engine's strategies, then subgcache.
std::vector<std::string> request_strategy_names();
// The engine strategy a requested one runs under: SubGCache's queries
// (rewritten to their cluster's representative subgraph, or a plain request
// on a server whose default is subgcache) run under prefix, the subgraph
// being the prefix a cluster shares; any other is itself.
inline std::string_view engine_strategy(std::string_view requested) {
  return requested == kSubgcache ? std::string_view("prefix") : requested;
}

// A subgraph as labels: what a request's relation paths mention.
struct Subgraph {
  std::vector<std::string> nodes;  // sorted, distinct
  std::vector<std::tuple<std::string, std::string, std::string>>
      edges;  // (head, relation, tail), sorted, distinct

  // G-Retriever's textual graph: "node_id,node_attr" rows, a blank line,
  // then "src,edge_attr,dst" rows, in the sorted order above (the same
  // subgraph always gives the same text, whatever order it was read in).
  std::string csv() const;
};

// The nodes and edges of a request's entities and relation paths
// ("A -rel-> B <-rel2- C": edges (A, rel, B) and (C, rel2, B)). InvalidInput
// for a path that does not parse.
Subgraph request_subgraph(const RagRequest& request);
Subgraph subgraph_union(const std::vector<const Subgraph*>& parts);

// The same request with its subgraph as CSV plain context in place of the
// relation paths: the per-query prompt SubGCache is compared with.
RagRequest with_subgraph_csv(const RagRequest& request, const Subgraph& subgraph);

enum class SubgraphEmbedding {
  Ids,   // a bag of the batch's node and edge ids (1 where present)
  Text,  // the hashing text embedder of the subgraph's CSV (retrieval/text_ranker.h)
};

// How a cluster's representative subgraph is shown: G-Retriever's CSV (the
// paper's form), or the union of its members' relation paths, one tree per
// entity in name order (for a model trained on relation paths).
enum class SubgraphForm { Csv, Paths };

struct SubgcacheOptions {
  size_t clusters = 10;  // per batch
  SubgraphForm form = SubgraphForm::Csv;
  Linkage linkage = Linkage::Ward;
  SubgraphEmbedding embedding = SubgraphEmbedding::Ids;
  size_t batch = 100;  // queries clustered together (consecutive in arrival order)
};

struct SubgcachePlan {
  // Per request (the input's order): the query with its cluster's
  // representative subgraph as context, arriving when its batch is complete
  // (the batch must be known before it is clustered); its batch and cluster.
  std::vector<RagRequest> requests;
  std::vector<size_t> batch, cluster;
  // The order to serve them in: batch by batch, cluster by cluster.
  std::vector<size_t> order;
  size_t n_clusters = 0;     // over all batches
  double clustering_ms = 0;  // embedding and clustering, all batches
};

SubgcachePlan plan_subgcache(const std::vector<RagRequest>& requests, const SubgcacheOptions& options);

}  // namespace depcache

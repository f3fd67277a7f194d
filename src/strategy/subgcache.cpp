#include "strategy/subgcache.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "retrieval/relation_paths.h"
#include "retrieval/text_ranker.h"
#include "strategy/strategy.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache {
namespace {

template <typename T>
void sort_unique(std::vector<T>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// Walks "A -rel-> B <-rel2- C", calling edge(head, relation, tail) per step
// and node(label) per entity.
template <typename Node, typename Edge>
void parse_path(std::string_view path, const Node& node, const Edge& edge) {
  const auto bad = [&] { fail(ErrorKind::InvalidInput, "relation path '{}' does not parse", path); };
  size_t at = 0;
  std::string from;
  bool inverse = false;
  std::string relation;
  while (true) {
    // The next step marker after the current label.
    const size_t fwd = path.find(" -", at), inv = path.find(" <-", at);
    const size_t mark = std::min(fwd, inv);
    const std::string label(
        path.substr(at, mark == std::string_view::npos ? std::string_view::npos : mark - at));
    if (label.empty()) bad();
    node(label);
    if (!from.empty()) {
      if (inverse)
        edge(label, relation, from);
      else
        edge(from, relation, label);
    }
    if (mark == std::string_view::npos) return;
    inverse = mark == inv;
    const size_t rel_begin = mark + (inverse ? 3 : 2);
    const std::string_view close = inverse ? "- " : "-> ";
    const size_t rel_end = path.find(close, rel_begin);
    if (rel_end == std::string_view::npos || rel_end == rel_begin) bad();
    relation = std::string(path.substr(rel_begin, rel_end - rel_begin));
    from = label;
    at = rel_end + close.size();
  }
}

}  // namespace

std::string Subgraph::csv() const {
  std::map<std::string_view, size_t> id;
  std::string s = "node_id,node_attr\n";
  for (size_t i = 0; i < nodes.size(); ++i) {
    id.emplace(nodes[i], i);
    s += fmt::format("{},{}\n", i, csv_field(nodes[i]));
  }
  s += "\nsrc,edge_attr,dst\n";
  // Edges in node-id order (the labels sort the same way), relation next.
  for (const auto& [head, relation, tail] : edges)
    s += fmt::format("{},{},{}\n", id.at(head), csv_field(relation), id.at(tail));
  return s;
}

Subgraph request_subgraph(const RagRequest& request) {
  Subgraph g;
  for (const RequestEntity& e : request.entities) {
    g.nodes.push_back(e.label.empty() ? e.name : e.label);
    for (const std::string& p : e.paths)
      parse_path(
          p, [&](const std::string& label) { g.nodes.push_back(label); },
          [&](const std::string& h, const std::string& r, const std::string& t) {
            g.edges.emplace_back(h, r, t);
          });
  }
  sort_unique(g.nodes);
  sort_unique(g.edges);
  return g;
}

Subgraph subgraph_union(const std::vector<const Subgraph*>& parts) {
  Subgraph u;
  for (const Subgraph* p : parts) {
    u.nodes.insert(u.nodes.end(), p->nodes.begin(), p->nodes.end());
    u.edges.insert(u.edges.end(), p->edges.begin(), p->edges.end());
  }
  sort_unique(u.nodes);
  sort_unique(u.edges);
  return u;
}

RagRequest with_subgraph_csv(const RagRequest& request, const Subgraph& subgraph) {
  RagRequest r = request;
  r.entities.clear();
  r.documents.clear();
  r.text = subgraph.csv();
  return r;
}

namespace {

std::vector<std::vector<float>> embed(const std::vector<Subgraph>& graphs, SubgraphEmbedding how) {
  std::vector<std::vector<float>> out;
  if (how == SubgraphEmbedding::Text) {
    const HashingEmbedder embedder;
    for (const Subgraph& g : graphs) out.push_back(embedder.embed(g.csv()));
    return out;
  }
  // A dimension per distinct node and edge of the batch.
  std::map<std::string, size_t> node_dim;
  std::map<std::tuple<std::string, std::string, std::string>, size_t> edge_dim;
  for (const Subgraph& g : graphs) {
    for (const auto& n : g.nodes) node_dim.emplace(n, node_dim.size());
    for (const auto& e : g.edges) edge_dim.emplace(e, edge_dim.size());
  }
  for (const Subgraph& g : graphs) {
    std::vector<float> v(node_dim.size() + edge_dim.size(), 0.0f);
    for (const auto& n : g.nodes) v[node_dim.at(n)] = 1.0f;
    for (const auto& e : g.edges) v[node_dim.size() + edge_dim.at(e)] = 1.0f;
    out.push_back(std::move(v));
  }
  return out;
}

// The entities of several requests, each once (by name) with every distinct
// path any of them gave it, in the order the requests first give them (a
// cluster of one query keeps its own context as it was).
std::vector<RequestEntity> entity_union(const std::vector<const RagRequest*>& requests) {
  std::vector<RequestEntity> out;
  std::map<std::string, size_t> slot;
  std::set<std::pair<size_t, std::string>> seen;
  for (const RagRequest* r : requests)
    for (const RequestEntity& e : r->entities) {
      const auto [it, fresh] = slot.emplace(e.name, out.size());
      if (fresh) out.push_back({e.name, e.label, {}});
      for (const std::string& p : e.paths)
        if (seen.emplace(it->second, p).second) out[it->second].paths.push_back(p);
    }
  return out;
}

}  // namespace

std::vector<std::string> request_strategy_names() {
  std::vector<std::string> names = strategy_names();
  names.emplace_back(kSubgcache);
  return names;
}

SubgcachePlan plan_subgcache(const std::vector<RagRequest>& requests, const SubgcacheOptions& o) {
  if (o.clusters == 0 || o.batch == 0)
    fail(ErrorKind::InvalidInput, "SubGCache needs at least one cluster and one query per batch");
  SubgcachePlan plan;
  plan.requests.resize(requests.size());
  plan.batch.resize(requests.size());
  plan.cluster.resize(requests.size());
  for (size_t begin = 0; begin < requests.size(); begin += o.batch) {
    const size_t end = std::min(requests.size(), begin + o.batch);
    const auto t0 = Clock::now();
    std::vector<Subgraph> graphs;
    for (size_t i = begin; i < end; ++i) {
      if (requests[i].entities.empty())
        fail(ErrorKind::InvalidInput,
             "request {} has no relation paths: SubGCache clusters GraphRAG subgraphs", requests[i].id);
      graphs.push_back(request_subgraph(requests[i]));
    }
    const std::vector<size_t> label =
        agglomerative_clusters(embed(graphs, o.embedding), o.clusters, o.linkage);
    const size_t n_clusters = label.empty() ? 0 : *std::max_element(label.begin(), label.end()) + 1;
    std::vector<std::vector<const Subgraph*>> members(n_clusters);
    std::vector<std::vector<const RagRequest*>> member_requests(n_clusters);
    for (size_t k = 0; k < graphs.size(); ++k) {
      members[label[k]].push_back(&graphs[k]);
      member_requests[label[k]].push_back(&requests[begin + k]);
    }
    std::vector<RagRequest> representative(n_clusters);
    for (size_t c = 0; c < n_clusters; ++c) {
      if (o.form == SubgraphForm::Csv)
        representative[c].text = subgraph_union(members[c]).csv();
      else
        representative[c].entities = entity_union(member_requests[c]);
    }
    plan.clustering_ms += ms_since(t0);
    double arrival = 0;
    for (size_t i = begin; i < end; ++i) arrival = std::max(arrival, requests[i].arrival_s);
    for (size_t c = 0; c < n_clusters; ++c)
      for (size_t i = begin; i < end; ++i)
        if (label[i - begin] == c) plan.order.push_back(i);
    for (size_t i = begin; i < end; ++i) {
      RagRequest r = requests[i];
      r.documents.clear();
      r.text = representative[label[i - begin]].text;
      r.entities = representative[label[i - begin]].entities;
      r.arrival_s = arrival;
      plan.requests[i] = std::move(r);
      plan.batch[i] = begin / o.batch;
      plan.cluster[i] = plan.n_clusters + label[i - begin];
    }
    plan.n_clusters += n_clusters;
  }
  return plan;
}

}  // namespace depcache

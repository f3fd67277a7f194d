#include "retrieval/relation_paths.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <unordered_map>

#include "util/error.h"

namespace depcache {
namespace {

struct Walker {
  const KnowledgeGraph& kg;
  const PathLimits& limits;
  PathSet& out;
  std::vector<PathStep> steps;
  std::vector<EntityId> on_path;

  // Neighbours of e not yet on the path, at most max_fanout of them, sampled
  // at an even stride over the (relation, target)-sorted adjacency so every
  // relation keeps a share. Huge lists are sampled before filtering, so a hub
  // costs O(max_fanout) per visit rather than O(degree).
  std::vector<PathStep> neighbours(EntityId e) {
    std::vector<PathStep> found;
    const size_t cap =
        limits.max_fanout > SIZE_MAX - on_path.size() ? SIZE_MAX : limits.max_fanout + on_path.size();
    const auto take = [&](std::span<const Edge> edges, bool inverse) {
      out.n_edges_considered += edges.size();
      const bool sample = edges.size() > cap;
      out.truncated = out.truncated || sample;
      const size_t n = sample ? cap : edges.size();
      for (size_t i = 0; i < n; ++i) {
        const Edge& edge = edges[sample ? i * edges.size() / cap : i];
        if (std::find(on_path.begin(), on_path.end(), edge.target) != on_path.end()) continue;
        found.push_back({edge.relation, edge.target, inverse});
      }
    };
    take(kg.out_edges(e), false);
    if (limits.follow_inverse) take(kg.in_edges(e), true);
    if (found.size() <= limits.max_fanout) return found;
    out.truncated = true;
    std::vector<PathStep> picked;
    picked.reserve(limits.max_fanout);
    for (size_t i = 0; i < limits.max_fanout; ++i)
      picked.push_back(found[i * found.size() / limits.max_fanout]);
    return picked;
  }

  // Emits up to `budget` paths below the current prefix; returns how many.
  size_t walk(EntityId at, size_t budget) {
    if (static_cast<int>(steps.size()) == limits.hops) return emit();
    std::vector<PathStep> next = neighbours(at);
    if (next.empty()) return steps.empty() ? 0 : emit();
    if (budget < next.size()) {
      // Fewer paths than branches: visit an even stride of branches first so
      // the kept paths span all relations, not just the first in sort order.
      std::vector<PathStep> strided;
      std::vector<bool> taken(next.size(), false);
      for (size_t j = 0; j < budget; ++j) {
        const size_t k = j * next.size() / budget;
        strided.push_back(next[k]);
        taken[k] = true;
      }
      for (size_t k = 0; k < next.size(); ++k)
        if (!taken[k]) strided.push_back(next[k]);
      next = std::move(strided);
    }
    size_t used = 0;
    size_t i = 0;
    for (; i < next.size() && used < budget; ++i) {
      // The unspent budget is shared by the remaining branches.
      const size_t share = std::max<size_t>(1, (budget - used) / (next.size() - i));
      steps.push_back(next[i]);
      on_path.push_back(next[i].target);
      used += walk(next[i].target, share);
      steps.pop_back();
      on_path.pop_back();
    }
    if (i < next.size()) out.truncated = true;
    return used;
  }

  size_t emit() {
    out.paths.push_back({on_path.front(), steps});
    return 1;
  }
};

}  // namespace

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(s);
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + '"';
}

PathSet enumerate_paths(const KnowledgeGraph& kg, EntityId root, const PathLimits& limits) {
  if (root >= kg.n_entities())
    fail(ErrorKind::NotFound, "entity id {} is not in the graph ({} entities)", root, kg.n_entities());
  if (limits.hops < 1 || limits.hops > kMaxPathHops)
    fail(ErrorKind::InvalidInput, "hops must be in [1, {}] (got {})", kMaxPathHops, limits.hops);
  PathSet out;
  if (limits.max_paths == 0 || limits.max_fanout == 0) return out;
  Walker w{kg, limits, out, {}, {root}};
  w.walk(root, limits.max_paths);
  return out;
}

std::string path_text(const KnowledgeGraph& kg, const RelationPath& path) {
  std::string s(kg.entity_label(path.root));
  for (const PathStep& step : path.steps) {
    const std::string_view rel = kg.relation_name(step.relation);
    s += step.inverse ? " <-" : " -";
    s += rel;
    s += step.inverse ? "- " : "-> ";
    s += kg.entity_label(step.target);
  }
  return s;
}

void for_each_triple(const std::vector<RelationPath>& paths,
                     const std::function<void(EntityId, RelationId, EntityId)>& fn) {
  std::set<std::tuple<EntityId, RelationId, EntityId>> seen;
  for (const RelationPath& p : paths) {
    EntityId from = p.root;
    for (const PathStep& step : p.steps) {
      const EntityId head = step.inverse ? step.target : from;
      const EntityId tail = step.inverse ? from : step.target;
      if (seen.insert(std::make_tuple(head, step.relation, tail)).second) fn(head, step.relation, tail);
      from = step.target;
    }
  }
}

std::string triplet_text(const KnowledgeGraph& kg, const std::vector<RelationPath>& paths) {
  std::string s;
  for_each_triple(paths, [&](EntityId head, RelationId rel, EntityId tail) {
    s += fmt::format("({}, {}, {})\n", kg.entity_label(head), kg.relation_name(rel), kg.entity_label(tail));
  });
  return s;
}

std::string fact_sentences(const KnowledgeGraph& kg, const std::vector<RelationPath>& paths) {
  std::string s;
  for_each_triple(paths, [&](EntityId head, RelationId rel, EntityId tail) {
    if (!s.empty()) s += ' ';
    s += fmt::format("The {} of {} is {}.", kg.relation_name(rel), kg.entity_label(head),
                     kg.entity_label(tail));
  });
  return s;
}

std::string graph_csv_text(const KnowledgeGraph& kg, const std::vector<RelationPath>& paths) {
  std::unordered_map<EntityId, size_t> local;
  std::vector<EntityId> nodes;
  const auto node_id = [&](EntityId e) {
    auto [it, inserted] = local.try_emplace(e, nodes.size());
    if (inserted) nodes.push_back(e);
    return it->second;
  };
  std::vector<std::tuple<size_t, RelationId, size_t>> edges;
  std::set<std::tuple<size_t, RelationId, size_t>> seen;
  for (const RelationPath& p : paths) {
    EntityId from = p.root;
    node_id(from);
    for (const PathStep& step : p.steps) {
      const size_t a = node_id(step.inverse ? step.target : from);
      const size_t b = node_id(step.inverse ? from : step.target);
      const auto e = std::make_tuple(a, step.relation, b);
      if (seen.insert(e).second) edges.push_back(e);
      from = step.target;
    }
  }
  std::string s = "node_id,node_attr\n";
  for (size_t i = 0; i < nodes.size(); ++i)
    s += fmt::format("{},{}\n", i, csv_field(kg.entity_label(nodes[i])));
  s += "\nsrc,edge_attr,dst\n";
  for (const auto& [a, r, b] : edges) s += fmt::format("{},{},{}\n", a, csv_field(kg.relation_name(r)), b);
  return s;
}

}  // namespace depcache

#pragma once
// Agglomerative hierarchical clustering of points under Euclidean distance,
// the dendrogram cut at a given number of clusters (SubGCache groups a
// batch's subgraph embeddings this way). Merges run bottom-up with the
// Lance-Williams update of the linkage; ties go to the lowest pair of
// cluster indices, so the result is deterministic.
#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

namespace depcache {

enum class Linkage { Ward, Single, Average, Complete, Centroid };
std::optional<Linkage> parse_linkage(std::string_view name);  // ward, single, average, complete, centroid
const char* linkage_name(Linkage l);

// The cluster of each point, 0 .. n_clusters - 1, numbered in the order of
// their first point. n_clusters is clipped to [1, points]. Points must share
// one dimension (InvalidInput otherwise).
std::vector<size_t> agglomerative_clusters(const std::vector<std::vector<float>>& points, size_t n_clusters,
                                           Linkage linkage);

}  // namespace depcache

#include "retrieval/clustering.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/error.h"

namespace depcache {

std::optional<Linkage> parse_linkage(std::string_view name) {
  for (Linkage l : {Linkage::Ward, Linkage::Single, Linkage::Average, Linkage::Complete, Linkage::Centroid})
    if (name == linkage_name(l)) return l;
  return std::nullopt;
}

const char* linkage_name(Linkage l) {
  switch (l) {
    case Linkage::Ward:
      return "ward";
    case Linkage::Single:
      return "single";
    case Linkage::Average:
      return "average";
    case Linkage::Complete:
      return "complete";
    case Linkage::Centroid:
      return "centroid";
  }
  return "?";
}

std::vector<size_t> agglomerative_clusters(const std::vector<std::vector<float>>& points, size_t n_clusters,
                                           Linkage linkage) {
  const size_t n = points.size();
  if (n == 0) return {};
  for (const auto& p : points)
    if (p.size() != points[0].size())
      fail(ErrorKind::InvalidInput, "clustering: points of {} and {} dimensions", points[0].size(), p.size());
  n_clusters = std::clamp<size_t>(n_clusters, 1, n);
  // Ward and centroid update squared distances (their Lance-Williams
  // coefficients are exact there); the others plain Euclidean ones.
  const bool squared = linkage == Linkage::Ward || linkage == Linkage::Centroid;
  std::vector<double> d(n * n, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      double s = 0;
      for (size_t k = 0; k < points[i].size(); ++k) {
        const double diff = static_cast<double>(points[i][k]) - static_cast<double>(points[j][k]);
        s += diff * diff;
      }
      d[i * n + j] = d[j * n + i] = squared ? s : std::sqrt(s);
    }
  // Cluster `c` is represented by its lowest point index while it lives.
  std::vector<size_t> size(n, 1), parent(n);
  std::iota(parent.begin(), parent.end(), size_t{0});
  std::vector<bool> alive(n, true);
  for (size_t live = n; live > n_clusters; --live) {
    size_t a = n, b = n;
    double best = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!alive[i]) continue;
      for (size_t j = i + 1; j < n; ++j)
        if (alive[j] && (a == n || d[i * n + j] < best)) best = d[i * n + j], a = i, b = j;
    }
    // Merge b into a: the distance from the merged cluster to every other k.
    const double na = static_cast<double>(size[a]), nb = static_cast<double>(size[b]);
    for (size_t k = 0; k < n; ++k) {
      if (!alive[k] || k == a || k == b) continue;
      const double dak = d[a * n + k], dbk = d[b * n + k], nk = static_cast<double>(size[k]);
      double v = 0;
      switch (linkage) {
        case Linkage::Single:
          v = std::min(dak, dbk);
          break;
        case Linkage::Complete:
          v = std::max(dak, dbk);
          break;
        case Linkage::Average:
          v = (na * dak + nb * dbk) / (na + nb);
          break;
        case Linkage::Centroid:
          v = (na * dak + nb * dbk) / (na + nb) - na * nb * best / ((na + nb) * (na + nb));
          break;
        case Linkage::Ward:
          v = ((na + nk) * dak + (nb + nk) * dbk - nk * best) / (na + nb + nk);
          break;
      }
      d[a * n + k] = d[k * n + a] = v;
    }
    alive[b] = false;
    size[a] += size[b];
    parent[b] = a;
  }
  // Each point's representative, then clusters numbered by first point.
  const auto find = [&parent](size_t i) {
    while (parent[i] != i) i = parent[i];
    return i;
  };
  std::vector<size_t> label(n, n), out(n);
  size_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t r = find(i);
    if (label[r] == n) label[r] = next++;
    out[i] = label[r];
  }
  return out;
}

}  // namespace depcache

// Agglomerative clustering against the definitions: at every step a naive
// search recomputes each pair's linkage distance from the clusters' members
// (closest pair, farthest pair, mean pair, centroid distance, Ward's SSE
// increase) and merges the closest; the partition must be the same.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "retrieval/clustering.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using Points = std::vector<std::vector<float>>;

double dist2(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t k = 0; k < a.size(); ++k) s += (a[k] - b[k]) * (a[k] - b[k]);
  return s;
}

std::vector<double> as_double(const std::vector<float>& p) { return {p.begin(), p.end()}; }

std::vector<double> centroid(const Points& pts, const std::vector<size_t>& members) {
  std::vector<double> c(pts[0].size(), 0.0);
  for (size_t m : members)
    for (size_t k = 0; k < c.size(); ++k) c[k] += pts[m][k];
  for (double& v : c) v /= static_cast<double>(members.size());
  return c;
}

double linkage_distance(const Points& pts, const std::vector<size_t>& a, const std::vector<size_t>& b,
                        Linkage l) {
  double mn = std::numeric_limits<double>::max(), mx = 0, sum = 0;
  for (size_t i : a)
    for (size_t j : b) {
      const double d = std::sqrt(dist2(as_double(pts[i]), as_double(pts[j])));
      mn = std::min(mn, d);
      mx = std::max(mx, d);
      sum += d;
    }
  const double na = static_cast<double>(a.size()), nb = static_cast<double>(b.size());
  switch (l) {
    case Linkage::Single:
      return mn;
    case Linkage::Complete:
      return mx;
    case Linkage::Average:
      return sum / (na * nb);
    case Linkage::Centroid:
      return dist2(centroid(pts, a), centroid(pts, b));
    case Linkage::Ward:  // the increase of the within-cluster sum of squares
      return na * nb / (na + nb) * dist2(centroid(pts, a), centroid(pts, b));
  }
  return 0;
}

// The same partition, whatever the cluster numbers.
std::vector<size_t> naive_clusters(const Points& pts, size_t k, Linkage l) {
  std::vector<std::vector<size_t>> clusters;
  for (size_t i = 0; i < pts.size(); ++i) clusters.push_back({i});
  while (clusters.size() > k) {
    size_t a = 0, b = 1;
    double best = std::numeric_limits<double>::max();
    for (size_t i = 0; i < clusters.size(); ++i)
      for (size_t j = i + 1; j < clusters.size(); ++j)
        if (const double d = linkage_distance(pts, clusters[i], clusters[j], l); d < best - 1e-9)
          best = d, a = i, b = j;
    clusters[a].insert(clusters[a].end(), clusters[b].begin(), clusters[b].end());
    clusters.erase(clusters.begin() + static_cast<std::ptrdiff_t>(b));
  }
  std::vector<size_t> label(pts.size());
  for (size_t c = 0; c < clusters.size(); ++c)
    for (size_t m : clusters[c]) label[m] = c;
  // Numbered by first point, as the library numbers them.
  std::map<size_t, size_t> renumber;
  for (size_t& v : label) v = renumber.try_emplace(v, renumber.size()).first->second;
  return label;
}

TEST(Clustering, EveryLinkageMatchesItsDefinition) {
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (Linkage l : {Linkage::Ward, Linkage::Single, Linkage::Average, Linkage::Complete, Linkage::Centroid})
    for (int trial = 0; trial < 6; ++trial) {
      Points pts;
      for (int i = 0; i < 14; ++i) {  // blobs around three centres, with noise (ties improbable)
        const float cx = static_cast<float>(i % 3) * 4.0f;
        pts.push_back({cx + noise(rng), noise(rng), 0.5f * noise(rng)});
      }
      for (size_t k : {size_t{1}, size_t{3}, size_t{5}, size_t{14}})
        EXPECT_EQ(agglomerative_clusters(pts, k, l), naive_clusters(pts, k, l))
            << linkage_name(l) << " trial " << trial << " k " << k;
    }
}

TEST(Clustering, SeparatedGroupsAndEdges) {
  const Points pts = {{0, 0}, {10, 10}, {0.1f, 0}, {10, 10.2f}, {0, 0.2f}};
  EXPECT_EQ(agglomerative_clusters(pts, 2, Linkage::Ward), (std::vector<size_t>{0, 1, 0, 1, 0}));
  EXPECT_EQ(agglomerative_clusters(pts, 0, Linkage::Single), std::vector<size_t>(5, 0)) << "clipped to 1";
  EXPECT_EQ(agglomerative_clusters(pts, 9, Linkage::Single), (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(agglomerative_clusters({}, 3, Linkage::Ward).empty());
  EXPECT_THROW(agglomerative_clusters({{0, 1}, {2}}, 1, Linkage::Ward), Error);
  EXPECT_EQ(parse_linkage("average"), Linkage::Average);
  EXPECT_FALSE(parse_linkage("median").has_value());
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

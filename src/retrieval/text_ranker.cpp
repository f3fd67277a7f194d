#include "retrieval/text_ranker.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "retrieval/bm25.h"
#include "retrieval/text.h"
#include "util/error.h"
#include "util/hash.h"

namespace depcache {
namespace {

double cosine(std::span<const float> a, std::span<const float> b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  return (na > 0 && nb > 0) ? dot / std::sqrt(na * nb) : 0.0;
}

}  // namespace

std::vector<double> Bm25Scorer::score(std::string_view query, std::span<const std::string> texts) const {
  Bm25Index index;
  for (const std::string& t : texts) index.add(t);
  index.finalize();
  std::vector<double> scores(texts.size(), 0.0);
  for (const ScoredDoc& d : index.search(query, texts.size())) scores[d.doc] = d.score;
  return scores;
}

std::vector<double> TfIdfScorer::score(std::string_view query, std::span<const std::string> texts) const {
  // Sparse vectors over term ids; idf from the candidates (smoothed so a term
  // in every text still counts a little).
  std::unordered_map<std::string, uint32_t> ids;
  std::vector<std::vector<std::pair<uint32_t, double>>> tf(texts.size());
  std::vector<uint32_t> df;
  const auto count = [&](std::string_view text, bool add_terms) {
    std::unordered_map<uint32_t, double> counts;
    for (const std::string& w : index_terms(text)) {
      auto it = ids.find(w);
      if (it == ids.end()) {
        if (!add_terms) continue;
        it = ids.emplace(w, static_cast<uint32_t>(df.size())).first;
        df.push_back(0);
      }
      counts[it->second] += 1;
    }
    std::vector<std::pair<uint32_t, double>> v(counts.begin(), counts.end());
    std::sort(v.begin(), v.end());
    return v;
  };
  for (size_t i = 0; i < texts.size(); ++i) {
    tf[i] = count(texts[i], true);
    for (const auto& [t, c] : tf[i]) ++df[t];
  }
  const double n = static_cast<double>(texts.size());
  const auto weigh = [&](std::vector<std::pair<uint32_t, double>>& v) {
    double norm = 0;
    for (auto& [t, c] : v) {
      c = (1.0 + std::log(c)) * (std::log((1.0 + n) / (1.0 + df[t])) + 1.0);
      norm += c * c;
    }
    norm = std::sqrt(norm);
    if (norm > 0)
      for (auto& [t, c] : v) c /= norm;
  };
  auto q = count(query, false);
  weigh(q);
  std::vector<double> scores(texts.size(), 0.0);
  for (size_t i = 0; i < texts.size(); ++i) {
    weigh(tf[i]);
    // Merge-join of two sorted sparse vectors.
    size_t a = 0, b = 0;
    double dot = 0;
    while (a < q.size() && b < tf[i].size()) {
      if (q[a].first == tf[i][b].first)
        dot += q[a++].second * tf[i][b++].second;
      else if (q[a].first < tf[i][b].first)
        ++a;
      else
        ++b;
    }
    scores[i] = dot;
  }
  return scores;
}

std::vector<float> HashingEmbedder::embed(std::string_view text) const {
  std::vector<float> v(dim_, 0.0f);
  if (dim_ == 0) return v;
  const std::vector<std::string> words = index_terms(text);
  const auto add = [&](std::string_view feature, float weight) {
    // Bucket and sign from independent hashes (the hashing trick), so a
    // collision is as likely to cancel as to add.
    const uint64_t h = hash_string(feature), sign = hash_string(feature, 1);
    v[h % dim_] += (sign >> 63) ? -weight : weight;
  };
  for (size_t i = 0; i < words.size(); ++i) {
    add(words[i], 1.0f);
    if (i + 1 < words.size()) add(words[i] + ' ' + words[i + 1], 0.5f);
  }
  double norm = 0;
  for (float x : v) norm += static_cast<double>(x) * x;
  if (norm > 0)
    for (float& x : v) x = static_cast<float>(x / std::sqrt(norm));
  return v;
}

std::vector<double> EmbeddingScorer::score(std::string_view query, std::span<const std::string> texts) const {
  const std::vector<float> q = embedder_->embed(query);
  std::vector<double> scores(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<float> t = embedder_->embed(texts[i]);
    if (t.size() != q.size())
      fail(ErrorKind::Internal, "embedder returned {} values, expected {}", t.size(), q.size());
    scores[i] = cosine(q, t);
  }
  return scores;
}

std::unique_ptr<TextScorer> make_text_scorer(std::string_view name) {
  if (name == "bm25") return std::make_unique<Bm25Scorer>();
  if (name == "tfidf") return std::make_unique<TfIdfScorer>();
  if (name == "hash-embedding") return std::make_unique<EmbeddingScorer>(std::make_shared<HashingEmbedder>());
  fail(ErrorKind::InvalidInput, "unknown path scorer '{}' (expected bm25, tfidf or hash-embedding)", name);
}

std::vector<size_t> top_k_indices(std::span<const double> scores, size_t k) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  k = std::min(k, order.size());
  // NaN ranks last (and the order stays a strict weak ordering).
  const auto key = [&](size_t i) { return std::isnan(scores[i]) ? -HUGE_VAL : scores[i]; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) > key(b); });
  order.resize(k);
  return order;
}

}  // namespace depcache

#pragma once
// Relevance of candidate texts (serialized relation paths) to a question, for
// pruning a subgraph to its top-k paths. Lexical scorers (BM25, TF-IDF cosine)
// work out of the box; a dense embedder plugs in through Embedder.
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace depcache {

class TextScorer {
 public:
  virtual ~TextScorer() = default;
  // One score per text, higher is more relevant.
  virtual std::vector<double> score(std::string_view query, std::span<const std::string> texts) const = 0;
};

// BM25 with IDF taken from the candidate texts themselves.
class Bm25Scorer : public TextScorer {
 public:
  std::vector<double> score(std::string_view query, std::span<const std::string> texts) const override;
};

// Cosine between TF-IDF vectors (log-scaled tf, smoothed idf over the candidates).
class TfIdfScorer : public TextScorer {
 public:
  std::vector<double> score(std::string_view query, std::span<const std::string> texts) const override;
};

// Dense text embeddings (e.g. a sentence-embedding model).
class Embedder {
 public:
  virtual ~Embedder() = default;
  virtual size_t dim() const = 0;
  virtual std::vector<float> embed(std::string_view text) const = 0;
};

// A model-free embedder: word unigrams and bigrams hashed into `dim` buckets
// with signs, L2-normalised. Good enough to exercise the dense path.
class HashingEmbedder : public Embedder {
 public:
  explicit HashingEmbedder(size_t dim = 1024) : dim_(dim) {}
  size_t dim() const override { return dim_; }
  std::vector<float> embed(std::string_view text) const override;

 private:
  size_t dim_;
};

// Cosine similarity of embeddings.
class EmbeddingScorer : public TextScorer {
 public:
  explicit EmbeddingScorer(std::shared_ptr<const Embedder> embedder) : embedder_(std::move(embedder)) {}
  std::vector<double> score(std::string_view query, std::span<const std::string> texts) const override;

 private:
  std::shared_ptr<const Embedder> embedder_;
};

// "bm25", "tfidf", "hash-embedding"; anything else is an InvalidInput error.
std::unique_ptr<TextScorer> make_text_scorer(std::string_view name);

// Indices of the k best scores, best first; ties keep the original order, so
// pruning is deterministic and an empty question keeps the first k.
std::vector<size_t> top_k_indices(std::span<const double> scores, size_t k);

}  // namespace depcache

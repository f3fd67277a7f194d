#pragma once
// Okapi BM25 over an in-memory inverted index. Used for chunk retrieval, for
// the entity-linking fallback over entity names and for ranking relation paths.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace depcache {

struct Bm25Params {
  double k1 = 1.2;  // term-frequency saturation
  double b = 0.75;  // document-length normalisation
};

struct ScoredDoc {
  uint32_t doc = 0;  // id returned by Bm25Index::add
  double score = 0;
};

// How a staged search splits its work. Documents: contiguous doc-id ranges,
// like shards searched in turn; an early top-k only knows some documents.
// Terms: the query's terms one group at a time, highest IDF first, over every
// document; the rarest terms weigh most in BM25, so an early top-k is usually
// the final one (the analogue of an IVF search probing its nearest clusters
// first).
enum class StageOrder { Documents, Terms };

// One intermediate result of a staged search: the best k after this stage.
struct SearchStage {
  size_t stage = 0;  // 0-based
  size_t n_stages = 0;
  uint32_t n_scanned = 0;      // Documents: doc ids [0, n_scanned) scanned
  size_t n_terms = 0;          // Terms: the first n_terms query terms (by IDF) applied
  std::vector<ScoredDoc> top;  // best first
};

class Bm25Index {
 public:
  explicit Bm25Index(Bm25Params params = {});

  // Adds a document (terms from index_terms(text)); ids are 0, 1, 2, ...
  uint32_t add(std::string_view text);
  uint32_t add_terms(const std::vector<std::string>& terms);
  // Freezes the index (IDF, average length, sorted postings). add() after it
  // is an error; search() before it finalises implicitly is not allowed either.
  void finalize();

  size_t size() const;

  // Best k documents with score > 0: score descending, ties by lower doc id.
  // A term repeated in the query counts once: questions repeat words for
  // grammar, not for emphasis. Misuse (before finalize) throws depcache::Error.
  std::vector<ScoredDoc> search(std::string_view query, size_t k) const;
  std::vector<ScoredDoc> search_terms(const std::vector<std::string>& query_terms, size_t k) const;

  // The same result as search() (bit-identical scores), computed in n_stages
  // stages split by `order`; after each stage on_stage sees the top-k so far,
  // which is what a speculative prefill can start from. on_stage returning
  // false stops the search early and the partial top-k is returned. n_stages
  // is clamped to [1, documents] or [1, query terms]; an empty index or query
  // still reports one (empty) stage. on_stage may be empty, and may itself
  // search this index.
  std::vector<ScoredDoc> search_staged(std::string_view query, size_t k, size_t n_stages,
                                       const std::function<bool(const SearchStage&)>& on_stage,
                                       StageOrder order = StageOrder::Documents) const;

  // BM25 score of one document for a query (0 when no term matches).
  double score(std::string_view query, uint32_t doc) const;

  bool finalized() const { return finalized_; }
  size_t n_terms() const { return term_ids_.size(); }
  double avg_doc_length() const { return avgdl_; }  // valid after finalize()
  double idf(std::string_view term) const;          // 0 for a term no document has

 private:
  // Lets term lookups take a string_view without building a std::string.
  struct TermHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  void require_finalized(const char* what) const;
  // Query terms resolved to term ids, duplicates and unknown terms dropped,
  // highest IDF first (ties: lower id). Every search adds a document's
  // weights in this order, so their scores are bit-identical.
  std::vector<uint32_t> resolve(const std::vector<std::string>& terms) const;
  std::vector<ScoredDoc> staged_by_terms(const std::vector<uint32_t>& terms, size_t k, size_t n_stages,
                                         const std::function<bool(const SearchStage&)>& on_stage) const;

  Bm25Params params_;
  bool finalized_ = false;
  std::unordered_map<std::string, uint32_t, TermHash, std::equal_to<>> term_ids_;
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> building_;  // per term (doc, tf), until finalize
  std::vector<uint32_t> doc_len_;                                     // indexed terms per doc
  double avgdl_ = 0;
  std::vector<double> idf_;  // per term id
  // Postings in CSR form: term t owns [offsets_[t], offsets_[t + 1]), doc ids
  // ascending. Each posting stores its whole BM25 contribution, so a search is
  // only additions and full and staged searches add the same numbers in the
  // same order (bit-identical scores).
  std::vector<size_t> offsets_;
  std::vector<uint32_t> post_doc_;
  std::vector<double> post_weight_;
};

}  // namespace depcache

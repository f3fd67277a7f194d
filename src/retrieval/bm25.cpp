#include "retrieval/bm25.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "retrieval/text.h"
#include "util/error.h"

namespace depcache {
namespace {

// Total order of results: higher score first, then lower doc id. Both searches
// select by it, so they agree even on ties.
bool better(const ScoredDoc& a, const ScoredDoc& b) {
  return a.score > b.score || (a.score == b.score && a.doc < b.doc);
}

// Per-thread accumulator over doc ids, all zero between uses. A search only
// touches the docs its postings name, so reusing it avoids clearing (or
// allocating) an array as large as the index for every query.
struct Accumulator {
  std::vector<double> score;
  std::vector<uint32_t> touched;

  void prepare(size_t n_docs) {
    if (score.size() < n_docs) score.resize(n_docs, 0.0);
  }
  void add(uint32_t doc, double w) {
    // Weights are > 0, so 0 means "not touched yet".
    if (score[doc] == 0.0) touched.push_back(doc);
    score[doc] += w;
  }
  void clear() {
    for (uint32_t d : touched) score[d] = 0.0;
    touched.clear();
  }
};

Accumulator& thread_accumulator() {
  thread_local Accumulator acc;
  return acc;
}

// Leaves the accumulator clean even if a push_back throws midway.
struct ClearOnExit {
  Accumulator& acc;
  ~ClearOnExit() { acc.clear(); }
};

// The best k seen so far; the heap's front is the worst kept entry.
class TopK {
 public:
  explicit TopK(size_t k) : k_(k) { heap_.reserve(k); }
  void offer(ScoredDoc d) {
    if (k_ == 0) return;
    if (heap_.size() < k_) {
      heap_.push_back(d);
      std::push_heap(heap_.begin(), heap_.end(), better);
    } else if (better(d, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), better);
      heap_.back() = d;
      std::push_heap(heap_.begin(), heap_.end(), better);
    }
  }
  std::vector<ScoredDoc> sorted() const {
    std::vector<ScoredDoc> out = heap_;
    std::sort(out.begin(), out.end(), better);
    return out;
  }

 private:
  size_t k_;
  std::vector<ScoredDoc> heap_;
};

}  // namespace

Bm25Index::Bm25Index(Bm25Params params) : params_(params) {
  if (!(params.k1 >= 0) || !(params.b >= 0 && params.b <= 1))
    fail(ErrorKind::InvalidInput, "BM25 parameters out of range: k1 = {} (>= 0), b = {} (0..1)", params.k1,
         params.b);
}

uint32_t Bm25Index::add(std::string_view text) { return add_terms(index_terms(text)); }

uint32_t Bm25Index::add_terms(const std::vector<std::string>& terms) {
  if (finalized_) fail(ErrorKind::Internal, "Bm25Index::add after finalize()");
  if (doc_len_.size() >= std::numeric_limits<uint32_t>::max())
    fail(ErrorKind::LimitExceeded, "BM25 index is full ({} documents)", doc_len_.size());
  if (terms.size() > std::numeric_limits<uint32_t>::max())
    fail(ErrorKind::LimitExceeded, "document of {} terms is too long to index", terms.size());
  const auto doc = static_cast<uint32_t>(doc_len_.size());

  std::vector<uint32_t> ids;
  ids.reserve(terms.size());
  for (const std::string& t : terms) {
    const auto [it, inserted] = term_ids_.try_emplace(t, static_cast<uint32_t>(term_ids_.size()));
    if (inserted) building_.emplace_back();
    ids.push_back(it->second);
  }
  // Sorting groups equal terms, giving each term's frequency in one pass.
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    building_[ids[i]].emplace_back(doc, static_cast<uint32_t>(j - i));
    i = j;
  }
  doc_len_.push_back(static_cast<uint32_t>(terms.size()));
  return doc;
}

void Bm25Index::finalize() {
  if (finalized_) return;
  const size_t n_docs = doc_len_.size();
  double total_len = 0;
  for (uint32_t len : doc_len_) total_len += len;
  avgdl_ = n_docs > 0 ? total_len / static_cast<double>(n_docs) : 0.0;

  const size_t n_terms = building_.size();
  size_t n_postings = 0;
  for (const auto& p : building_) n_postings += p.size();
  offsets_.assign(n_terms + 1, 0);
  idf_.assign(n_terms, 0.0);
  post_doc_.reserve(n_postings);
  post_weight_.reserve(n_postings);

  const double k1 = params_.k1, b = params_.b, n = static_cast<double>(n_docs);
  for (size_t t = 0; t < n_terms; ++t) {
    const auto& postings = building_[t];  // doc ids ascending: docs were added in order
    const double df = static_cast<double>(postings.size());
    // The "+1" form keeps IDF positive even for a term in every document.
    const double idf = std::log(1.0 + (n - df + 0.5) / (df + 0.5));
    idf_[t] = idf;
    for (const auto& [doc, tf_count] : postings) {
      const double tf = tf_count;
      // A posting exists only if the doc has a term, so avgdl_ > 0 here.
      const double norm = k1 * (1.0 - b + b * doc_len_[doc] / avgdl_);
      post_doc_.push_back(doc);
      post_weight_.push_back(idf * tf * (k1 + 1.0) / (tf + norm));
    }
    offsets_[t + 1] = post_doc_.size();
  }
  building_.clear();
  building_.shrink_to_fit();
  finalized_ = true;
}

size_t Bm25Index::size() const { return doc_len_.size(); }

void Bm25Index::require_finalized(const char* what) const {
  if (!finalized_) fail(ErrorKind::Internal, "Bm25Index::{} before finalize()", what);
}

std::vector<uint32_t> Bm25Index::resolve(const std::vector<std::string>& terms) const {
  std::vector<uint32_t> ids;
  ids.reserve(terms.size());
  for (const std::string& t : terms) {
    const auto it = term_ids_.find(std::string_view(t));
    if (it == term_ids_.end()) continue;
    // Queries are short, so a linear duplicate check beats a set.
    if (std::find(ids.begin(), ids.end(), it->second) == ids.end()) ids.push_back(it->second);
  }
  std::sort(ids.begin(), ids.end(),
            [&](uint32_t a, uint32_t b) { return idf_[a] > idf_[b] || (idf_[a] == idf_[b] && a < b); });
  return ids;
}

double Bm25Index::idf(std::string_view term) const {
  require_finalized("idf");
  const auto it = term_ids_.find(term);
  return it == term_ids_.end() ? 0.0 : idf_[it->second];
}

std::vector<ScoredDoc> Bm25Index::search(std::string_view query, size_t k) const {
  require_finalized("search");
  return search_terms(index_terms(query), k);
}

std::vector<ScoredDoc> Bm25Index::search_terms(const std::vector<std::string>& query_terms, size_t k) const {
  require_finalized("search");
  const std::vector<uint32_t> terms = resolve(query_terms);
  if (k == 0 || terms.empty()) return {};

  // Term at a time: each term's postings are one contiguous sweep.
  Accumulator& acc = thread_accumulator();
  acc.prepare(size());
  ClearOnExit guard{acc};
  for (uint32_t t : terms)
    for (size_t i = offsets_[t]; i < offsets_[t + 1]; ++i) acc.add(post_doc_[i], post_weight_[i]);

  std::vector<ScoredDoc> hits;
  hits.reserve(acc.touched.size());
  for (uint32_t d : acc.touched)
    if (acc.score[d] > 0) hits.push_back({d, acc.score[d]});
  if (hits.size() > k) {
    std::nth_element(hits.begin(), hits.begin() + static_cast<ptrdiff_t>(k), hits.end(), better);
    hits.resize(k);
  }
  std::sort(hits.begin(), hits.end(), better);
  return hits;
}

std::vector<ScoredDoc> Bm25Index::search_staged(std::string_view query, size_t k, size_t n_stages,
                                                const std::function<bool(const SearchStage&)>& on_stage,
                                                StageOrder order) const {
  require_finalized("search_staged");
  const std::vector<uint32_t> terms = resolve(index_terms(query));
  if (order == StageOrder::Terms) return staged_by_terms(terms, k, n_stages, on_stage);
  const size_t n_docs = size();
  // Even an empty index reports one (empty) stage, so callers always see a last stage.
  n_stages = std::clamp<size_t>(n_stages, 1, std::max<size_t>(n_docs, 1));
  // Stage s covers [begin(s), begin(s + 1)); sizes differ by at most one.
  const size_t base = n_docs / n_stages, rem = n_docs % n_stages;
  const auto range_begin = [&](size_t s) { return s * base + std::min(s, rem); };

  // Per-term cursors into the postings: each posting is visited once overall.
  std::vector<size_t> cursor(terms.size());
  for (size_t i = 0; i < terms.size(); ++i) cursor[i] = offsets_[terms[i]];
  TopK top(k);
  Accumulator& acc = thread_accumulator();
  acc.prepare(n_docs);

  SearchStage stage;
  stage.n_stages = n_stages;
  for (size_t s = 0; s < n_stages; ++s) {
    const size_t end = range_begin(s + 1);
    {
      ClearOnExit guard{acc};
      // Same term order as search(), so each doc's sum is bit-identical.
      for (size_t i = 0; i < terms.size(); ++i) {
        const size_t stop = offsets_[terms[i] + 1];
        size_t& c = cursor[i];
        for (; c < stop && post_doc_[c] < end; ++c) acc.add(post_doc_[c], post_weight_[c]);
      }
      for (uint32_t d : acc.touched)
        if (acc.score[d] > 0) top.offer({d, acc.score[d]});
    }
    // The accumulator is clean again, so on_stage may itself search this index.
    stage.stage = s;
    stage.n_scanned = static_cast<uint32_t>(end);
    stage.top = top.sorted();
    if (on_stage && !on_stage(stage)) return std::move(stage.top);
  }
  return top.sorted();
}

std::vector<ScoredDoc> Bm25Index::staged_by_terms(
    const std::vector<uint32_t>& terms, size_t k, size_t n_stages,
    const std::function<bool(const SearchStage&)>& on_stage) const {
  n_stages = std::clamp<size_t>(n_stages, 1, std::max<size_t>(terms.size(), 1));
  // Sums persist over stages, so this search has an accumulator of its own
  // (on_stage may search with the thread's).
  Accumulator acc;
  acc.prepare(size());
  SearchStage stage;
  stage.n_stages = n_stages;
  stage.n_scanned = static_cast<uint32_t>(size());
  for (size_t s = 0; s < n_stages; ++s) {
    // Stage s applies terms [s T / N, (s + 1) T / N): sizes differ by at most one.
    const size_t end = (s + 1) * terms.size() / n_stages;
    for (size_t i = s * terms.size() / n_stages; i < end; ++i)
      for (size_t p = offsets_[terms[i]]; p < offsets_[terms[i] + 1]; ++p)
        acc.add(post_doc_[p], post_weight_[p]);
    TopK top(k);
    for (uint32_t d : acc.touched) top.offer({d, acc.score[d]});
    stage.stage = s;
    stage.n_terms = end;
    stage.top = top.sorted();
    if (on_stage && !on_stage(stage)) break;
  }
  return std::move(stage.top);
}

double Bm25Index::score(std::string_view query, uint32_t doc) const {
  require_finalized("score");
  if (doc >= size())
    fail(ErrorKind::Internal, "Bm25Index::score: doc {} out of range ({} docs)", doc, size());
  double sum = 0;
  for (uint32_t t : resolve(index_terms(query))) {
    const auto first = post_doc_.begin() + static_cast<ptrdiff_t>(offsets_[t]);
    const auto last = post_doc_.begin() + static_cast<ptrdiff_t>(offsets_[t + 1]);
    const auto it = std::lower_bound(first, last, doc);
    if (it != last && *it == doc) sum += post_weight_[static_cast<size_t>(it - post_doc_.begin())];
  }
  return sum;
}

}  // namespace depcache

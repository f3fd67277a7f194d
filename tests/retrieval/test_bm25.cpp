// BM25 scores against hand computation, ranking and ties, and the staged
// search agreeing exactly with the one-shot search.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "retrieval/bm25.h"
#include "retrieval/text.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// d0 = [cat sat mat] (3 terms), d1 = [cat cat dog] (3), d2 = [dog barked loudly today] (4).
Bm25Index three_docs() {
  Bm25Index idx;
  EXPECT_EQ(idx.add("The cat sat on the mat."), 0u);
  EXPECT_EQ(idx.add("Cat, cat and dog"), 1u);
  EXPECT_EQ(idx.add("the dog barked loudly today"), 2u);
  idx.finalize();
  return idx;
}

TEST(Bm25, ScoresMatchHandComputation) {
  const Bm25Index idx = three_docs();
  ASSERT_EQ(idx.size(), 3u);
  EXPECT_DOUBLE_EQ(idx.avg_doc_length(), 10.0 / 3.0);
  // N = 3, df(cat) = df(dog) = 2: idf = ln(1 + (3 - 2 + 0.5) / (2 + 0.5)) = ln 1.6.
  const double idf = std::log(1.6);
  EXPECT_NEAR(idx.idf("cat"), idf, 1e-12);
  EXPECT_NEAR(idx.idf("sat"), std::log(1.0 + 2.5 / 1.5), 1e-12);
  EXPECT_EQ(idx.idf("unicorn"), 0.0);
  // k1 = 1.2, b = 0.75, avgdl = 10/3. Length norm K = 1.2 * (0.25 + 0.75 * dl / avgdl):
  // dl = 3 -> K = 1.11; dl = 4 -> K = 1.38. Term score = idf * tf * 2.2 / (tf + K).
  const double d0 = idf * 2.2 / (1 + 1.11);
  const double d1 = idf * (2 * 2.2 / (2 + 1.11) + 2.2 / (1 + 1.11));
  const double d2 = idf * 2.2 / (1 + 1.38);
  EXPECT_NEAR(idx.score("cat dog", 0), d0, 1e-9);
  EXPECT_NEAR(idx.score("cat dog", 1), d1, 1e-9);
  EXPECT_NEAR(idx.score("cat dog", 2), d2, 1e-9);

  const std::vector<ScoredDoc> r = idx.search("Which cat? Which dog?", 10);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].doc, 1u);
  EXPECT_EQ(r[1].doc, 0u);
  EXPECT_EQ(r[2].doc, 2u);
  EXPECT_NEAR(r[0].score, d1, 1e-9);
  EXPECT_NEAR(r[1].score, d0, 1e-9);
  EXPECT_NEAR(r[2].score, d2, 1e-9);
  // search and score add the same numbers in the same order.
  for (const ScoredDoc& s : r) EXPECT_EQ(s.score, idx.score("cat dog", s.doc));
}

TEST(Bm25, OnlyMatchingDocsAndAtMostK) {
  const Bm25Index idx = three_docs();
  const auto r = idx.search("mat", 10);
  ASSERT_EQ(r.size(), 1u) << "docs without a query term have score 0 and are left out";
  EXPECT_EQ(r[0].doc, 0u);
  const auto top1 = idx.search("cat dog", 1);
  ASSERT_EQ(top1.size(), 1u);
  EXPECT_EQ(top1[0].doc, 1u);
  EXPECT_TRUE(idx.search("cat dog", 0).empty());
  EXPECT_EQ(idx.score("mat", 1), 0.0);
}

TEST(Bm25, RepeatedQueryTermsCountOnce) {
  const Bm25Index idx = three_docs();
  const auto once = idx.search("cat dog", 3), twice = idx.search("cat cat dog cat", 3);
  ASSERT_EQ(once.size(), twice.size());
  for (size_t i = 0; i < once.size(); ++i) {
    EXPECT_EQ(once[i].doc, twice[i].doc);
    EXPECT_EQ(once[i].score, twice[i].score);
  }
}

TEST(Bm25, TiesGoToTheLowerDocId) {
  Bm25Index idx;
  idx.add("apple pie");
  idx.add("banana bread");
  idx.add("apple pie");
  idx.add("apple pie");
  idx.finalize();
  const auto r = idx.search("apple", 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].doc, 0u);
  EXPECT_EQ(r[1].doc, 2u);
  EXPECT_EQ(r[0].score, r[1].score);
  const auto staged = idx.search_staged("apple", 2, 4, nullptr);
  ASSERT_EQ(staged.size(), 2u);
  EXPECT_EQ(staged[0].doc, 0u);
  EXPECT_EQ(staged[1].doc, 2u);
}

TEST(Bm25, IdfStaysPositiveForATermInEveryDoc) {
  Bm25Index idx;
  idx.add("common rare");
  idx.add("common");
  idx.add("common thing");
  idx.finalize();
  EXPECT_GT(idx.idf("common"), 0.0);
  EXPECT_GT(idx.idf("rare"), idx.idf("common"));
  EXPECT_EQ(idx.search("common", 10).size(), 3u);
}

TEST(Bm25, EmptyIndexAndEmptyQueries) {
  Bm25Index empty;
  empty.finalize();
  EXPECT_TRUE(empty.search("anything", 5).empty());
  size_t n_calls = 0;
  const auto r = empty.search_staged("anything", 5, 8, [&](const SearchStage& s) {
    ++n_calls;
    EXPECT_EQ(s.n_stages, 1u);
    EXPECT_EQ(s.n_scanned, 0u);
    EXPECT_TRUE(s.top.empty());
    return true;
  });
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(n_calls, 1u) << "even an empty index reports its one stage";

  const Bm25Index idx = three_docs();
  EXPECT_TRUE(idx.search("", 5).empty());
  EXPECT_TRUE(idx.search("the of and what", 5).empty()) << "stopwords only";
  EXPECT_TRUE(idx.search("unicorn", 5).empty());
  EXPECT_TRUE(idx.search_staged("", 5, 2, nullptr).empty());

  Bm25Index blank;  // documents without index terms
  blank.add("");
  blank.add("the of");
  blank.finalize();
  EXPECT_EQ(blank.size(), 2u);
  EXPECT_TRUE(blank.search("the", 5).empty());
}

TEST(Bm25, MisuseIsAnError) {
  Bm25Index idx;
  idx.add("cat");
  EXPECT_THROW(idx.search("cat", 1), Error) << "search before finalize";
  idx.finalize();
  EXPECT_THROW(idx.add("dog"), Error) << "add after finalize";
  EXPECT_THROW(idx.score("cat", 7), Error);
  EXPECT_THROW(Bm25Index(Bm25Params{.k1 = -1, .b = 0.75}), Error);
  EXPECT_THROW(Bm25Index(Bm25Params{.k1 = 1.2, .b = 1.5}), Error);
}

TEST(Bm25, StagesSplitDocIdsEvenly) {
  Bm25Index idx;
  for (int i = 0; i < 10; ++i) idx.add("word");
  idx.finalize();
  std::vector<uint32_t> scanned;
  idx.search_staged("word", 3, 3, [&](const SearchStage& s) {
    EXPECT_EQ(s.stage, scanned.size());
    EXPECT_EQ(s.n_stages, 3u);
    scanned.push_back(s.n_scanned);
    return true;
  });
  EXPECT_EQ(scanned, (std::vector<uint32_t>{4, 7, 10}));
}

// A random corpus over a small Zipf-like vocabulary, so terms repeat within
// and across documents and scores tie now and then.
struct RandomCorpus {
  std::vector<std::vector<std::string>> docs;
  std::vector<std::string> words;
};

RandomCorpus random_corpus(size_t n_docs, size_t n_words, uint32_t seed) {
  std::mt19937 rng(seed);
  RandomCorpus c;
  for (size_t w = 0; w < n_words; ++w) c.words.push_back("w" + std::to_string(w));
  std::vector<double> weights;
  for (size_t w = 0; w < n_words; ++w) weights.push_back(1.0 / static_cast<double>(w + 1));
  std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
  std::uniform_int_distribution<size_t> len(0, 25);
  for (size_t d = 0; d < n_docs; ++d) {
    std::vector<std::string> doc;
    for (size_t i = len(rng); i > 0; --i) doc.push_back(c.words[pick(rng)]);
    c.docs.push_back(std::move(doc));
  }
  return c;
}

// Best k of docs [0, limit), given every doc's score computed on its own.
std::vector<ScoredDoc> best_of_prefix(const std::vector<double>& scores, size_t k, size_t limit) {
  std::vector<ScoredDoc> all;
  for (uint32_t d = 0; d < limit; ++d)
    if (scores[d] > 0) all.push_back({d, scores[d]});
  std::stable_sort(all.begin(), all.end(),
                   [](const ScoredDoc& a, const ScoredDoc& b) { return a.score > b.score; });
  if (all.size() > k) all.resize(k);
  return all;
}

std::vector<double> all_scores(const Bm25Index& idx, const std::string& query) {
  std::vector<double> scores;
  for (uint32_t d = 0; d < idx.size(); ++d) scores.push_back(idx.score(query, d));
  return scores;
}

void expect_same(const std::vector<ScoredDoc>& a, const std::vector<ScoredDoc>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].doc, b[i].doc) << what << " rank " << i;
    EXPECT_EQ(a[i].score, b[i].score) << what << " rank " << i;  // bit-identical
  }
}

TEST(Bm25, StagedEqualsFullSearchOnRandomCorpora) {
  std::mt19937 rng(7);
  for (const size_t n_docs : {1u, 2u, 7u, 100u, 1000u}) {
    const RandomCorpus c = random_corpus(n_docs, 40, static_cast<uint32_t>(n_docs));
    Bm25Index idx;
    for (const auto& d : c.docs) idx.add_terms(d);
    idx.finalize();
    for (int q = 0; q < 20; ++q) {
      std::string query;
      for (size_t i = 1 + rng() % 5; i > 0; --i) query += c.words[rng() % c.words.size()] + " ";
      for (const size_t k : {size_t{1}, size_t{3}, size_t{10}, n_docs + 3}) {
        const std::vector<ScoredDoc> full = idx.search(query, k);
        const std::vector<double> scores = all_scores(idx, query);
        const std::string what =
            "n_docs " + std::to_string(n_docs) + " k " + std::to_string(k) + " '" + query + "'";
        expect_same(full, best_of_prefix(scores, k, n_docs), what + " vs brute force");
        for (const size_t n_stages : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{7}, n_docs - 1,
                                      n_docs, n_docs + 5, size_t{1000}}) {
          const size_t n_eff = std::clamp<size_t>(n_stages, 1, n_docs);
          size_t n_seen = 0;
          uint32_t last_scanned = 0;
          const auto staged = idx.search_staged(query, k, n_stages, [&](const SearchStage& s) {
            EXPECT_EQ(s.stage, n_seen);
            EXPECT_EQ(s.n_stages, n_eff);
            EXPECT_GT(s.n_scanned, last_scanned);
            last_scanned = s.n_scanned;
            // Each intermediate top-k is exactly the best k of the prefix scanned so far
            // (checked where that is cheap).
            if (n_docs * n_eff <= 20000)
              expect_same(s.top, best_of_prefix(scores, k, s.n_scanned),
                          what + " stage " + std::to_string(s.stage));
            ++n_seen;
            return true;
          });
          EXPECT_EQ(n_seen, n_eff) << what;
          EXPECT_EQ(last_scanned, n_docs) << what;
          expect_same(staged, full, what + " staged " + std::to_string(n_stages));
        }
      }
    }
  }
}

// Staged by terms: each stage's top-k is the best k by the scores of the
// rarest terms applied so far (checked where the query's IDFs do not tie,
// so that set is unambiguous), and the last stage equals search().
TEST(Bm25, StagedByTermsEqualsFullSearchAndAppliesRarestTermsFirst) {
  std::mt19937 rng(9);
  for (const size_t n_docs : {1u, 5u, 200u, 2000u}) {
    const RandomCorpus c = random_corpus(n_docs, 60, static_cast<uint32_t>(n_docs) + 1);
    Bm25Index idx;
    for (const auto& d : c.docs) idx.add_terms(d);
    idx.finalize();
    for (int q = 0; q < 20; ++q) {
      std::vector<std::string> words;
      for (size_t i = 1 + rng() % 6; i > 0; --i) {
        const std::string& w = c.words[rng() % c.words.size()];
        if (idx.idf(w) > 0 && std::find(words.begin(), words.end(), w) == words.end()) words.push_back(w);
      }
      std::string query;
      for (const auto& w : words) query += w + " ";
      std::vector<std::string> by_idf = words;
      std::stable_sort(by_idf.begin(), by_idf.end(),
                       [&](const auto& a, const auto& b) { return idx.idf(a) > idx.idf(b); });
      bool ties = false;
      for (size_t i = 1; i < by_idf.size(); ++i) ties = ties || idx.idf(by_idf[i]) == idx.idf(by_idf[i - 1]);
      for (const size_t k : {size_t{1}, size_t{4}, n_docs + 2}) {
        const std::vector<ScoredDoc> full = idx.search(query, k);
        for (const size_t n_stages : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{10}}) {
          const size_t n_eff = std::clamp<size_t>(n_stages, 1, std::max<size_t>(words.size(), 1));
          const std::string what = "n_docs " + std::to_string(n_docs) + " '" + query + "' k " +
                                   std::to_string(k) + " stages " + std::to_string(n_stages);
          size_t n_seen = 0, last_terms = 0;
          const auto staged = idx.search_staged(
              query, k, n_stages,
              [&](const SearchStage& s) {
                EXPECT_EQ(s.stage, n_seen) << what;
                EXPECT_EQ(s.n_stages, n_eff) << what;
                EXPECT_GE(s.n_terms, last_terms) << what;
                last_terms = s.n_terms;
                if (!ties) {
                  std::string applied;
                  for (size_t i = 0; i < s.n_terms; ++i) applied += by_idf[i] + " ";
                  expect_same(s.top, best_of_prefix(all_scores(idx, applied), k, n_docs),
                              what + " stage " + std::to_string(s.stage));
                }
                ++n_seen;
                return true;
              },
              StageOrder::Terms);
          EXPECT_EQ(n_seen, n_eff) << what;
          EXPECT_EQ(last_terms, words.size()) << what;
          expect_same(staged, full, what);
        }
      }
    }
  }
}

TEST(Bm25, StagedStopsEarly) {
  const RandomCorpus c = random_corpus(500, 20, 11);
  Bm25Index idx;
  for (const auto& d : c.docs) idx.add_terms(d);
  idx.finalize();
  std::vector<SearchStage> seen;
  const auto r = idx.search_staged("w0 w3 w7", 5, 10, [&](const SearchStage& s) {
    seen.push_back(s);
    return s.stage < 1;  // stop after the second stage
  });
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].n_scanned, 100u);
  expect_same(r, seen[1].top, "early result is the last stage's top-k");
  expect_same(r, best_of_prefix(all_scores(idx, "w0 w3 w7"), 5, 100), "best of the first 100 docs");
}

// A large corpus with Zipfian words (frequent words have long postings):
// the top-10 of every query equals exhaustive scoring. Its speed is measured
// by `bench_kernels --benchmark_filter=bm25`, not here.
TEST(Bm25, TenThousandDocsTopTenEqualsExhaustiveScoring) {
  const RandomCorpus c = random_corpus(10000, 5000, 3);
  Bm25Index idx;
  for (const auto& d : c.docs) idx.add_terms(d);
  idx.finalize();
  std::mt19937 rng(5);
  size_t n_hits = 0;
  for (int q = 0; q < 20; ++q) {
    std::string query;
    for (int i = 0; i < 6; ++i) query += c.words[rng() % (i < 2 ? 10 : c.words.size())] + " ";
    const auto top = idx.search(query, 10);
    n_hits += top.size();
    expect_same(top, best_of_prefix(all_scores(idx, query), 10, c.docs.size()), "query '" + query + "'");
  }
  EXPECT_EQ(n_hits, 200u);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// BM25 search latency over a synthetic corpus of 10,000 documents with
// Zipfian word frequencies (frequent words have the longest postings), six-
// word queries, top 10:
//   build/bench/bench_kernels --benchmark_filter=bm25
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "retrieval/bm25.h"

namespace depcache {
namespace {

void BM_bm25_search(benchmark::State& state) {
  const size_t n_docs = static_cast<size_t>(state.range(0)), n_words = 5000;
  std::mt19937 rng(3);
  std::vector<std::string> words;
  std::vector<double> weights;
  for (size_t w = 0; w < n_words; ++w)
    words.push_back(fmt::format("w{}", w)), weights.push_back(1.0 / static_cast<double>(w + 1));
  std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
  Bm25Index idx;
  for (size_t d = 0; d < n_docs; ++d) {
    std::vector<std::string> doc;
    for (size_t i = rng() % 26; i > 0; --i) doc.push_back(words[pick(rng)]);
    idx.add_terms(doc);
  }
  idx.finalize();
  std::vector<std::string> queries;
  for (int q = 0; q < 200; ++q) {
    std::string query;
    for (int i = 0; i < 6; ++i) query.append(words[rng() % (i < 2 ? 10 : n_words)]).append(" ");
    queries.push_back(query);
  }
  size_t q = 0;
  for (auto _ : state) benchmark::DoNotOptimize(idx.search(queries[q++ % queries.size()], 10));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_bm25_search)->Arg(10000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace depcache

// The range-based attention kernel at the qwen2-0.5b head layout (14 query
// heads, 2 KV heads, head dim 64, f16 KV): a causal prefill of N queries
// whose run ends at row C (so query i sees C - N + i + 1 rows), and one
// decode query seeing C rows. "pairs/s" counts (query head, key) pairs.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "compute/attention.h"
#include "compute/fp16.h"
#include "util/thread_pool.h"

namespace {

using depcache::QueryGroup;

void bench_attention(benchmark::State& st, int64_t n_q, int64_t context, int threads) {
  constexpr int kHeads = 14, kHeadsKv = 2, kDim = 64;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> k(context * kHeadsKv * kDim), v(k.size());
  for (auto& x : k) x = depcache::fp32_to_fp16(normal(rng));
  for (auto& x : v) x = depcache::fp32_to_fp16(normal(rng));
  std::vector<float> q(n_q * kHeads * kDim), out(q.size());
  for (auto& x : q) x = normal(rng);
  const depcache::Visibility vis({QueryGroup{0, n_q, {}, 0, context - n_q}});
  const depcache::KvLayerView kv{k.data(), v.data(), depcache::DType::F16, 2 * kHeadsKv * kDim};
  depcache::ThreadPool pool(threads);
  for (auto _ : st) {
    depcache::attention(q.data(), n_q, {}, vis, kv, kHeads, kHeadsKv, kDim, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  st.counters["pairs/s"] = benchmark::Counter(static_cast<double>(st.iterations()) * vis.n_pairs() * kHeads,
                                              benchmark::Counter::kIsRate);
}

const bool registered = [] {
  for (int threads : {1, 2}) {
    const std::string t = "/threads:" + std::to_string(threads);
    benchmark::RegisterBenchmark(("attention/prefill/queries:512/context:512" + t).c_str(),
                                 [=](benchmark::State& st) { bench_attention(st, 512, 512, threads); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("attention/prefill/queries:512/context:2048" + t).c_str(),
                                 [=](benchmark::State& st) { bench_attention(st, 512, 2048, threads); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("attention/decode/context:2048" + t).c_str(),
                                 [=](benchmark::State& st) { bench_attention(st, 1, 2048, threads); })
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
  return true;
}();

}  // namespace

// The range-based attention kernel at the qwen2-0.5b head layout (14 query
// heads, 2 KV heads, head dim 64, f16 KV): a causal prefill of N queries
// whose run ends at row C (so query i sees C - N + i + 1 rows), and one
// decode query seeing C rows, and a cached request's question: 24 queries
// over a long context, in f16 and q8_0; and a decode step of a model with one
// KV head (multi-query attention), whose keys are all one task's unless
// they are split. "pairs/s" counts (query head, key) pairs.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "compute/attention.h"
#include "compute/kv_format.h"
#include "util/thread_pool.h"

namespace {

using depcache::QueryGroup;

void bench_attention(benchmark::State& st, int64_t n_q, int64_t context, int threads,
                     depcache::DType type = depcache::DType::F16, int kHeadsKv = 2) {
  constexpr int kHeads = 14, kDim = 64;
  const int kRow = kHeadsKv * kDim;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> kf(context * kRow), vf(kf.size());
  for (auto& x : kf) x = normal(rng);
  for (auto& x : vf) x = normal(rng);
  const size_t rb = depcache::kv_row_bytes(type, kRow);
  std::vector<uint8_t> k(context * rb), v(k.size());
  depcache::kv_encode(type, kf.data(), k.data(), context, kRow);
  depcache::kv_encode(type, vf.data(), v.data(), context, kRow);
  std::vector<float> q(n_q * kHeads * kDim), out(q.size());
  for (auto& x : q) x = normal(rng);
  const depcache::Visibility vis({QueryGroup{0, n_q, {}, 0, context - n_q}});
  const depcache::KvLayerView kv{k.data(), v.data(), type, rb};
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
    benchmark::RegisterBenchmark(("attention/decode/context:8192" + t).c_str(),
                                 [=](benchmark::State& st) { bench_attention(st, 1, 8192, threads); })
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(
        ("attention/decode/context:8192/kv_heads:1" + t).c_str(),
        [=](benchmark::State& st) { bench_attention(st, 1, 8192, threads, depcache::DType::F16, 1); })
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
    // A cached request's question: a few queries over a long cached context.
    for (int64_t context : {1024, 8192})
      for (depcache::DType type : {depcache::DType::F16, depcache::DType::Q8_0}) {
        const std::string name = "attention/question/queries:24/context:" + std::to_string(context) + "/" +
                                 depcache::kv_type_name(type) + t;
        benchmark::RegisterBenchmark(
            name.c_str(), [=](benchmark::State& st) { bench_attention(st, 24, context, threads, type); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
  }
  return true;
}();

}  // namespace

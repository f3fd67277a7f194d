// The radix index's eviction: the time to insert a sequence into a full hot
// tier of n nodes, which evicts one victim (the policy's lowest-priority
// evictable leaf):
//   build/bench/bench_kernels --benchmark_filter=index
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kv/policy.h"
#include "kv/radix_index.h"

namespace depcache {
namespace {

constexpr size_t kBytesPerToken = 64;

// Sequences of 8 tokens under 256 shared 4-token stems: a tree of ~n leaves
// and 256 inner nodes.
std::vector<int32_t> sequence(uint32_t i) {
  const auto stem = static_cast<int32_t>(i % 256);
  return {stem, stem + 1, stem + 2, stem + 3, static_cast<int32_t>(i), 7, 7, 7};
}

void BM_index_evict(benchmark::State& state, const char* policy) {
  const auto n = static_cast<uint32_t>(state.range(0));
  // Budget: the stems plus n leaves of 4 tokens; every further insert evicts one leaf.
  RadixIndex index((256 * 4 + static_cast<size_t>(n) * 4) * kBytesPerToken, make_policy(policy));
  for (uint32_t i = 0; i < n; ++i) index.insert_virtual(1, sequence(i), kBytesPerToken);
  std::mt19937 rng(1);
  for (uint32_t i = 0; i < n / 10; ++i) index.match(1, sequence(rng() % n));  // some history
  uint32_t next = n;
  for (auto _ : state) index.insert_virtual(1, sequence(next++), kBytesPerToken);
  state.counters["nodes"] = static_cast<double>(index.n_nodes());
  state.counters["evicted"] = static_cast<double>(index.n_evicted());
}
BENCHMARK_CAPTURE(BM_index_evict, lru, "lru")->Arg(1000)->Arg(100000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_index_evict, lfu, "lfu")->Arg(100000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_index_evict, pgdsf, "pgdsf")->Arg(100000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_index_evict, lacr, "lacr")->Arg(100000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace depcache

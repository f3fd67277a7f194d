// Reading blocks from the remote tier: one Redis (MGET) against a Redis
// Cluster (a pipeline of GETs per master). The servers come from the
// environment, as bench/experiments/redis_cluster.sh starts them:
// DEPCACHE_BENCH_REDIS=host:port, DEPCACHE_BENCH_REDIS_CLUSTER=host:port,...
// Arg: the bytes of each of 64 blocks fetched together.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "kv/redis_cluster_store.h"
#include "kv/remote_store.h"

namespace {

using namespace depcache;

void fetch(benchmark::State& state, RemoteStore& store) {
  const auto bytes = static_cast<size_t>(state.range(0));
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 64; ++i) {
    keys.push_back(0x5eed0000 + i * 7919 + bytes);
    store.put(keys.back(), std::vector<uint8_t>(bytes, static_cast<uint8_t>(i)));
  }
  for (auto _ : state) {
    const auto got = store.get_many(keys);
    for (const auto& g : got)
      if (!g || g->size() != bytes) {
        state.SkipWithError("a block did not come back");
        return;
      }
    benchmark::DoNotOptimize(got.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 64 * static_cast<int64_t>(bytes));
}

RedisOptions options() {
  RedisOptions o;
  o.timeout_ms = 5000;
  o.prefix = "bench:";
  return o;
}

void BM_remote_fetch_single(benchmark::State& state) {
  const char* at = std::getenv("DEPCACHE_BENCH_REDIS");
  if (!at) return state.SkipWithError("set DEPCACHE_BENCH_REDIS=host:port");
  RedisOptions o = parse_redis_address(at);
  o.timeout_ms = options().timeout_ms;
  o.prefix = options().prefix;
  RedisStore store(o);
  fetch(state, store);
}
BENCHMARK(BM_remote_fetch_single)
    ->Arg(16 << 10)
    ->Arg(256 << 10)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_remote_fetch_cluster(benchmark::State& state) {
  const char* seeds = std::getenv("DEPCACHE_BENCH_REDIS_CLUSTER");
  if (!seeds) return state.SkipWithError("set DEPCACHE_BENCH_REDIS_CLUSTER=host:port,...");
  RedisClusterStore store(parse_redis_addresses(seeds), options());
  fetch(state, store);
}
BENCHMARK(BM_remote_fetch_cluster)
    ->Arg(16 << 10)
    ->Arg(256 << 10)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

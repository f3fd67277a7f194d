// What a routing decision costs the router (ReplicaRouter::route: the
// request's lookups keyed, held tokens counted on each replica, the pick),
// without a deployment key and with one (every block key then named with
// HMAC-SHA256, as the replicas name them in their sealed events), and what
// applying one event batch costs (parsing, the seal checked, keys applied):
//   build/bench/bench_kernels --benchmark_filter=router
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <memory>

#include "kv/kv_events.h"
#include "server/replica_router.h"

namespace depcache {
namespace {

std::shared_ptr<const MacKey> key_if(bool keyed) {
  return keyed ? std::make_shared<const MacKey>(std::vector<uint8_t>(32, 0x5a)) : nullptr;
}

// A GraphRAG-sized request: 8 lookups (subtrees, chunks) of 250 tokens.
std::vector<Lookup> request_lookups(int r) {
  std::vector<Lookup> out;
  for (int l = 0; l < 8; ++l) {
    Lookup x{static_cast<uint64_t>(1000 + l + 8 * (r % 50)), {}};
    for (int i = 0; i < 250; ++i) x.tokens.push_back(i * 7 + l);
    out.push_back(std::move(x));
  }
  return out;
}

// Four replicas, each told by its summary that it holds a share of the
// requests' lookups. Arg 1: keyed.
void BM_router_route(benchmark::State& state) {
  const bool keyed = state.range(0) != 0;
  RouterOptions o;
  o.events_key = key_if(keyed);
  std::vector<ReplicaAddress> replicas;
  for (int i = 0; i < 4; ++i) replicas.push_back({fmt::format("r{}", i), "http://127.0.0.1:1"});
  ReplicaRouter router(replicas, o);
  for (int i = 0; i < 4; ++i) {
    KvEventLog log(16, o.events_key);
    for (int r = i; r < 50; r += 4)
      for (const Lookup& l : request_lookups(r)) log.stored(l.ns, l.tokens, 0);
    std::string hashes;
    for (const uint64_t k : log.summary().keys)
      hashes += fmt::format("{}\"{:016x}\"", hashes.empty() ? "" : ",", k);
    const std::string summary = fmt::format(
        R"({{"replica":"r{}","epoch":"e","seq":0,"block_size":16,"block_hashes":[{}]}})", i, hashes);
    std::string why;
    if (!router.apply_summary(replicas[i].name, summary, &why)) state.SkipWithError(why.c_str());
  }
  int r = 0;
  for (auto _ : state) benchmark::DoNotOptimize(router.route(request_lookups(r++ % 50)));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_router_route)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// One batch of a request's worth of stored blocks (8 spans of 250 tokens),
// sealed or not, applied in order. Arg 1: keyed.
void BM_router_apply_events(benchmark::State& state) {
  const bool keyed = state.range(0) != 0;
  RouterOptions o;
  o.events_key = key_if(keyed);
  ReplicaRouter router({{"r0", "http://127.0.0.1:1"}}, o);
  std::string why;
  router.apply_summary("r0", R"({"replica":"r0","epoch":"e","seq":0,"block_size":16,"block_hashes":[]})",
                       &why);
  KvEventLog log(16, o.events_key);
  int64_t seq = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (const Lookup& l : request_lookups(static_cast<int>(seq))) log.stored(l.ns, l.tokens, 0);
    const std::string message =
        seal_kv_events(o.events_key.get(), kv_events_json({"r0", "e", 16}, log.take()));
    ++seq;
    state.ResumeTiming();
    if (router.apply_events(message, &why) != EventOutcome::Applied) state.SkipWithError(why.c_str());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_router_apply_events)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace depcache

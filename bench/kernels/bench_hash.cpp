// Hashing: the XXH3 checksum of a large span record against the byte-at-a-
// time FNV-1a it replaced, and the model fingerprint (every weight byte) of
// a GGUF file named by DEPCACHE_BENCH_GGUF (skipped when unset):
//   build/bench/bench_kernels --benchmark_filter=hash
//   DEPCACHE_BENCH_GGUF=build/bench-models/qwen2-0.5b-f16.gguf build/bench/bench_kernels
//   --benchmark_filter=fingerprint
#include <benchmark/benchmark.h>

#include <cstdlib>

#include "kv/span_record.h"
#include "model/gguf.h"
#include "model/model.h"
#include "util/hash.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

// The record of a 512-token span of qwen2-0.5b (24 layers, 2 KV heads of 64,
// f16): 6.3 MB of K/V.
std::vector<uint8_t> large_record() {
  KvSpan span(24, 128, DType::F16, 512);
  for (size_t i = 0; i < span.data().size(); ++i) span.data()[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<int32_t> tokens(512);
  for (int i = 0; i < 512; ++i) tokens[i] = i * 17 % 32000, span.positions()[i] = i;
  return encode_span_record(1, 2, tokens, 0, span);
}

uint64_t fnv1a64(const uint8_t* p, size_t n) {  // the former checksum, for comparison
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

void BM_hash_span_record_fnv1a(benchmark::State& state) {
  const auto rec = large_record();
  for (auto _ : state) benchmark::DoNotOptimize(fnv1a64(rec.data(), rec.size()));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(rec.size()));
}
BENCHMARK(BM_hash_span_record_fnv1a)->Unit(benchmark::kMillisecond);

void BM_hash_span_record_xxh3(benchmark::State& state) {
  const auto rec = large_record();
  for (auto _ : state) benchmark::DoNotOptimize(hash_bytes(rec.data(), rec.size()));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(rec.size()));
}
BENCHMARK(BM_hash_span_record_xxh3)->Unit(benchmark::kMillisecond);

void BM_fingerprint_model(benchmark::State& state) {
  const char* path = std::getenv("DEPCACHE_BENCH_GGUF");
  if (!path || !*path) {
    state.SkipWithError("set DEPCACHE_BENCH_GGUF to a GGUF model file");
    return;
  }
  const GgufFile file = GgufFile::open(path);
  const ModelConfig config = ModelConfig::from_gguf(file);
  ThreadPool pool(static_cast<int>(state.range(0)));
  int64_t bytes = 0;
  for (const GgufTensor& t : file.tensors()) bytes += static_cast<int64_t>(t.n_bytes);
  for (auto _ : state) benchmark::DoNotOptimize(model_fingerprint(file, config, pool));
  state.SetBytesProcessed(state.iterations() * bytes);
}
BENCHMARK(BM_fingerprint_model)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_load_model(benchmark::State& state) {
  const char* path = std::getenv("DEPCACHE_BENCH_GGUF");
  if (!path || !*path) {
    state.SkipWithError("set DEPCACHE_BENCH_GGUF to a GGUF model file");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(Model::load(path));
}
BENCHMARK(BM_load_model)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);

}  // namespace
}  // namespace depcache

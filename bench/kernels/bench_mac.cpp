// What sealing span records costs: AES-256-GCM (the keyed records of the
// shared tiers, encrypted and tagged), HMAC-SHA256 (KV event seals) and the
// keyed names of content keys, against XXH3 (the unkeyed checksums), per
// MiB or per call, and what a whole
// read of a span from the disk tier (page cache warm) costs with each, so the
// tag's share of a load shows; and what a demotion to the disk tier costs the
// inserting thread, written at once or behind:
//   build/bench/bench_kernels --benchmark_filter=mac
#include <benchmark/benchmark.h>

#include <filesystem>

#include "kv/disk_store.h"
#include "kv/radix_index.h"
#include "kv/span_record.h"
#include "util/hash.h"
#include "util/mac.h"

namespace depcache {
namespace {

// A 512-token span of qwen2-0.5b's shape (24 layers, 2 KV heads of 64, f16): 6 MiB of K/V.
KvSpan large_span() {
  KvSpan span(24, 128, DType::F16, 512);
  for (size_t i = 0; i < span.data().size(); ++i) span.data()[i] = static_cast<uint8_t>(i * 131 + 7);
  for (int i = 0; i < 512; ++i) span.positions()[i] = i;
  return span;
}

std::vector<int32_t> large_tokens() {
  std::vector<int32_t> tokens(512);
  for (int i = 0; i < 512; ++i) tokens[i] = i * 17 % 32000;
  return tokens;
}

const MacKey& bench_key() {
  static const MacKey key(std::vector<uint8_t>(32, 0x5a));
  return key;
}

void BM_mac_hmac_sha256(benchmark::State& state) {
  const std::vector<uint8_t> bytes(static_cast<size_t>(state.range(0)), 0x33);
  for (auto _ : state) benchmark::DoNotOptimize(bench_key().tag({bytes}));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_mac_hmac_sha256)->Arg(1 << 16)->Arg(1 << 20);

void BM_mac_aes_gcm_seal(benchmark::State& state) {
  std::vector<uint8_t> bytes(static_cast<size_t>(state.range(0)), 0x33);
  const CipherNonce nonce{};
  for (auto _ : state) benchmark::DoNotOptimize(bench_key().seal(nonce, {}, bytes));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_mac_aes_gcm_seal)->Arg(1 << 16)->Arg(1 << 20);

void BM_mac_aes_gcm_open(benchmark::State& state) {
  std::vector<uint8_t> bytes(static_cast<size_t>(state.range(0)), 0x33);
  const CipherNonce nonce{};
  const CipherTag tag = bench_key().seal(nonce, {}, bytes);
  const std::vector<uint8_t> sealed = bytes;
  for (auto _ : state) {
    bytes = sealed;
    benchmark::DoNotOptimize(bench_key().open(nonce, {}, bytes, tag));
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_mac_aes_gcm_open)->Arg(1 << 16)->Arg(1 << 20);

// One content key's stored name (per block key of a KV event, per lookup
// block of a routed request).
void BM_mac_stored_name(benchmark::State& state) {
  uint64_t k = 1;
  for (auto _ : state) benchmark::DoNotOptimize(k = bench_key().name(k));
}
BENCHMARK(BM_mac_stored_name);

void BM_mac_xxh3(benchmark::State& state) {
  const std::vector<uint8_t> bytes(static_cast<size_t>(state.range(0)), 0x33);
  for (auto _ : state) benchmark::DoNotOptimize(hash_bytes(bytes.data(), bytes.size()));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_mac_xxh3)->Arg(1 << 16)->Arg(1 << 20);

// A whole span read back from a disk tier file (page cache warm): open,
// check the head, read and check every layer. Arg 1: keyed.
void BM_mac_disk_span_load(benchmark::State& state) {
  const bool keyed = state.range(0) != 0;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "depcache-bench-mac";
  std::filesystem::remove_all(dir);
  {
    const std::shared_ptr<const MacKey> key = keyed ? std::make_shared<const MacKey>(bench_key()) : nullptr;
    DiskSpanStore disk(dir, size_t{64} << 20, key);
    const KvSpan span = large_span();
    const std::vector<int32_t> tokens = large_tokens();
    const uint64_t k = span_content_key(1, tokens);
    disk.put(k, 1, tokens, 0, span);
    for (auto _ : state) benchmark::DoNotOptimize(disk.get(k, 1, tokens, 0));
    state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(span.data().size()));
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_mac_disk_span_load)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// Sealing a record for the remote tier (what the publishing thread does per block).
void BM_mac_encode_record(benchmark::State& state) {
  const KvSpan span = large_span();
  const std::vector<int32_t> tokens = large_tokens();
  const MacKey* key = state.range(0) ? &bench_key() : nullptr;
  for (auto _ : state) benchmark::DoNotOptimize(encode_span_record(1, 1, tokens, 0, span, key));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(span.data().size()));
}
BENCHMARK(BM_mac_encode_record)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace depcache

namespace depcache {
namespace {

// What a demotion to the disk tier costs the thread that inserts (the
// engine's, holding the index's lock): a hot tier that holds one span, a
// keyed disk tier; each insert of a new span moves the last one to disk.
// Arg 1: written behind (the writer is idle at each insert, as when the
// disk keeps up; its time is not counted); 0: sealed and written at once.
void BM_mac_demote_to_disk(benchmark::State& state) {
  const bool behind = state.range(0) != 0;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "depcache-bench-demote";
  std::filesystem::remove_all(dir);
  {
    DiskSpanStore disk(dir, size_t{1} << 30, std::make_shared<const MacKey>(bench_key()));
    if (behind) disk.write_behind(size_t{256} << 20);
    const KvSpan span = large_span();
    RadixIndex index(span.bytes() + span.bytes() / 2);
    index.attach_disk(disk);
    std::vector<int32_t> tokens = large_tokens();
    const RadixIndex::SpanMaker make = [&](int64_t, int64_t) { return span; };
    for (auto _ : state) {
      ++tokens[0];  // a new sequence each time
      index.insert(1, tokens, make);
      state.PauseTiming();
      disk.flush();
      state.ResumeTiming();
    }
    state.counters["written"] = static_cast<double>(disk.n_files());
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_mac_demote_to_disk)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace depcache

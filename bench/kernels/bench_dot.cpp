// dot_row and dequantize_row per type and ISA. "bytes_per_second" counts
// weight bytes: the figure that matters for decode, which streams every
// weight once per token. The single-row cases run from L1 and show kernel
// throughput; dot_panel streams ~64 MB of rows and shows what memory allows.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "bench_support.h"
#include "compute/dot.h"
#include "compute/quant.h"

namespace {

using depcache::DType;
using depcache::Isa;

constexpr DType kTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                            DType::Q4_0, DType::Q4_K, DType::Q6_K};

using depcache::bench::random_floats;

// rows weight rows of n elements, quantized from Gaussian values.
std::vector<uint8_t> weights(DType t, int64_t n, int64_t rows) {
  const std::vector<float> v = random_floats(n * rows, 1);
  std::vector<uint8_t> w(depcache::row_bytes(t, n) * rows);
  depcache::quantize_row(t, v.data(), w.data(), n * rows);
  return w;
}

void set_counters(benchmark::State& st, size_t bytes_per_iter, int64_t elems_per_iter) {
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(bytes_per_iter));
  st.counters["elems/s"] =
      benchmark::Counter(static_cast<double>(st.iterations()) * elems_per_iter, benchmark::Counter::kIsRate);
}

void bench_dot(benchmark::State& st, DType t, Isa isa, int64_t n) {
  depcache::set_isa(isa);
  const std::vector<uint8_t> w = weights(t, n, 1);
  const std::vector<float> x = random_floats(n, 2);
  for (auto _ : st) benchmark::DoNotOptimize(depcache::dot_row(t, w.data(), x.data(), n));
  set_counters(st, w.size(), n);
}

void bench_dot_panel(benchmark::State& st, DType t, Isa isa, int64_t n) {
  depcache::set_isa(isa);
  const size_t rb = depcache::row_bytes(t, n);
  const auto rows = static_cast<int64_t>((64u << 20) / rb);
  const std::vector<uint8_t> w = weights(t, n, rows);
  const std::vector<float> x = random_floats(n, 2);
  std::vector<float> y(rows);
  for (auto _ : st) {
    for (int64_t r = 0; r < rows; ++r) y[r] = depcache::dot_row(t, w.data() + r * rb, x.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, w.size(), n * rows);
}

void bench_dequantize(benchmark::State& st, DType t, Isa isa, int64_t n) {
  depcache::set_isa(isa);
  const std::vector<uint8_t> w = weights(t, n, 1);
  std::vector<float> y(n);
  for (auto _ : st) {
    depcache::dequantize_row(t, w.data(), y.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, w.size(), n);
}

// Only the ISAs this CPU supports are registered.
const bool registered = [] {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!depcache::isa_supported(isa)) continue;
    for (DType t : kTypes) {
      const std::string suffix =
          std::string(depcache::dtype_info(t).name) + "/" + std::string(depcache::isa_name(isa)) + "/";
      for (int64_t n : {896, 4864}) {
        if (n % depcache::dtype_info(t).block_size != 0) continue;  // 896 is not a whole K super-block
        benchmark::RegisterBenchmark(("dot_row/" + suffix + std::to_string(n)).c_str(),
                                     [=](benchmark::State& st) { bench_dot(st, t, isa, n); });
      }
      benchmark::RegisterBenchmark(("dot_panel/" + suffix + "4864").c_str(), [=](benchmark::State& st) {
        bench_dot_panel(st, t, isa, 4864);
      })->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("dequantize_row/" + suffix + "4864").c_str(),
                                   [=](benchmark::State& st) { bench_dequantize(st, t, isa, 4864); });
    }
  }
  return true;
}();

}  // namespace

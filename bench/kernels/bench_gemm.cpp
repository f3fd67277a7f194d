// Panel GEMM (packed_matrix.h) per type and ISA, single-threaded, at the
// shapes of the qwen2-0.5b feed-forward (896 -> 4864, and 4864 -> 896 for
// the 256-block types). "FLOP/s" counts 2 * tokens * rows * inputs;
// "bytes_per_second" counts panel bytes streamed, the figure that bounds a
// decode step (tokens:1). The tokens:1 cases stream ~64 MiB of panels so
// they run from memory, as in a real decode; tokens:12 and tokens:512 reuse
// one matrix and show compute throughput. matmul/... runs the whole
// multi-threaded matmul the forward pass calls, pool overhead included.
// panel_gemm_bf16/... runs the BF16 products' kernels where the CPU has them.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "bench_support.h"
#include "compute/dot.h"
#include "compute/matmul.h"
#include "compute/packed_matrix.h"
#include "compute/quant.h"
#include "util/thread_pool.h"

namespace {

using depcache::DType;
using depcache::Isa;

constexpr DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_K};

using depcache::bench::random_floats;

struct Matrix {
  std::vector<uint8_t> rows;
  depcache::WeightMatrix w;
};

Matrix make_matrix(DType t, int64_t n_in, int64_t n_out) {
  Matrix m;
  const std::vector<float> v = random_floats(n_in * n_out, 1);
  const size_t rb = depcache::row_bytes(t, n_in);
  m.rows.resize(rb * n_out);
  depcache::quantize_row(t, v.data(), m.rows.data(), n_in * n_out);
  m.w = {t, n_in, n_out, m.rows.data(), rb, nullptr};
  m.w.packed = std::make_shared<const depcache::PackedMatrix>(m.w);
  return m;
}

void set_counters(benchmark::State& st, const depcache::PackedMatrix& p, int64_t n_tok, int64_t copies) {
  const double it = static_cast<double>(st.iterations()) * copies;
  st.counters["FLOP/s"] = benchmark::Counter(it * 2.0 * n_tok * p.n_out() * p.n_in(),
                                             benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  st.SetBytesProcessed(static_cast<int64_t>(it * static_cast<double>(p.bytes())));
}

void bench_panels(benchmark::State& st, DType t, Isa isa, int64_t n_in, int64_t n_out, int64_t n_tok) {
  depcache::set_isa(isa);
  // Decode streams from memory: enough copies to pass every cache.
  const size_t one = depcache::panel_bytes(t, n_in) * ((n_out + 31) / 32);
  const int64_t copies = n_tok == 1 ? std::max<int64_t>(1, (64 << 20) / static_cast<int64_t>(one)) : 1;
  std::vector<Matrix> ms;
  for (int64_t c = 0; c < copies; ++c) ms.push_back(make_matrix(t, n_in, n_out));
  const std::vector<float> x = random_floats(n_tok * n_in, 2);
  std::vector<float> y(n_tok * n_out);
  for (auto _ : st) {
    for (const Matrix& m : ms) {
      const depcache::PackedMatrix& p = *m.w.packed;
      for (int64_t pi = 0; pi < p.n_panels(); ++pi)
        depcache::panel_gemm(t, p.panel(pi), n_in, x.data(), n_in, n_tok, y.data() + pi * 32, n_out,
                             static_cast<int>(std::min<int64_t>(32, n_out - pi * 32)));
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, *ms[0].w.packed, n_tok, copies);
}

// BF16 products (dot.h): the same panels on activations rounded to bfloat16
// once per call, as matmul does.
void bench_panels_bf16(benchmark::State& st, DType t, int64_t n_in, int64_t n_out, int64_t n_tok) {
  depcache::set_isa(depcache::best_isa());
  const Matrix m = make_matrix(t, n_in, n_out);
  const depcache::PackedMatrix& p = *m.w.packed;
  const std::vector<float> x = random_floats(n_tok * n_in, 2);
  std::vector<uint16_t> xb(n_tok * depcache::bf16_row_length(n_in));
  std::vector<float> y(n_tok * n_out);
  for (auto _ : st) {
    depcache::round_activations_bf16(x.data(), n_tok, n_in, xb.data());
    for (int64_t pi = 0; pi < p.n_panels(); ++pi)
      depcache::panel_gemm_bf16(t, p.panel(pi), n_in, xb.data(), n_tok, y.data() + pi * 32, n_out,
                                static_cast<int>(std::min<int64_t>(32, n_out - pi * 32)));
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, p, n_tok, 1);
}

void bench_matmul(benchmark::State& st, DType t, int64_t n_in, int64_t n_out, int64_t n_tok, int threads) {
  depcache::set_isa(depcache::best_isa());
  const int64_t copies = n_tok == 1 ? 8 : 1;
  std::vector<Matrix> ms;
  for (int64_t c = 0; c < copies; ++c) ms.push_back(make_matrix(t, n_in, n_out));
  const std::vector<float> x = random_floats(n_tok * n_in, 2);
  std::vector<float> y(n_tok * n_out), scratch;
  depcache::ThreadPool pool(threads);
  for (auto _ : st) {
    for (const Matrix& m : ms) depcache::matmul(m.w, x.data(), n_tok, y.data(), pool, scratch);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, *ms[0].w.packed, n_tok, copies);
}

const bool registered = [] {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!depcache::isa_supported(isa)) continue;
    for (DType t : kTypes) {
      const bool k256 = depcache::dtype_info(t).block_size == 256;
      const int64_t n_in = k256 ? 4864 : 896, n_out = k256 ? 896 : 4864;
      for (int64_t n_tok : {1, 12, 512}) {
        if (isa == Isa::Scalar && n_tok == 512) continue;  // minutes per run
        const std::string name = "panel_gemm/" + std::string(depcache::dtype_info(t).name) + "/" +
                                 std::string(depcache::isa_name(isa)) + "/tokens:" + std::to_string(n_tok);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
          bench_panels(st, t, isa, n_in, n_out, n_tok);
        })->Unit(benchmark::kMillisecond);
      }
    }
  }
  depcache::set_isa(depcache::best_isa());
  for (DType t : {DType::F16, DType::BF16}) {
    if (!depcache::has_bf16_panels(t)) continue;
    for (int64_t n_tok : {12, 512}) {
      const std::string name =
          "panel_gemm_bf16/" + std::string(depcache::dtype_info(t).name) + "/tokens:" + std::to_string(n_tok);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
        bench_panels_bf16(st, t, 896, 4864, n_tok);
      })->Unit(benchmark::kMillisecond);
    }
  }
  for (DType t : kTypes) {
    const bool k256 = depcache::dtype_info(t).block_size == 256;
    const int64_t n_in = k256 ? 4864 : 896, n_out = k256 ? 896 : 4864;
    for (int64_t n_tok : {1, 512})
      for (int threads : {1, 2}) {
        const std::string name = "matmul/" + std::string(depcache::dtype_info(t).name) +
                                 "/tokens:" + std::to_string(n_tok) + "/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(
            name.c_str(), [=](benchmark::State& st) { bench_matmul(st, t, n_in, n_out, n_tok, threads); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
  }
  return true;
}();

}  // namespace

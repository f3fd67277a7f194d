#include "compute/matmul.h"

#include <algorithm>

#include "compute/dot.h"
#include "compute/packed_matrix.h"
#include "compute/quant.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

void matmul_rows(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  constexpr int64_t kRowsPerTask = 16;
  const int64_t n_tasks = (w.n_out + kRowsPerTask - 1) / kRowsPerTask;
  pool.parallel_for(n_tasks, [&](int64_t task, int) {
    const int64_t r0 = task * kRowsPerTask;
    const int64_t r1 = std::min(w.n_out, r0 + kRowsPerTask);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t t = 0; t < n_tokens; ++t)
        y[t * w.n_out + r] = dot_row(w.type, w.row(r), x + t * w.n_in, w.n_in);
  });
}

// Every output of `outs` is packed. A task is a run of panels of one matrix
// by a run of tokens. Decode streams the weights: a few long runs per thread
// keep each thread's reads sequential for the hardware prefetcher while the
// dynamic hand-out still evens out a thread that starts late. Prefill is
// compute-bound: one panel per task (or a token run, when panels are few).
void matmul_panels(std::span<const MatmulOut> outs, const float* x, int64_t n_tokens, ThreadPool& pool,
                   std::vector<float>& scratch) {
  // Int8 activations, when chosen and the kernels have them for a type: x
  // quantized once for every matrix that reads it, in parallel over tokens.
  const int64_t n_in = outs.front().w->n_in;
  for (const MatmulOut& o : outs)
    if (o.w->n_in != n_in)
      fail(ErrorKind::Internal, "matmul: matrices of {} and {} inputs share one x", n_in, o.w->n_in);
  // The approximate modes, when chosen and the kernels have them for a
  // type: x converted once for every matrix that reads it (int8 blocks, or
  // bfloat16), in parallel over tokens, into `scratch`.
  const bool int8 = int8_activations() && std::any_of(outs.begin(), outs.end(), [](const MatmulOut& o) {
                      return has_int8_panels(o.w->type);
                    });
  const bool bf16 = bf16_products() && std::any_of(outs.begin(), outs.end(), [](const MatmulOut& o) {
                      return has_bf16_panels(o.w->type);
                    });
  const int64_t q_floats = int8 ? (n_tokens * n_in + 3) / 4 : 0;
  const int64_t s_floats = int8 ? n_tokens * (n_in / kQ32) * kActScales : 0;
  const int64_t b_floats = bf16 ? (n_tokens * bf16_row_length(n_in) + 1) / 2 : 0;
  scratch.resize(q_floats + s_floats + b_floats);
  auto* xq = reinterpret_cast<int8_t*>(scratch.data());
  float* xs = scratch.data() + q_floats;
  auto* xb = reinterpret_cast<uint16_t*>(scratch.data() + q_floats + s_floats);
  if (int8 || bf16) {
    constexpr int64_t kTokensPerTask = 16;
    pool.parallel_for((n_tokens + kTokensPerTask - 1) / kTokensPerTask, [&](int64_t task, int) {
      const int64_t t0 = task * kTokensPerTask, nt = std::min(kTokensPerTask, n_tokens - t0);
      if (int8)
        quantize_activations(x + t0 * n_in, nt, n_in, xq + t0 * n_in, xs + t0 * (n_in / kQ32) * kActScales);
      if (bf16) round_activations_bf16(x + t0 * n_in, nt, n_in, xb + t0 * bf16_row_length(n_in));
    });
  }
  int64_t n_panels = 0;
  for (const MatmulOut& o : outs) n_panels += o.w->packed->n_panels();
  const int64_t threads = pool.size();
  int64_t panels_per_run = 1, n_chunks = 1;
  if (n_tokens < kGemmMinTokens) {
    panels_per_run = (n_panels + 4 * threads - 1) / (4 * threads);
  } else if (n_panels < 4 * threads) {
    constexpr int64_t kTokenQuantum = 60;  // whole multiples of the widest tile
    n_chunks =
        std::max<int64_t>(1, std::min((4 * threads + n_panels - 1) / n_panels, n_tokens / kTokenQuantum));
  }
  struct Run {
    const PackedMatrix* w;
    float* y;
    int64_t p0, p1;
    enum { kExact, kInt8, kBf16 } mode;
  };
  std::vector<Run> runs;
  for (const MatmulOut& o : outs) {
    const PackedMatrix& w = *o.w->packed;
    const auto mode = int8 && has_int8_panels(w.type())   ? Run::kInt8
                      : bf16 && has_bf16_panels(w.type()) ? Run::kBf16
                                                          : Run::kExact;
    for (int64_t p = 0; p < w.n_panels(); p += panels_per_run)
      runs.push_back({&w, o.y, p, std::min(w.n_panels(), p + panels_per_run), mode});
  }
  const int64_t chunk = (n_tokens + n_chunks - 1) / n_chunks;
  pool.parallel_for(static_cast<int64_t>(runs.size()) * n_chunks, [&](int64_t task, int) {
    const Run& r = runs[task / n_chunks];
    const int64_t t0 = (task % n_chunks) * chunk;
    const int64_t nt = std::min(chunk, n_tokens - t0);
    if (nt <= 0) return;
    const PackedMatrix& w = *r.w;
    for (int64_t p = r.p0; p < r.p1; ++p) {
      const int rows = static_cast<int>(std::min(kPanelRows, w.n_out() - p * kPanelRows));
      float* y = r.y + t0 * w.n_out() + p * kPanelRows;
      if (r.mode == Run::kInt8)
        panel_gemm_i8(w.type(), w.panel(p), n_in, xq + t0 * n_in, xs + t0 * (n_in / kQ32) * kActScales, nt, y,
                      w.n_out(), rows);
      else if (r.mode == Run::kBf16)
        panel_gemm_bf16(w.type(), w.panel(p), n_in, xb + t0 * bf16_row_length(n_in), nt, y, w.n_out(), rows);
      else
        panel_gemm(w.type(), w.panel(p), n_in, x + t0 * n_in, n_in, nt, y, w.n_out(), rows);
    }
  });
}

}  // namespace

void matmul(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            std::vector<float>& scratch) {
  const MatmulOut out{&w, y};
  matmul(std::span(&out, 1), x, n_tokens, pool, scratch);
}

void matmul(std::span<const MatmulOut> outs, const float* x, int64_t n_tokens, ThreadPool& pool,
            std::vector<float>& scratch) {
  std::vector<MatmulOut> packed;
  for (const MatmulOut& o : outs) {
    if (o.w->packed)
      packed.push_back(o);
    else
      matmul_rows(*o.w, x, n_tokens, o.y, pool);
  }
  if (!packed.empty()) matmul_panels(packed, x, n_tokens, pool, scratch);
}

}  // namespace depcache

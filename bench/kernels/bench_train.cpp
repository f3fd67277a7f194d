// One training step (forward, backward, AdamW) of the trainer on causal
// sequences, at the shape of the small QA model (d 128, 4 layers, 4 heads,
// ff 352, vocab 1024, tied) and of a wider one: tokens/s to compare with
// PyTorch on the same shape and batch (bench/experiments/train_vs_torch.sh).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "train/optimizer.h"
#include "train/train_graph.h"
#include "util/thread_pool.h"

namespace {

void bench_train_step(benchmark::State& st, int embd, int layers, int heads, int ff, int batch, int len,
                      int threads, int vocab = 1024) {
  depcache::ModelShape shape;
  shape.n_layer = layers;
  shape.n_embd = embd;
  shape.n_head = heads;
  shape.n_head_kv = heads;
  shape.n_ff = ff;
  shape.n_ctx = len;
  shape.n_vocab = vocab;
  shape.tied_embeddings = true;
  depcache::ParamSet params(shape);
  params.init_random(1);
  depcache::AdamW opt(params, depcache::AdamWOptions{});
  std::mt19937 rng(3);
  std::vector<depcache::TrainSequence> seqs;
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> t(len);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % shape.n_vocab);
    seqs.push_back(depcache::causal_sequence(std::move(t)));
  }
  depcache::ThreadPool pool(threads);
  depcache::TrainGraph graph(pool);
  depcache::ParamSet grads(shape);
  for (auto _ : st) {
    std::fill(grads.values().begin(), grads.values().end(), 0.0f);
    graph.run(params, seqs, &grads);
    opt.update(params, grads);
  }
  st.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(st.iterations()) * batch * len, benchmark::Counter::kIsRate);
}

const bool registered = [] {
  benchmark::RegisterBenchmark("train/step/d128-l4-ff352/batch:32/len:256/threads:2",
                               [](benchmark::State& st) { bench_train_step(st, 128, 4, 4, 352, 32, 256, 2); })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(5.0);
  // The shipped QA model's shape and batch (its sequences average ~160 tokens).
  benchmark::RegisterBenchmark(
      "train/step/d128-l4-ff352-v4096/batch:16/len:160/threads:2",
      [](benchmark::State& st) { bench_train_step(st, 128, 4, 4, 352, 16, 160, 2, 4096); })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(5.0);
  benchmark::RegisterBenchmark("train/step/d256-l6-ff704/batch:16/len:512/threads:2",
                               [](benchmark::State& st) { bench_train_step(st, 256, 6, 8, 704, 16, 512, 2); })
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime()
      ->MinTime(5.0);
  return true;
}();

}  // namespace

// `depcache bench-model`: prompt-processing (pp) and generation (tg)
// throughput, in the table form of the leading C++ engine's bench tool so the
// two can be compared on one GGUF file.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "compute/dot.h"
#include "engine/engine.h"
#include "eval/engine_bench.h"
#include "model/model.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache::cli {

namespace {

std::vector<int> parse_list(const std::string& s, const char* what) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0)
      fail(ErrorKind::InvalidInput, "{}: '{}' is not a non-negative integer", what, item);
    if (v > 0) out.push_back(v);
  }
  return out;
}

struct Stats {
  double mean = 0, stddev = 0;
};

Stats stats(const std::vector<double>& xs) {
  Stats s;
  for (double x : xs) s.mean += x;
  s.mean /= xs.size();
  for (double x : xs) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = xs.size() > 1 ? std::sqrt(s.stddev / (xs.size() - 1)) : 0;
  return s;
}

struct BenchOptions {
  std::string model_path, pp_list = "512", tg_list = "128", parallel_list = "1", kv_type = "f16";
  int threads = 0, reps = 3, ubatch = 512;
  bool json = false, int8 = false, bf16 = false;
};

void add_bench_options(CLI::App* cmd, BenchOptions& o) {
  add_model_option(*cmd, o.model_path)->required();
  cmd->add_option("-p,--n-prompt", o.pp_list, "Prompt lengths, comma-separated (0: none)")
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o.tg_list, "Generation lengths, comma-separated (0: none)")
      ->capture_default_str();
  cmd->add_option("--parallel", o.parallel_list,
                  "Sequences decoding side by side in the tg tests, comma-separated (tgN: one; tgNxP: P "
                  "requests decoding together, P*N tokens)")
      ->capture_default_str();
  add_threads_option(*cmd, o.threads);
  cmd->add_option("-r,--repetitions", o.reps, "Timed runs per test (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("-u,--ubatch", o.ubatch, "Prompt tokens per forward call")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  add_kv_type_option(*cmd, o.kv_type);
  cmd->add_flag(
      "--int8-activations", o.int8,
      "Q8_0/Q4_K/Q4_0/Q6_K matmuls on int8-quantized activations (AVX-512 VNNI or AVX2; faster, not exact)");
  cmd->add_flag("--bf16-products", o.bf16,
                "BF16/F16 matmuls on activations (and F16 weights) rounded to bfloat16 (AVX512-BF16; faster "
                "prefill, not exact)");
  cmd->add_flag("--json", o.json, "Print JSON lines instead of a table");
}

void run_bench(const BenchOptions& o) {
  if (o.int8) set_int8_activations(true);
  if (o.bf16) set_bf16_products(true);
  const std::vector<int> pps = parse_list(o.pp_list, "--n-prompt");
  const std::vector<int> tgs = parse_list(o.tg_list, "--n-gen");
  const std::vector<int> parallels = parse_list(o.parallel_list, "--parallel");
  if (parallels.empty()) fail(ErrorKind::InvalidInput, "--parallel: give at least one sequence count");
  parse_kv_type(o.kv_type);  // a bad name fails before the model loads
  auto model = Model::load(o.model_path);
  const ModelConfig& c = model->config();
  int64_t n_params = 0;
  for (const GgufTensor& t : model->file().tensors()) n_params += t.n_elements();
  const double size_mib = model->file().file_size() / 1048576.0;
  const std::string model_desc = model_description(*model);
  EngineBenchOptions eo;
  eo.kv_type = parse_kv_type(o.kv_type);
  eo.ubatch = o.ubatch;
  eo.threads = o.threads;
  EngineBench bench(model, eo);
  const int n_threads = ThreadPool(o.threads).size();

  if (!o.json) {
    fmt::print("| {:<24} | {:>10} | {:>8} | {:>7} | {:>7} | {:>20} |\n", "model", "size", "params", "threads",
               "test", "t/s");
    fmt::print("| {:-<24} | {:->10} | {:->8} | {:->7} | {:->7} | {:->20} |\n", "", ":", ":", ":", ":", ":");
  }
  // `tokens` of the test (n per sequence) are generated or read per run.
  auto report = [&](const std::string& test, int n, int tokens, const std::function<double(int)>& run) {
    if (n > c.n_ctx_train)
      fail(ErrorKind::LimitExceeded, "{} exceeds the model's context {}", test, c.n_ctx_train);
    run(n);  // warm-up
    std::vector<double> tps;
    for (int r = 0; r < o.reps; ++r) tps.push_back(tokens / run(n));
    const Stats s = stats(tps);
    if (o.json) {
      nlohmann::json j = {{"model", model_desc},  {"model_size_bytes", model->file().file_size()},
                          {"n_params", n_params}, {"n_threads", n_threads},
                          {"test", test},         {"n_tokens", tokens},
                          {"avg_ts", s.mean},     {"stddev_ts", s.stddev},
                          {"samples_ts", tps},    {"kv_type", o.kv_type},
                          {"ubatch", o.ubatch}};
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("| {:<24} | {:>6.2f} MiB | {:>6.2f} M | {:>7} | {:>7} | {:>12.2f} ± {:>5.2f} |\n",
                 model_desc, size_mib, n_params / 1e6, n_threads, test, s.mean, s.stddev);
    }
    std::fflush(stdout);
  };
  for (int n : pps) report(fmt::format("pp{}", n), n, n, [&](int k) { return bench.pp(k); });
  for (int n : tgs)
    for (int p : parallels)
      report(p == 1 ? fmt::format("tg{}", n) : fmt::format("tg{}x{}", n, p), n, n * p,
             [&](int k) { return bench.tg(k, p); });
}

}  // namespace

void add_bench_model_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("bench-model", "Measure prompt (pp) and generation (tg) tokens/s");
  static BenchOptions o;
  add_bench_options(cmd, o);
  cmd->callback([] { run_bench(o); });
}

}  // namespace depcache::cli

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
  std::string model_path, pp_list = "512", tg_list = "128", kv_type = "f16";
  int threads = 0, reps = 3, ubatch = 512;
  bool json = false, int8 = false;
};

void add_bench_options(CLI::App* cmd, BenchOptions& o) {
  cmd->add_option("-m,--model", o.model_path, "GGUF model file")->required();
  cmd->add_option("-p,--n-prompt", o.pp_list, "Prompt lengths, comma-separated (0: none)")
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o.tg_list, "Generation lengths, comma-separated (0: none)")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o.threads, "Threads (default: one per core)");
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
  cmd->add_flag("--json", o.json, "Print JSON lines instead of a table");
}

// The model as the table names it: architecture, layers, width and the
// matrix types of a layer (files that fall back to another type where rows
// do not fit the blocks show both, e.g. Q8_0+Q4_K).
std::string model_description(const Model& model) {
  const ModelConfig& c = model.config();
  std::vector<std::string_view> types;
  const LayerWeights& l0 = model.layers[0];
  for (const WeightMatrix* w : {&l0.wq, &l0.wk, &l0.wv, &l0.wo, &l0.w_gate, &l0.w_up, &l0.w_down})
    if (std::find(types.begin(), types.end(), dtype_info(w->type).name) == types.end())
      types.push_back(dtype_info(w->type).name);
  return fmt::format("{} {}L {}d {}", c.arch_name, c.n_layer, c.n_embd, fmt::join(types, "+"));
}

// Each test runs through the engine, as every request does: one request of
// random tokens, computed without reuse, greedy. pp n: an n-token prompt in
// --ubatch pieces, to its first token; tg n: a one-token prompt and n - 1
// more tokens, n forward passes of one token each. Returns seconds.
class EngineBench {
 public:
  EngineBench(std::shared_ptr<const Model> model, const BenchOptions& o)
      : model_(std::move(model)), o_(o), pick_(0, model_->config().n_vocab - 1) {}
  double pp(int n) { return run(n, 1); }
  double tg(int n) { return run(1, n); }

 private:
  double run(int64_t n_prompt, int n_tokens) {
    EngineOptions eo;
    eo.pool_rows = n_prompt + n_tokens;
    eo.kv_type = parse_kv_type(o_.kv_type);
    eo.cache_bytes = 0;
    eo.batch_tokens = o_.ubatch;
    eo.threads = o_.threads;
    Engine engine(model_, eo);
    PromptParts parts;
    for (int64_t i = 0; i < n_prompt; ++i) parts.text.push_back(pick_(rng_));
    SamplingParams sampling;
    sampling.max_tokens = n_tokens;
    sampling.stop_at_eog = false;
    const RequestResult& r = engine.wait(engine.submit("full", std::move(parts), sampling));
    return std::chrono::duration<double>(r.done - r.submitted).count();
  }

  std::shared_ptr<const Model> model_;
  const BenchOptions& o_;
  std::mt19937 rng_{1234};
  std::uniform_int_distribution<int32_t> pick_;
};

void run_bench(const BenchOptions& o) {
  if (o.int8) set_int8_activations(true);
  const std::vector<int> pps = parse_list(o.pp_list, "--n-prompt");
  const std::vector<int> tgs = parse_list(o.tg_list, "--n-gen");
  parse_kv_type(o.kv_type);  // a bad name fails before the model loads
  auto model = Model::load(o.model_path);
  const ModelConfig& c = model->config();
  int64_t n_params = 0;
  for (const GgufTensor& t : model->file().tensors()) n_params += t.n_elements();
  const double size_mib = model->file().file_size() / 1048576.0;
  const std::string model_desc = model_description(*model);
  EngineBench bench(model, o);
  const int n_threads = ThreadPool(o.threads).size();

  if (!o.json) {
    fmt::print("| {:<24} | {:>10} | {:>8} | {:>7} | {:>7} | {:>20} |\n", "model", "size", "params", "threads",
               "test", "t/s");
    fmt::print("| {:-<24} | {:->10} | {:->8} | {:->7} | {:->7} | {:->20} |\n", "", ":", ":", ":", ":", ":");
  }
  auto report = [&](const std::string& test, int n, const std::function<double(int)>& run) {
    if (n > c.n_ctx_train)
      fail(ErrorKind::LimitExceeded, "{} exceeds the model's context {}", test, c.n_ctx_train);
    run(n);  // warm-up
    std::vector<double> tps;
    for (int r = 0; r < o.reps; ++r) tps.push_back(n / run(n));
    const Stats s = stats(tps);
    if (o.json) {
      nlohmann::json j = {{"model", model_desc},  {"model_size_bytes", model->file().file_size()},
                          {"n_params", n_params}, {"n_threads", n_threads},
                          {"test", test},         {"n_tokens", n},
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
  for (int n : pps) report(fmt::format("pp{}", n), n, [&](int k) { return bench.pp(k); });
  for (int n : tgs) report(fmt::format("tg{}", n), n, [&](int k) { return bench.tg(k); });
}

}  // namespace

void add_bench_model_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("bench-model", "Measure prompt (pp) and generation (tg) tokens/s");
  static BenchOptions o;
  add_bench_options(cmd, o);
  cmd->callback([] { run_bench(o); });
}

}  // namespace depcache::cli

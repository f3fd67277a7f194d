// `depcache run`: process a request stream with one or more strategies and
// report, per request, TTFT and what was computed versus reused, then a
// side-by-side summary.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "compute/dot.h"
#include "engine/engine.h"
#include "engine_options.h"
#include "eval/replay.h"
#include "eval/report.h"
#include "eval/strategy_run.h"
#include "eval/stream.h"
#include "kv/policy.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "retrieval/rag_request.h"
#include "strategy/subgcache.h"
#include "tier_options.h"
#include "util/error.h"

namespace depcache::cli {
namespace {

struct RunOptions {
  std::string model_path, requests_path, strategies = "depcache", json_path;
  EngineArgs engine;
  StreamOptions stream;  // its subgcache flag is set from the strategies
  int64_t ctx = 0;
  int max_tokens = 1;
  bool quiet = false, verify = false, fidelity = false, serial = false, sweep = false;
  double slo_ms = 0;
  std::string report_path;
  std::string warmup_path;
  std::string reference_kv_type;  // --fidelity's full answers; empty: --kv-type
};

ReplayOptions replay_options(const RunOptions& o) {
  ReplayOptions ro;
  ro.max_tokens = o.max_tokens;
  ro.serial = o.serial;
  ro.verify = o.verify;
  return ro;
}

// --sweep-rate: each strategy's highest Poisson rate within the SLO
// (eval/report.h); prints the curve, and with --report writes it as
// Markdown and a PNG.
void sweep_rates(const std::vector<std::string>& names, const std::vector<RagRequest>& reqs,
                 const std::vector<PromptParts>& parts, const std::shared_ptr<const Model>& model,
                 const RunOptions& o, int64_t pool_rows, bool dependency) {
  RunOptions quiet = o;
  quiet.verify = quiet.fidelity = false;
  std::vector<RateSweep> sweeps;
  for (const std::string& name : names)
    sweeps.push_back(
        sweep_rate(reqs, o.slo_ms, o.stream.seed, [&](const std::vector<RagRequest>& at, bool serial) {
          quiet.serial = serial;
          return run_strategy(name, at, parts, model, quiet.engine, replay_options(quiet), pool_rows,
                              dependency);
        }));
  const std::string report = fmt::format(
      "Rate sweep: {} requests, Poisson arrivals (seed {}); SLO: p99 TTFT within {} \n\n{}", reqs.size(),
      o.stream.seed, o.slo_ms > 0 ? fmt::format("{} ms", o.slo_ms) : std::string("5x the unloaded p50"),
      sweep_markdown(names, sweeps));
  fmt::print("\n{}", report);
  if (o.report_path.empty()) return;
  open_output(o.report_path) << report;
  fmt::print("wrote {}\n", o.report_path);
  plot_beside(o.report_path, sweep_plot_data(names, sweeps), sweep_plot_commands(names));
}

// The model's description and what positions dependency attention runs
// with, and where that came from.
void print_header(const RunOptions& o, const ModelConfig& c, const Stream& s, int64_t n_ctx,
                  bool dependency) {
  const EngineOptions positions = resolve_engine(o.engine, "", c, n_ctx, dependency).engine;
  const std::string scheme_source = o.engine.scheme != "auto"   ? "--scheme"
                                    : c.position_scheme.empty() ? "default"
                                                                : "the model's metadata";
  // Printed only when it is not DepCache's layout, which every other model is served with.
  const std::string trees =
      positions.strategy.tree_context == TreeContext::None
          ? fmt::format("; trees see only themselves ({})",
                        o.engine.tree_context != "auto" ? "--tree-context" : "the model's metadata")
          : "";
  fmt::print(
      "model: {} ({} layers, {} embd, {}/{} heads); {} requests; KV {} ; pool {} rows; positions {} "
      "({}){}\n",
      o.model_path, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, s.requests.size(), o.engine.kv_type, n_ctx,
      position_scheme_name(positions.strategy.scheme), scheme_source, trees);
}

void run_command(RunOptions& o) {
  const std::vector<std::string> names = split_list(o.strategies);
  if (names.empty()) throw CLI::ValidationError("--strategy", "give at least one strategy");
  const auto known = request_strategy_names();
  for (const std::string& s : names)
    if (std::find(known.begin(), known.end(), s) == known.end())
      fail(ErrorKind::InvalidInput, "unknown strategy '{}' (expected {})", s, fmt::join(known, ", "));
  o.stream.subgcache = std::find(names.begin(), names.end(), kSubgcache) != names.end();
  if (o.stream.subgcache && o.sweep)
    throw CLI::ValidationError("--sweep-rate", "subgcache serves query batches; sweep the others");
  if (o.engine.policy != "auto") make_policy(o.engine.policy);  // reject bad names before loading anything
  std::vector<RagRequest> warm =
      o.warmup_path.empty() ? std::vector<RagRequest>{} : read_requests(o.warmup_path);
  const auto model = Model::load(o.model_path);
  const Tokenizer tok(Vocab::from_gguf(model->file()));
  const Stream s = prepare_stream(read_requests(o.requests_path), std::move(warm), o.stream, tok,
                                  model->config().prompt, o.max_tokens);
  const int64_t need = s.largest_rows, n_ctx = pool_rows(s, o.ctx, o.max_tokens);
  if (const int n_train = model->config().n_ctx_train; n_train > 0 && need > n_train)
    fmt::print(
        stderr,
        "warning: request {} needs {} positions, more than the {} the model was trained on; its answers "
        "may degrade\n",
        s.largest, need, n_train);
  // The model's scheme is read (and checked) only when dependency attention runs.
  const bool dependency = std::find(names.begin(), names.end(), "depcache") != names.end();
  print_header(o, model->config(), s, n_ctx, dependency);
  if (const std::string mode = apply_matmul_mode(o.engine); !mode.empty()) fmt::print("{}\n", mode);
  std::ofstream json;
  if (!o.json_path.empty()) json = open_output(o.json_path);
  std::vector<FullAnswer> full;
  if (o.fidelity) {
    EngineOptions alone;
    alone.pool_rows = need;
    alone.kv_type = parse_kv_type(o.reference_kv_type.empty() ? o.engine.kv_type : o.reference_kv_type);
    alone.threads = o.engine.threads;
    // The reference is exact: approximate matmuls are measured against it.
    const bool int8 = int8_activations(), bf16 = bf16_products();
    set_int8_activations(false);
    set_bf16_products(false);
    full = full_answers(model, alone, s.parts, o.max_tokens);
    set_int8_activations(int8);
    set_bf16_products(bf16);
  }
  if (o.sweep) return sweep_rates(names, s.requests, s.parts, model, o, n_ctx, dependency);
  std::vector<StrategyRun> runs;
  for (const std::string& name : names) {
    const std::vector<FullAnswer>* reference = o.fidelity ? &full : nullptr;
    runs.push_back(name == kSubgcache
                       ? run_clustered(s, model, o.engine, replay_options(o), o.stream.subgcache_options,
                                       n_ctx, dependency, reference)
                       : run_strategy(name, s.requests, s.parts, model, o.engine, replay_options(o), n_ctx,
                                      dependency, reference, &s.warmup_parts));
    score_answers(runs.back(), s.requests, tok);
    if (!o.quiet) fmt::print("{}", request_table(runs.back()));
    if (json)
      for (const RequestRow& r : runs.back().rows)
        json << request_row_json(name, r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
             << '\n';
  }
  fmt::print("{}", summary_report(runs, o.verify, o.fidelity));
  if (const int64_t bad = nonfinite_requests(runs, full); bad > 0)
    fail(ErrorKind::InvalidInput,
         "{} requests gave non-finite logits (NaN or Inf); the model's weights may be corrupt", bad);
}

}  // namespace

void add_run_command(CLI::App& app) {
  static RunOptions o;
  CLI::App* cmd =
      app.add_subcommand("run", "Process a request stream with reuse strategies and report TTFT and reuse");
  add_model_option(*cmd, o.model_path)->required();
  cmd->add_option("--requests", o.requests_path, "Request file (JSONL, as `workload generate` writes)")
      ->required();
  cmd->add_option(
         "-s,--strategy", o.strategies,
         fmt::format("Strategies, comma-separated: {}, subgcache (query batches clustered by subgraph, "
                     "one prefill per cluster; every other strategy then sees each query's subgraph "
                     "as CSV too)",
                     fmt::join(strategy_names(), ", ")))
      ->capture_default_str();
  add_engine_options(*cmd, o.engine);
  add_stream_options(cmd, o.stream);
  cmd->add_option("-c,--ctx-size", o.ctx,
                  "Rows of the KV pool shared by running requests (default: every request's rows, at most 8x "
                  "the largest request's; at least the largest)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag(
      "--serial", o.serial,
      "One request at a time, each entering when the previous one is done (no queueing, no batching)");
  cmd->add_flag(
      "--sweep-rate", o.sweep,
      "Find, per strategy, the highest Poisson rate whose p99 TTFT stays within the SLO, and print the "
      "curve");
  cmd->add_option("--slo-ms", o.slo_ms,
                  "The SLO of --sweep-rate: p99 TTFT in ms (default: 5x the unloaded p50)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--report", o.report_path,
                  "With --sweep-rate: write the curve here (Markdown) and a PNG beside it");
  cmd->add_option("-n,--max-tokens", o.max_tokens,
                  "Tokens to generate per request (greedy; the first is TTFT)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--warmup", o.warmup_path,
                  "Request file served first, one at a time and unmeasured, by each strategy on its own "
                  "engine (fills the caches the stream starts from)");
  cmd->add_flag("--verify", o.verify,
                "Also prefill every request without reuse and report the largest logit difference");
  cmd->add_flag("--fidelity", o.fidelity,
                "Also answer every request with full attention on the flat prompt and report, per strategy, "
                "first-token agreement, first-token KL divergence, identical continuations and ROUGE-L");
  cmd->add_option("--reference-kv-type", o.reference_kv_type,
                  "KV storage of --fidelity's full answers (default: --kv-type); e.g. --kv-type q8_0 "
                  "--reference-kv-type f16 measures 8-bit KV against f16")
      ->check(CLI::IsMember(kv_type_names()));
  cmd->add_option("--json", o.json_path, "Write per-request rows (JSONL) to this file");
  cmd->add_flag("-q,--quiet", o.quiet, "Print only the summary (no per-request lines)");
  cmd->callback([] { run_command(o); });
}

}  // namespace depcache::cli

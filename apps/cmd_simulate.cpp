// `depcache simulate`: replay a request stream through the real index and
// replacement policies without a model (token counts only) and report the
// token-level and document hit rates; `--grid` runs DepCache's policy ×
// workload × capacity grid and writes a Markdown table (and a PNG plot when
// gnuplot is installed).
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "engine/engine.h"
#include "engine_options.h"
#include "kv/policy.h"
#include "model/model.h"
#include "prompt/prompt_parts.h"
#include "retrieval/knowledge_graph.h"
#include "retrieval/rag_request.h"
#include "retrieval/workload.h"
#include "strategy/scheduler.h"
#include "strategy/simulator.h"
#include "util/error.h"
#include "util/thread_pool.h"
#include "util/timing.h"

namespace depcache::cli {
namespace {

struct SimulateOptions {
  std::string requests_path, kg_path, workload = "zipf", vocab_path, capacity = "20%", policies = "lru",
                                      scheme = "depth", strategy = "depcache";
  std::string report_path, cost_model_path, host_capacity = "0";
  bool swap_out_once = false;
  size_t n_requests = 500, window = 32;
  int threads = 0, starvation_bound = SchedulerOptions{}.starvation_bound;
  double alpha = 0.2;
  uint64_t seed = 1;
  bool grid = false, json = false;
};

// "lacr+lpm" -> policy lacr, scheduler lpm; "lsp" -> lru with lsp.
std::pair<std::string, std::string> parse_policy_spec(const std::string& spec) {
  std::string policy = "lru", scheduler = "fifo";
  std::stringstream ss(spec);
  for (std::string part; std::getline(ss, part, '+');) {
    const auto scheds = scheduler_names();
    if (std::find(scheds.begin(), scheds.end(), part) != scheds.end())
      scheduler = part;
    else
      policy = part;
  }
  make_policy(policy);  // rejects an unknown name with a clear message
  return {policy, scheduler};
}

int64_t parse_capacity(const std::string& s, int64_t distinct) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0 || !std::isfinite(v))
    fail(ErrorKind::InvalidInput, "capacity '{}' is not a token count or a percentage", s);
  if (*end == '%' && end[1] == '\0') return static_cast<int64_t>(v / 100.0 * static_cast<double>(distinct));
  if (*end != '\0') fail(ErrorKind::InvalidInput, "capacity '{}' is not a token count or a percentage", s);
  return static_cast<int64_t>(v);
}

std::vector<SimulatedRequest> prompts_of(const std::vector<RagRequest>& reqs, const Tokenizer& tok,
                                         const RagWrapper& tmpl, const std::string& strategy,
                                         PositionScheme scheme) {
  std::vector<PromptParts> parts;
  parts.reserve(reqs.size());
  for (const RagRequest& r : reqs) parts.push_back(make_prompt_parts(tok, r, tmpl));
  return simulated_requests(parts, strategy, scheme);
}

std::vector<RagRequest> graph_stream(const KnowledgeGraph& kg, const std::vector<GraphQa>& qa,
                                     const std::string& pattern, const SimulateOptions& o) {
  GraphWorkloadOptions w;
  w.n_requests = o.n_requests;
  w.access.pattern = parse_access_pattern(pattern);
  w.seed = o.seed;
  return make_graph_workload(kg, qa, w);
}

// PGDSF's cost model: the prefill cost table profiled on the engine with the
// given model, as `run` profiles it (none without a model).
std::function<double(int64_t, int64_t)> profiled_cost_model(const SimulateOptions& o) {
  if (o.cost_model_path.empty()) return {};
  const auto model = Model::load(o.cost_model_path);
  const int64_t n_ctx = std::clamp<int64_t>(model->config().n_ctx_train, 256, 4096);
  EngineOptions eo;
  eo.pool_rows = n_ctx;
  eo.cache_bytes = 0;
  eo.threads = o.threads;
  Engine engine(model, eo);
  const auto t0 = Clock::now();
  PrefillCostTable table = engine.profile_prefill_cost(n_ctx);
  fmt::print(stderr, "PGDSF prefill cost table of {} ({:.1f} s to measure):\n{}", o.cost_model_path,
             seconds_since(t0), table.to_string());
  return table;
}

SimulationOptions simulation_options(const SimulateOptions& o, const std::string& spec, int64_t capacity,
                                     int64_t distinct, PositionScheme scheme,
                                     const std::function<double(int64_t, int64_t)>& cost) {
  const auto [policy, scheduler] = parse_policy_spec(spec);
  SimulationOptions so;
  so.policy = policy;
  so.scheduler.order = scheduler;
  so.scheduler.starvation_bound = o.starvation_bound;
  so.capacity_tokens = capacity;
  so.host_tokens = parse_capacity(o.host_capacity, distinct);
  so.swap_out_once = o.swap_out_once;
  so.window = o.window;
  so.lacr_alpha = o.alpha;
  so.scheme = scheme;
  so.cost_model = cost;
  return so;
}

struct Cell {
  double token_hit = 0, item_hit = 0;
};

void run_grid(const SimulateOptions& o, const Tokenizer& tok, const RagWrapper& tmpl, PositionScheme scheme,
              const std::function<double(int64_t, int64_t)>& cost) {
  if (o.kg_path.empty()) throw CLI::ValidationError("--grid", "needs --kg to generate the three workloads");
  std::ofstream report;
  if (!o.report_path.empty()) report = open_output(o.report_path);  // fail before the long run
  const KnowledgeGraph kg = KnowledgeGraph::load(o.kg_path);
  GraphQaOptions qopt;
  qopt.seed = o.seed;
  const std::vector<GraphQa> qa = make_graph_qa(kg, qopt);
  const std::vector<std::string> workloads = {"uniform", "temporal", "zipf"};
  const std::vector<std::string> specs = {"lru", "lfu", "pgdsf",    "lacr",
                                          "lpm", "lsp", "lacr+lpm", "lacr+lsp"};
  const std::vector<double> fractions = {0.10, 0.20, 0.40};
  std::map<std::tuple<std::string, double, std::string>, Cell> cells;
  for (const std::string& wl : workloads) {
    const std::vector<SimulatedRequest> prompts =
        prompts_of(graph_stream(kg, qa, wl, o), tok, tmpl, o.strategy, scheme);
    const int64_t distinct = distinct_kv_tokens(prompts);
    for (double f : fractions)
      for (const std::string& spec : specs) {
        const SimulationOptions so = simulation_options(
            o, spec, static_cast<int64_t>(f * static_cast<double>(distinct)), distinct, scheme, cost);
        const auto t0 = Clock::now();
        const SimulationResult r = simulate(prompts, so);
        cells[{wl, f, spec}] = {r.token_hit_rate, r.item_hit_rate};
        fmt::print(stderr, "[grid] {:<8} {:>3.0f}% {:<9} token hit {:5.1f}%  ({:.1f} s)\n", wl, 100 * f, spec,
                   100 * r.token_hit_rate, seconds_since(t0));
      }
  }
  // Markdown: one row per workload × capacity, one column per policy.
  std::string md = fmt::format(
      "Token-level hit rate (%), {} requests per workload, 10 entities × ≤30 two-hop WordNet paths each; "
      "capacity as a share of the workload's distinct KV tokens.\n\n| workload | capacity |",
      o.n_requests);
  for (const std::string& s : specs) md += " " + s + " |";
  md += "\n|---|---|";
  for (size_t i = 0; i < specs.size(); ++i) md += "---|";
  md += "\n";
  std::string dat;  // gnuplot data: one block per workload
  for (const std::string& wl : workloads) {
    for (double f : fractions) {
      md += fmt::format("| {} | {:.0f}% |", wl, 100 * f);
      dat += fmt::format("\"{} {:.0f}%\"", wl, 100 * f);
      for (const std::string& s : specs) {
        md += fmt::format(" {:.1f} |", 100 * cells[{wl, f, s}].token_hit);
        dat += fmt::format(" {:.2f}", 100 * cells[{wl, f, s}].token_hit);
      }
      md += "\n";
      dat += "\n";
    }
  }
  // Mean advantage of LACR over each baseline, as the paper reports it.
  md += "\nLACR minus baseline, mean over workloads and capacities (points):";
  for (const char* base : {"lru", "lfu", "pgdsf", "lpm", "lsp"}) {
    double d = 0;
    for (const auto& wl : workloads)
      for (double f : fractions)
        d += cells[{wl, f, "lacr"}].token_hit - cells[{wl, f, std::string(base)}].token_hit;
    md += fmt::format(" {} {:+.1f};", base, 100 * d / 9);
  }
  md += "\n";
  fmt::print("{}", md);
  if (o.report_path.empty()) return;
  report << md;
  report.close();
  if (!report) fail(ErrorKind::InvalidInput, "writing {} failed", o.report_path);
  fmt::print("wrote {}\n", o.report_path);
  // A bar chart with gnuplot, when it is installed.
  std::string plot =
      "set style data histograms; set style histogram clustered gap 1; set style fill solid 0.8 border -1; "
      "set "
      "ylabel 'token hit rate (%)'; set yrange [0:100]; set xtics rotate by -30; set key outside right; plot "
      "$DATA using 2:xtic(1) title 'lru'";
  for (size_t i = 1; i < specs.size(); ++i) plot += fmt::format(", '' using {} title '{}'", i + 2, specs[i]);
  plot_beside(o.report_path, dat, plot);
}

void print_result(const SimulateOptions& o, const std::string& spec, const SimulationResult& r,
                  int64_t capacity, int64_t distinct) {
  if (o.json) {
    fmt::print("{}\n", nlohmann::json{{"policy", spec},
                                      {"requests", r.n_requests},
                                      {"capacity_tokens", capacity},
                                      {"distinct_kv_tokens", distinct},
                                      {"token_hit_rate", r.token_hit_rate},
                                      {"item_hit_rate", r.item_hit_rate},
                                      {"prompt_tokens", r.prompt_tokens},
                                      {"cached_tokens", r.cached_tokens},
                                      {"evicted_nodes", r.evicted_nodes},
                                      {"swapped_out_tokens", r.swapped_out_tokens},
                                      {"swap_outs_saved", r.swap_outs_saved}}
                           .dump());
  } else {
    fmt::print("{:<10} token hit rate {:5.1f}%   document hit rate {:5.1f}%   ({} nodes evicted", spec,
               100 * r.token_hit_rate, 100 * r.item_hit_rate, r.evicted_nodes);
    if (o.host_capacity != "0")
      fmt::print("; {} tokens swapped out, {} swap-outs saved", r.swapped_out_tokens, r.swap_outs_saved);
    fmt::print(")\n");
  }
}

void run_simulate(const SimulateOptions& o) {
  const Tokenizer tok = tokenizer_from(o.vocab_path);
  const RagWrapper tmpl = rag_wrapper_from(o.vocab_path);
  const PositionScheme scheme = *parse_position_scheme(o.scheme);
  for (const std::string& spec : split_list(o.grid ? "pgdsf" : o.policies))
    if (parse_policy_spec(spec).first == "pgdsf" && o.cost_model_path.empty())
      throw CLI::ValidationError("--cost-model",
                                 "pgdsf ranks by a profiled prefill cost table: give a model");
  const auto cost = profiled_cost_model(o);
  if (o.grid) return run_grid(o, tok, tmpl, scheme, cost);
  if (o.requests_path.empty() && o.kg_path.empty()) throw CLI::ValidationError("give --requests or --kg");
  std::vector<RagRequest> reqs;
  if (!o.requests_path.empty()) {
    reqs = read_requests(o.requests_path);
  } else {
    const KnowledgeGraph graph = KnowledgeGraph::load(o.kg_path);
    GraphQaOptions qopt;
    qopt.seed = o.seed;
    reqs = graph_stream(graph, make_graph_qa(graph, qopt), o.workload, o);
  }
  const std::vector<SimulatedRequest> prompts = prompts_of(reqs, tok, tmpl, o.strategy, scheme);
  const int64_t distinct = distinct_kv_tokens(prompts);
  const int64_t capacity = parse_capacity(o.capacity, distinct);
  if (!o.json)
    fmt::print("{} requests; distinct KV {} tokens; capacity {} tokens ({:.1f}%)\n", reqs.size(), distinct,
               capacity,
               distinct ? 100.0 * static_cast<double>(capacity) / static_cast<double>(distinct) : 0.0);
  for (const std::string& spec : split_list(o.policies)) {
    const SimulationResult r =
        simulate(prompts, simulation_options(o, spec, capacity, distinct, scheme, cost));
    print_result(o, spec, r, capacity, distinct);
  }
}

void add_simulate_options(CLI::App* cmd, SimulateOptions& o) {
  auto* req = cmd->add_option("--requests", o.requests_path, "Request file (JSONL) to replay");
  auto* kg =
      cmd->add_option("--kg", o.kg_path, "KG file: generate the stream (DepCache's synthetic GraphRAG QA)");
  req->excludes(kg);
  cmd->add_option("--workload", o.workload, "With --kg: uniform, temporal or zipf")
      ->capture_default_str()
      ->check(CLI::IsMember({"uniform", "temporal", "zipf"}));
  cmd->add_option("--count", o.n_requests, "With --kg: requests in the stream")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o.seed, "With --kg: seed")->capture_default_str();
  cmd->add_option("--vocab", o.vocab_path,
                  "GGUF file whose tokenizer counts tokens (default: built-in bytes)");
  cmd->add_option("--capacity", o.capacity,
                  "Index budget: tokens, or a percentage of the stream's distinct KV tokens")
      ->capture_default_str();
  cmd->add_option("--policy", o.policies,
                  "Policies, comma-separated: lru, lfu, gdsf, gdsf-size, pgdsf, lacr, cachecraft, optionally "
                  "+lpm, +lsp "
                  "or +ragcache "
                  "scheduling (a scheduler alone uses lru)")
      ->capture_default_str();
  cmd->add_option("--host-capacity", o.host_capacity,
                  "A host tier below the index: tokens, or a percentage of the stream's distinct KV tokens "
                  "(0: none); hits in either tier count")
      ->capture_default_str();
  cmd->add_flag("--swap-out-once", o.swap_out_once,
                "The host tier keeps a copy of what it gave back to the hot tier (RAGCache)");
  cmd->add_option("--cost-model", o.cost_model_path,
                  "GGUF model whose prefill cost table (T(cached, new), profiled on this machine) PGDSF "
                  "ranks by; required by pgdsf")
      ->check(CLI::ExistingFile);
  add_threads_option(*cmd, o.threads);
  add_window_option(*cmd, o.window);
  add_starvation_bound_option(*cmd, o.starvation_bound);
  cmd->add_option("--alpha", o.alpha, "LACR's α (history weight)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--strategy", o.strategy,
                  fmt::format("Strategy whose lookups are replayed: {}", fmt::join(strategy_names(), ", ")))
      ->capture_default_str()
      ->check(CLI::IsMember(strategy_names()));
  cmd->add_option("--scheme", o.scheme, "Position scheme of the keys: depth, sequential or stacked")
      ->capture_default_str()
      ->check(CLI::IsMember({"depth", "sequential", "stacked"}));
  cmd->add_flag("--grid", o.grid,
                "Run policies {lru, lfu, pgdsf, lacr, lpm, lsp, lacr+lpm, lacr+lsp} × workloads × capacities "
                "{10, 20, 40}% (needs --kg)");
  cmd->add_option("--report", o.report_path,
                  "With --grid: write the Markdown table here (and a PNG beside it)");
  cmd->add_flag("--json", o.json, "Print one JSON object per policy");
}

}  // namespace

void add_simulate_command(CLI::App& app) {
  static SimulateOptions o;
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Replay a request stream through the KV index and a replacement policy (no model)");
  add_simulate_options(cmd, o);
  cmd->callback([] { run_simulate(o); });
}

}  // namespace depcache::cli

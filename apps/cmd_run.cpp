// `depcache run`: process a request stream with one or more strategies and
// report, per request, TTFT and what was computed versus reused, then a
// side-by-side summary.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "cli_common.h"
#include "commands.h"
#include "compute/sampling.h"
#include "engine/cost_profile.h"
#include "engine/engine.h"
#include "engine/fidelity.h"
#include "exec/forward.h"
#include "exec/kv_assembly.h"
#include "kv/disk_store.h"
#include "kv/policy.h"
#include "kv/remote_store.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "retrieval/rag_request.h"
#include "retrieval/workload.h"
#include "strategy/lookahead.h"
#include "strategy/strategy.h"
#include "strategy/subgcache.h"
#include "tier_options.h"
#include "train/qa_sequences.h"
#include "util/error.h"
#include "util/numeric.h"
#include "util/thread_pool.h"
#include "util/timing.h"

namespace depcache::cli {
namespace {

struct RunOptions {
  std::string policy = "lru";
  std::string model_path, requests_path, strategies = "depcache", kv_type = "f16", scheme = "auto", json_path;
  int threads = 0;
  int64_t ctx = 0;
  double cache_mib = 1024;
  TierOptions tiers;
  size_t prefetch = 0, window = 32;
  size_t limit = 0;
  int max_tokens = 1;
  int64_t batch_tokens = 512;
  size_t max_running = 0;
  bool no_wait_for_shared = false;
  std::string scheduler = "fifo";
  int starvation_bound = 32;
  double rate = 0, rate_scale = 1;
  uint64_t seed = 1;
  bool quiet = false, verify = false, no_reuse = false, no_realign = false, fidelity = false, serial = false,
       sweep = false;
  double slo_ms = 0;
  StrategyOptions chunk;  // every strategy's options but the scheme, reuse and realignment (set per run)
  std::string report_path;
  std::string warmup_path;
  std::string graph_format = "auto";
  std::string tree_context = "auto";
  SubgcacheOptions subgcache;
};

// Full attention's answer to a request (--fidelity): what every strategy is
// compared with.
struct FullAnswer {
  std::vector<float> first_logits;
  std::vector<int32_t> tokens;
  bool finite = true;  // every logits row of it
};

struct RequestRow {
  std::string id;
  double ttft_ms = 0, total_ms = 0;
  PrefillReport report;
  std::vector<int32_t> output;
  double logit_diff = -1;  // --verify: max |logit - logit without reuse| (+inf: not finite)
  bool top1_agrees = true;
  bool finite = true;  // every logit of the request was finite
  // What the index could not keep while serving this request.
  int64_t oversized_spans = 0;        // spans larger than a tier's budget
  int64_t disk_write_failures = 0;    // spans the disk tier failed to write
  std::optional<Fidelity> fidelity;   // --fidelity: against full attention
  std::optional<std::string> answer;  // what the output answers, for requests with reference answers
  bool exact_match = false;
  double f1 = 0;
};

struct StrategyRun {
  std::string name;
  std::vector<RequestRow> rows;
  size_t cached_bytes = 0;
  int64_t evicted = 0;
  RadixIndex::Stats stats;
  bool tiered = false;
  int64_t prefetched = 0;  // tokens the prefetcher brought to the hot tier
  int64_t pool_rows = 0, preemptions = 0;
  double wall_s = 0;  // from the start of the replay to the last token
};

class Progress {
 public:
  Progress(std::string label, size_t total)
      : label_(std::move(label)), total_(total), tty_(isatty(fileno(stderr)) != 0) {}
  void step(size_t done) {
    if (tty_) {
      fmt::print(stderr, "\r[{}] {}/{} requests", label_, done, total_);
      if (done == total_) fmt::print(stderr, "\n");
    } else if (done == total_ || done % std::max<size_t>(1, total_ / 10) == 0) {
      fmt::print(stderr, "[{}] {}/{} requests\n", label_, done, total_);
    }
  }

 private:
  std::string label_;
  size_t total_;
  bool tty_;
};

// Full attention over the flat prompt of every request, n greedy tokens each.
std::vector<FullAnswer> full_answers(const std::vector<RagRequest>& reqs, const Tokenizer& tok,
                                     const std::shared_ptr<const Model>& model, DType kv_type, int64_t n_ctx,
                                     int n, int threads) {
  EngineOptions eo;
  eo.pool_rows = n_ctx;
  eo.kv_type = kv_type;
  eo.cache_bytes = 0;
  eo.threads = threads;
  Engine engine(model, eo);
  SamplingParams sampling;
  sampling.max_tokens = n;
  sampling.stop_at_eog = false;
  Progress progress("full attention, for fidelity", reqs.size());
  std::vector<FullAnswer> out;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestId id =
        engine.submit("full", make_prompt_parts(tok, reqs[i], model->config().prompt), sampling);
    const RequestResult& r = engine.wait(id);
    out.push_back({r.report.logits, r.tokens, r.finite});
    engine.forget(id);
    progress.step(i + 1);
  }
  return out;
}

RadixIndex::Stats stats_of(const RadixIndex& index) {
  const auto lk = index.lock();  // the prefetcher may be moving spans
  return index.stats();
}

StrategyRun run_strategy(const std::string& name, const std::vector<RagRequest>& reqs,
                         const std::vector<PromptParts>& parts, const std::shared_ptr<const Model>& model,
                         const RunOptions& o, int64_t pool_rows, PositionScheme scheme,
                         const std::vector<FullAnswer>* full,
                         const std::vector<PromptParts>* warmup = nullptr) {
  const DType kv_type = parse_kv_type(o.kv_type);
  // SubGCache's queries arrive rewritten (their cluster's representative
  // subgraph as context, in cluster order): the engine reuses it as a prefix.
  const std::string engine_strategy = name == "subgcache" ? "prefix" : name;
  EngineOptions eo;
  eo.pool_rows = pool_rows;
  eo.kv_type = kv_type;
  eo.cache_bytes = static_cast<size_t>(o.cache_mib * 1048576.0);
  eo.policy = o.policy;
  eo.strategy = o.chunk;
  eo.strategy.scheme = scheme;
  eo.strategy.reuse = !o.no_reuse;
  eo.strategy.realign = !o.no_realign;
  eo.batch_tokens = o.batch_tokens;
  eo.max_running = o.max_running;
  eo.wait_for_shared = !o.no_wait_for_shared;
  eo.threads = o.threads;
  eo.window = o.window;
  eo.prefetch = o.no_reuse ? 0 : o.prefetch;
  eo.scheduler = {o.scheduler, o.starvation_bound};
  Engine engine(model, eo);
  RadixIndex& index = engine.index();
  // Lower tiers: the stores outlive nothing but this run.
  const LowerTiers tiers(index, o.tiers, fmt::format("[{}] ", name));
  if (tiers.disk())
    if (const size_t dropped = engine.load_strategy_state(o.tiers.cache_dir); dropped > 0)
      fmt::print(stderr, "[{}] warning: {} unreadable strategy records in {} dropped\n", name, dropped,
                 o.tiers.cache_dir);
  if (o.policy == "pgdsf" && !o.no_reuse && name != "full") {
    // PGDSF's cost of a node: the measured time to recompute its tokens after its context.
    const auto t0 = Clock::now();
    const PrefillCostTable table = engine.profile_prefill_cost(std::min<int64_t>(pool_rows, 4096));
    fmt::print(stderr, "[{}] PGDSF prefill cost table ({:.1f} s to measure):\n{}", name, seconds_since(t0),
               table.to_string());
    index.set_cost_model(table);
  }

  SamplingParams sampling;
  sampling.max_tokens = o.max_tokens;
  sampling.stop_at_eog = false;  // exactly -n tokens, for comparable figures
  if (warmup != nullptr && !warmup->empty()) {
    // Served before the stream, one at a time and unmeasured: what they
    // leave in the caches (and, for cachecraft, the variants' metadata) is
    // what the stream starts from.
    Progress warming(name + " warm-up", warmup->size());
    size_t n = 0;
    for (const PromptParts& p : *warmup) {
      const RequestId id = engine.submit(engine_strategy, p, sampling);
      engine.run_until_idle();
      if (engine.result(id).state != RequestState::Finished)
        fail(ErrorKind::Internal, "a warm-up request did not finish: {}", engine.result(id).error);
      engine.forget(id);
      warming.step(++n);
    }
  }
  StrategyRun run{name, {}, 0, 0, {}, o.tiers.any()};
  run.rows.resize(reqs.size());
  std::vector<RequestId> ids(reqs.size(), 0);
  std::vector<Clock::time_point> arrived(reqs.size());
  Progress progress(name, reqs.size());
  size_t done = 0;
  // What the index could not keep, charged to the requests whose prefill
  // finished when it happened.
  RadixIndex::Stats last = stats_of(index);
  const auto on_token = [&](size_t i) {
    return [&, i](const TokenEvent& e) {
      if (e.index == 0) {
        const RadixIndex::Stats now = stats_of(index);
        for (int t = 0; t < RadixIndex::kTiers; ++t)
          run.rows[i].oversized_spans += now.oversized[t] - last.oversized[t];
        run.rows[i].disk_write_failures = now.disk_write_failures - last.disk_write_failures;
        last = now;
      }
      if (e.last) progress.step(++done);
    };
  };
  // Open-loop replay: a request enters at its arrival time (or, --serial,
  // when the one before it is done), and its latencies count from then.
  const auto start = Clock::now();
  size_t next = 0;
  const auto submit = [&](size_t i) {
    arrived[i] = o.serial ? Clock::now()
                          : start + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(reqs[i].arrival_s));
    ids[i] = engine.submit(engine_strategy, parts[i], sampling, on_token(i));
  };
  while (next < reqs.size() || engine.n_waiting() + engine.n_running() > 0) {
    if (o.serial) {
      if (engine.n_waiting() + engine.n_running() == 0) submit(next++);
    } else {
      const double now_s = seconds_since(start);
      while (next < reqs.size() && reqs[next].arrival_s <= now_s) submit(next++);
    }
    if (!engine.step() && next < reqs.size() && !o.serial) {
      const double wait_s = reqs[next].arrival_s - seconds_since(start);
      if (wait_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait_s, 0.05)));
    }
  }
  run.wall_s = seconds_since(start);

  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestResult& r = engine.result(ids[i]);
    if (r.state != RequestState::Finished)
      fail(ErrorKind::Internal, "request {} did not finish: {}", reqs[i].id, r.error);
    RequestRow& row = run.rows[i];
    row.id = reqs[i].id;
    row.report = r.report;
    row.output = r.tokens;
    row.finite = r.finite;
    row.ttft_ms = std::chrono::duration<double, std::milli>(r.first_token - arrived[i]).count();
    row.total_ms = std::chrono::duration<double, std::milli>(r.done - arrived[i]).count();
    if (full) {
      row.fidelity =
          compare_to_full((*full)[i].first_logits, (*full)[i].tokens, row.report.logits, row.output);
      if (!row.finite || !(*full)[i].finite) *row.fidelity = Fidelity{false, INFINITY, false, 0.0};
    }
    if (o.verify) {
      // The same strategy without reuse: its prompt computed alone.
      SamplingParams first;
      first.max_tokens = 1;
      const RequestId alone = engine.submit(engine_strategy, parts[i], first, {}, CacheUse::None);
      const PrefillReport ref = engine.wait(alone).report;
      engine.forget(alone);
      row.logit_diff =
          max_abs_difference(std::span<const float>(ref.logits), std::span<const float>(row.report.logits));
      row.top1_agrees = row.finite && argmax(ref.logits) == row.output.front();
    }
  }
  run.prefetched = engine.prefetched_tokens();
  run.pool_rows = engine.pool().n_rows();
  run.preemptions = engine.preemptions();
  run.cached_bytes = index.bytes();
  run.evicted = index.n_evicted();
  if (tiers.disk()) {  // the next process starts from what this one computed
    index.persist();
    engine.save_strategy_state(o.tiers.cache_dir);
  }
  run.stats = index.stats();
  return run;
}

nlohmann::json row_json(const std::string& strategy, const RequestRow& r) {
  nlohmann::json j = {{"strategy", strategy},
                      {"id", r.id},
                      {"ttft_ms", r.ttft_ms},
                      {"total_ms", r.total_ms},
                      {"prompt_tokens", r.report.prompt_tokens},
                      {"flat_tokens", r.report.flat_tokens},
                      {"computed_tokens", r.report.computed_tokens},
                      {"reused_tokens", r.report.reused_tokens},
                      {"attention_pairs", r.report.attention_pairs},
                      {"load_ms", r.report.load_ms},
                      {"layer_wait_ms", r.report.layer_wait_ms},
                      {"found_in",
                       {{"hot", r.report.reused_from[0]},
                        {"host", r.report.reused_from[1]},
                        {"disk", r.report.reused_from[2]},
                        {"remote", r.report.reused_from[3]}}},
                      {"output", r.output}};
  j["logits_finite"] = r.finite;
  j["oversized_spans"] = r.oversized_spans;
  j["disk_write_failures"] = r.disk_write_failures;
  if (r.answer) {
    j["answer"] = *r.answer;
    j["exact_match"] = r.exact_match;
    j["f1"] = r.f1;
  }
  if (r.fidelity) {
    const Fidelity& f = *r.fidelity;
    j["fidelity"] = {{"first_token_agrees", f.first_token_agrees},
                     {"kl_first_token",
                      std::isfinite(f.kl_first_token) ? nlohmann::json(f.kl_first_token) : nlohmann::json()},
                     {"identical_continuation", f.identical},
                     {"rouge_l", f.rouge_l}};
  }
  if (r.logit_diff >= 0) {
    // JSON has no infinity: a non-finite difference is null, never a number.
    j["max_logit_diff_vs_no_reuse"] =
        std::isfinite(r.logit_diff) ? nlohmann::json(r.logit_diff) : nlohmann::json();
    j["top1_agrees_with_no_reuse"] = r.top1_agrees;
  }
  return j;
}

std::vector<double> ttfts(const StrategyRun& run) {
  std::vector<double> t;
  for (const RequestRow& r : run.rows) t.push_back(r.ttft_ms);
  return t;
}

// --sweep-rate: per strategy, the unloaded TTFT (one request at a time),
// the SLO (--slo-ms, default 5x that p50, as RAGCache defines throughput),
// then Poisson replays at rising rates — doubling from the unloaded
// throughput until p99 TTFT breaks the SLO, then bisecting — and the
// highest rate that kept it. Prints the curve; --report writes it as
// Markdown and a PNG.
void sweep_rates(const std::vector<std::string>& names, const std::vector<RagRequest>& reqs,
                 const std::vector<PromptParts>& parts, const std::shared_ptr<const Model>& model,
                 const RunOptions& o, int64_t pool_rows, PositionScheme scheme) {
  RunOptions quiet = o;
  quiet.verify = quiet.fidelity = false;
  std::string md =
      "| strategy | unloaded TTFT p50 | SLO (p99 TTFT) | highest rate within it | served there "
      "|\n|---|---|---|---|---|\n";
  std::string curve =
      "| strategy | offered req/s | TTFT p50 | TTFT p99 | served req/s | within SLO "
      "|\n|---|---|---|---|---|---|\n";
  std::string data;  // gnuplot: one block per strategy, "rate p99"
  for (const std::string& name : names) {
    quiet.serial = true;
    const StrategyRun unloaded = run_strategy(name, reqs, parts, model, quiet, pool_rows, scheme, nullptr);
    const double p50 = percentile(ttfts(unloaded), 50);
    const double slo = o.slo_ms > 0 ? o.slo_ms : 5 * p50;
    const double serial_rate = static_cast<double>(reqs.size()) / unloaded.wall_s;
    quiet.serial = false;
    std::map<double, std::pair<double, double>> points;  // rate -> (p99, served req/s)
    const auto replay = [&](double rate) {
      std::vector<RagRequest> at = reqs;
      const std::vector<double> arrivals = poisson_arrivals(at.size(), rate, o.seed);
      for (size_t i = 0; i < at.size(); ++i) at[i].arrival_s = arrivals[i];
      const StrategyRun run = run_strategy(name, at, parts, model, quiet, pool_rows, scheme, nullptr);
      const std::vector<double> t = ttfts(run);
      const double p99 = percentile(t, 99), served = static_cast<double>(at.size()) / run.wall_s;
      points[rate] = {p99, served};
      curve += fmt::format("| {} | {:.2f} | {:.1f}ms | {:.1f}ms | {:.2f} | {} |\n", name, rate,
                           percentile(t, 50), p99, served, p99 <= slo ? "yes" : "no");
      return p99 <= slo;
    };
    double good = 0, bad = 0, rate = serial_rate;
    for (int i = 0; i < 10 && bad == 0; ++i, rate *= 2) (replay(rate) ? good : bad) = rate;
    if (good == 0) {  // even the unloaded rate breaks it: search below
      for (int i = 0; i < 10 && good == 0; ++i) {
        rate = bad / 2;
        (replay(rate) ? good : bad) = rate;
      }
    }
    for (int i = 0; i < 3 && good > 0 && bad > 0; ++i) {
      const double mid = (good + bad) / 2;
      (replay(mid) ? good : bad) = mid;
    }
    md += fmt::format("| {} | {:.1f}ms | {:.1f}ms | {} | {} |\n", name, p50, slo,
                      good > 0 ? fmt::format("{:.2f} req/s", good) : "none",
                      good > 0 ? fmt::format("{:.2f} req/s", points[good].second) : "-");
    data += fmt::format("# {}\n", name);
    for (const auto& [r, pt] : points) data += fmt::format("{} {}\n", r, pt.first);
    data += "\n\n";
  }
  const std::string report = fmt::format(
      "Rate sweep: {} requests, Poisson arrivals (seed {}); SLO: p99 TTFT within {} \n\n{}\n{}", reqs.size(),
      o.seed, o.slo_ms > 0 ? fmt::format("{} ms", o.slo_ms) : std::string("5x the unloaded p50"), md, curve);
  fmt::print("\n{}", report);
  if (o.report_path.empty()) return;
  open_output(o.report_path) << report;
  fmt::print("wrote {}\n", o.report_path);
  std::string plot =
      "set logscale xy; set xlabel 'offered load (req/s)'; set ylabel 'TTFT p99 (ms)'; set key outside "
      "right; plot ";
  for (size_t i = 0; i < names.size(); ++i)
    plot += fmt::format("{}$DATA index {} using 1:2 with linespoints title '{}'", i ? ", " : "", i, names[i]);
  plot_beside(o.report_path, data, plot);
}

void print_summary(const std::vector<StrategyRun>& runs, bool verify, bool fidelity) {
  fmt::print("\n{:<10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>10} {:>10} {:>9} {:>13}{}{}\n",
             "strategy", "requests", "TTFT p50", "TTFT p99", "TTFT mean", "e2e p50", "req/s", "tok/s",
             "prompt", "computed", "reused", "hit rate", "attn pairs",
             verify ? "  max |dlogit|  top-1 agree" : "",
             fidelity ? "  1st token   KL mean  identical  ROUGE-L" : "");
  for (const StrategyRun& run : runs) {
    const std::vector<double> ttft = ttfts(run);
    std::vector<double> e2e;
    double hit = 0, max_diff = 0;
    int64_t prompt = 0, computed = 0, reused = 0, pairs = 0, agree = 0, generated = 0;
    for (const RequestRow& r : run.rows) {
      e2e.push_back(r.total_ms);
      generated += static_cast<int64_t>(r.output.size());
      prompt += r.report.prompt_tokens;
      computed += r.report.computed_tokens;
      reused += r.report.reused_tokens;
      pairs += r.report.attention_pairs;
      hit += static_cast<double>(r.report.reused_tokens) / static_cast<double>(r.report.prompt_tokens);
      max_diff = std::max(max_diff, r.logit_diff);
      agree += r.top1_agrees;
    }
    const auto n = static_cast<double>(run.rows.size());
    double mean = 0;
    for (double t : ttft) mean += t / n;
    fmt::print(
        "{:<10} {:>8} {:>8.1f}ms {:>8.1f}ms {:>8.1f}ms {:>8.1f}ms {:>8.2f} {:>8.1f} {:>9} {:>10} {:>10} "
        "{:>8.1f}% "
        "{:>13}",
        run.name, run.rows.size(), percentile(ttft, 50), percentile(ttft, 99), mean, percentile(e2e, 50),
        n / run.wall_s, static_cast<double>(generated) / run.wall_s, prompt, computed, reused,
        100.0 * hit / n, pairs);
    if (verify) fmt::print("  {:>13.2e}  {:>5}/{}", max_diff, agree, run.rows.size());
    if (fidelity) {
      int64_t first = 0, identical = 0;
      double kl = 0, rouge = 0;
      for (const RequestRow& r : run.rows) {
        first += r.fidelity->first_token_agrees;
        identical += r.fidelity->identical;
        kl += r.fidelity->kl_first_token / n;
        rouge += r.fidelity->rouge_l / n;
      }
      fmt::print("  {:>6}/{:<3} {:>9.2e} {:>6}/{:<3} {:>8.3f}", first, run.rows.size(), kl, identical,
                 run.rows.size(), rouge);
    }
    fmt::print("\n");
  }
  fmt::print(
      "TTFT and e2e (end-to-end latency) from each request's arrival; req/s and tok/s (generated) over the "
      "replay's wall time. hit rate: reused / prompt tokens per request, averaged. attn pairs: (query, key) "
      "pairs per layer.\n");
  if (fidelity)
    fmt::print(
        "fidelity, against full attention on the flat prompt: same first token; KL(full || strategy) of the "
        "first-token distributions (mean); identical greedy continuations; token ROUGE-L of the "
        "continuations (mean).\n");
  std::map<std::string, double> f1_of;
  for (const StrategyRun& run : runs) {
    int64_t asked = 0, right = 0;
    double f1 = 0;
    for (const RequestRow& r : run.rows) {
      asked += r.answer.has_value();
      right += r.exact_match;
      f1 += r.f1;
    }
    if (asked == 0) continue;
    f1 /= static_cast<double>(asked);
    f1_of[run.name] = f1;
    fmt::print(
        "{:<10} answers: {} of {} exact ({:.1f}%), token F1 {:.3f}; greedy output up to a newline or end of "
        "generation\n",
        run.name, right, asked, 100.0 * static_cast<double>(right) / static_cast<double>(asked), f1);
  }
  // FusionRAG's normalized F1: where a strategy sits between full reuse (0)
  // and full attention (1). Undefined when the two are closer than
  // kMinF1Gap: the ratio would be noise (bench/chunks.sh applies the same
  // rule to its separate runs).
  constexpr double kMinF1Gap = 0.01;
  if (f1_of.count("full") && f1_of.count("fullreuse")) {
    const double span = f1_of["full"] - f1_of["fullreuse"];
    for (const auto& [name, f1] : f1_of) {
      if (name == "full" || name == "fullreuse") continue;
      if (std::abs(span) < kMinF1Gap)
        fmt::print("{:<10} normalized F1: undefined (full and fullreuse are within {} F1)\n", name,
                   kMinF1Gap);
      else
        fmt::print("{:<10} normalized F1 (F1 - F1 fullreuse) / (F1 full - F1 fullreuse): {:.3f}\n", name,
                   (f1 - f1_of["fullreuse"]) / span);
    }
  }
  for (const StrategyRun& run : runs) {
    const RadixIndex::Stats& s = run.stats;
    const int64_t nonfinite =
        std::count_if(run.rows.begin(), run.rows.end(), [](const RequestRow& r) { return !r.finite; });
    if (nonfinite > 0)
      fmt::print("{:<10} warning: {} of {} requests gave non-finite logits (NaN or Inf)\n", run.name,
                 nonfinite, run.rows.size());
    if (s.oversized[0] > 0)
      fmt::print(
          "{:<10} warning: {} spans were not cached: each alone is larger than the hot tier (--cache-mib)\n",
          run.name, s.oversized[0]);
    if (s.oversized[2] > 0)
      fmt::print(
          "{:<10} warning: {} spans were dropped instead of written: each alone is larger than the disk tier "
          "(--disk-mib)\n",
          run.name, s.oversized[2]);
    if (s.disk_write_failures > 0)
      fmt::print(
          "{:<10} warning: {} spans could not be written to the disk tier (disk full or not writable)\n",
          run.name, s.disk_write_failures);
    if (run.preemptions > 0)
      fmt::print(
          "{:<10} note: the KV pool ({} rows) ran out {} times; the latest admitted requests gave their rows "
          "back and were prefilled again (-c/--ctx-size raises it)\n",
          run.name, run.pool_rows, run.preemptions);
    if (!run.tiered) continue;
    fmt::print(
        "{:<10} tiers: matched tokens hot {} / host {} / disk {} / remote {}; loaded {:.1f} MiB in {:.1f} "
        "ms ({} spans layer by layer, {:.1f} ms waited for layers); "
        "demoted hot {} host {}; swapped out {:.1f} MiB ({} evictions found a host copy); bad records "
        "dropped "
        "{}; blocks published {}; prefetched {} tokens; disk "
        "write failures {}; oversized spans hot {} disk {}\n",
        run.name, s.hit_tokens[0], s.hit_tokens[1], s.hit_tokens[2], s.hit_tokens[3],
        s.promoted_bytes / 1048576.0, s.load_ms, s.layered_loads, s.layer_wait_ms, s.demoted[0], s.demoted[1],
        s.swapped_out_bytes / 1048576.0, s.swap_outs_saved, s.dropped_bad, s.remote_published, run.prefetched,
        s.disk_write_failures, s.oversized[0], s.oversized[2]);
  }
}

}  // namespace

void add_run_command(CLI::App& app) {
  static RunOptions o;
  CLI::App* cmd =
      app.add_subcommand("run", "Process a request stream with reuse strategies and report TTFT and reuse");
  cmd->add_option("-m,--model", o.model_path, "GGUF model file")->required();
  cmd->add_option("--requests", o.requests_path, "Request file (JSONL, as `workload generate` writes)")
      ->required();
  cmd->add_option(
         "-s,--strategy", o.strategies,
         fmt::format("Strategies, comma-separated: {}, subgcache (query batches clustered by subgraph, "
                     "one prefill per cluster; every other strategy then sees each query's subgraph "
                     "as CSV too)",
                     fmt::join(strategy_names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--graph-format", o.graph_format,
                  "How requests with entities show their graph: paths (relation paths, one tree per entity), "
                  "csv (the request's subgraph as G-Retriever CSV, SubGCache's form), auto (csv when "
                  "subgcache is in the run, else paths)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "paths", "csv"}));
  add_chunk_options(cmd, o.chunk);
  add_subgcache_options(cmd, o.subgcache);
  cmd->add_option("--query-batch", o.subgcache.batch,
                  "subgcache: queries clustered together (consecutive in arrival order; a batch is served "
                  "once its last query has arrived)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--scheme", o.scheme,
                  "depcache positions: auto (the model's depcache.position_scheme, else sequential), "
                  "sequential or stacked (closer to full attention; moved subtrees reused approximately), "
                  "depth (exact reuse, further from full attention)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "depth", "sequential", "stacked"}));
  cmd->add_option("--tree-context", o.tree_context,
                  "depcache: what a context tree sees besides itself: auto (the model's "
                  "depcache.tree_context, else system), system (the system text, as DepCache lays it out) or "
                  "none (for a model trained so: a moved tree is then reused exactly)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "system", "none"}));
  cmd->add_option("--kv-type", o.kv_type, "KV storage: f16 or f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "f32"}));
  cmd->add_option("--cache-mib", o.cache_mib, "Byte budget of the KV index in MiB (LRU beyond it)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1048576.0));
  add_tier_options(*cmd, o.tiers);
  cmd->add_option("--prefetch", o.prefetch,
                  "Waiting requests whose spans are loaded into the hot tier while a step computes")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--window", o.window, "Queued requests LACR's lookahead sees")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--policy", o.policy,
                  "Replacement policy of the index: lru, lfu, gdsf, pgdsf, lacr, cachecraft")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o.ctx,
                  "Rows of the KV pool shared by running requests (default: every request's rows, at most 8x "
                  "the largest request's; at least the largest)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch-tokens", o.batch_tokens,
                  "Tokens computed in one forward pass: a decode token of every running request, the rest "
                  "prefill (longer prompts are split over several passes)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--max-running", o.max_running,
                  "Requests in flight at most, the others queueing (default 0: as many as the pool holds; 1: "
                  "one at a time)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--no-wait-for-shared", o.no_wait_for_shared,
                "Admit a request beside a prefill under way that computes some of its tokens (by default it "
                "waits for that prefill and reuses them)");
  cmd->add_flag(
      "--serial", o.serial,
      "One request at a time, each entering when the previous one is done (no queueing, no batching)");
  cmd->add_option("--scheduler", o.scheduler,
                  "Order of admission among the first --window waiting requests: fifo, lpm, lsp, ragcache")
      ->capture_default_str()
      ->check(CLI::IsMember({"fifo", "lpm", "lsp", "ragcache"}));
  cmd->add_option("--starvation-bound", o.starvation_bound,
                  "A waiting request passed over this many times goes next (all orders but fifo)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--rate", o.rate,
                  "Poisson arrivals at this many requests/s instead of the file's arrival times")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--rate-scale", o.rate_scale, "Divide the file's arrival times by this (2: twice the load)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", o.seed, "Seed of --rate's arrivals")->capture_default_str();
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
  cmd->add_option("--limit", o.limit, "Process at most this many requests (0: all)")->capture_default_str();
  cmd->add_option("--warmup", o.warmup_path,
                  "Request file served first, one at a time and unmeasured, by each strategy on its own "
                  "engine (fills the caches the stream starts from)");
  cmd->add_option("-t,--threads", o.threads, "Threads (default: one per core)");
  cmd->add_flag("--no-reuse", o.no_reuse,
                "Never look up or insert KV (depcache: dependency attention alone)");
  cmd->add_flag("--verify", o.verify,
                "Also prefill every request without reuse and report the largest logit difference");
  cmd->add_flag("--fidelity", o.fidelity,
                "Also answer every request with full attention on the flat prompt and report, per strategy, "
                "first-token agreement, first-token KL divergence, identical continuations and ROUGE-L");
  cmd->add_option("--json", o.json_path, "Write per-request rows (JSONL) to this file");
  cmd->add_flag("-q,--quiet", o.quiet, "Print only the summary (no per-request lines)");
  cmd->add_flag("--no-realign", o.no_realign,
                "depcache and the chunk strategies: reuse cached KV at the positions it was computed at, "
                "without re-encoding the keys at their new positions (an ablation: what position alignment "
                "is worth)");
  cmd->callback([] {
    const std::vector<std::string> names = split_list(o.strategies);
    if (names.empty()) throw CLI::ValidationError("--strategy", "give at least one strategy");
    const auto known = request_strategy_names();
    for (const std::string& s : names)
      if (std::find(known.begin(), known.end(), s) == known.end())
        fail(ErrorKind::InvalidInput, "unknown strategy '{}' (expected {})", s, fmt::join(known, ", "));
    const bool subgcache = std::find(names.begin(), names.end(), kSubgcache) != names.end();
    if (subgcache && o.sweep)
      throw CLI::ValidationError("--sweep-rate", "subgcache serves query batches; sweep the others");
    make_policy(o.policy);  // reject bad names before loading anything
    std::vector<RagRequest> reqs = read_requests(o.requests_path);
    if (o.limit > 0 && reqs.size() > o.limit) reqs.resize(o.limit);
    std::vector<RagRequest> warm_reqs =
        o.warmup_path.empty() ? std::vector<RagRequest>{} : read_requests(o.warmup_path);
    // Arrival times: the file's (scaled), or Poisson at --rate; in order.
    if (o.rate > 0) {
      const std::vector<double> at = poisson_arrivals(reqs.size(), o.rate, o.seed);
      for (size_t i = 0; i < reqs.size(); ++i) reqs[i].arrival_s = at[i];
    } else {
      for (RagRequest& r : reqs) r.arrival_s /= o.rate_scale;
    }
    std::stable_sort(reqs.begin(), reqs.end(),
                     [](const RagRequest& a, const RagRequest& b) { return a.arrival_s < b.arrival_s; });
    // SubGCache: the batches clustered; every other strategy then sees each
    // query's own subgraph in the same CSV form (the per-query baseline) unless
    // --graph-format says otherwise.
    SubgcachePlan subg;
    std::vector<RagRequest> subg_reqs;
    if (subgcache) {
      subg = plan_subgcache(reqs, o.subgcache);
      for (size_t i : subg.order) subg_reqs.push_back(subg.requests[i]);
    }
    if (o.graph_format == "csv" || (o.graph_format == "auto" && subgcache)) {
      // The warm-up too, in the form the measured stream has.
      for (std::vector<RagRequest>* set : {&reqs, &warm_reqs})
        for (RagRequest& r : *set) {
          if (r.entities.empty())
            fail(ErrorKind::InvalidInput, "graph as CSV ({}): request {} has no entities (no graph to show)",
                 o.graph_format == "csv" ? "--graph-format csv" : "subgcache is in the run", r.id);
          r = with_subgraph_csv(r, request_subgraph(r));
        }
    }
    const auto model = Model::load(o.model_path);
    const Tokenizer tok(Vocab::from_gguf(model->file()));
    // Every request must fit the assembly before any runs: prompt (flat or
    // merged, whichever the strategies build) plus the generated tokens.
    int64_t need = 0, all = 0;
    std::string largest;
    const auto rows_needed = [&](const PromptParts& p) {
      return std::max(p.n_flat_tokens(), static_cast<int64_t>(p.dep_prompt().size())) + o.max_tokens - 1;
    };
    std::vector<PromptParts> parts;
    for (const RagRequest& r : reqs) {
      parts.push_back(make_prompt_parts(tok, r, model->config().prompt));
      const int64_t n = rows_needed(parts.back());
      if (n > need) need = n, largest = r.id;
      all += n;
    }
    std::vector<PromptParts> subg_parts;
    for (const RagRequest& r : subg_reqs) {
      subg_parts.push_back(make_prompt_parts(tok, r, model->config().prompt));
      const int64_t n = rows_needed(subg_parts.back());
      if (n > need) need = n, largest = r.id + " (its cluster's subgraph)";
    }
    std::vector<PromptParts> warm;
    for (const RagRequest& r : warm_reqs) {
      warm.push_back(make_prompt_parts(tok, r, model->config().prompt));
      const int64_t n = rows_needed(warm.back());
      if (n > need) need = n, largest = "warm-up " + r.id;
    }
    const int64_t n_ctx = o.ctx > 0 ? o.ctx : std::max(need, std::min(all, 8 * need));
    if (need > n_ctx)
      fail(ErrorKind::LimitExceeded,
           "request {} needs {} KV rows (prompt + {} generated tokens), more than the context size {}",
           largest, need, o.max_tokens, n_ctx);
    if (const int n_train = model->config().n_ctx_train; n_train > 0 && need > n_train)
      fmt::print(
          stderr,
          "warning: request {} needs {} positions, more than the {} the model was trained on; its answers "
          "may degrade\n",
          largest, need, n_train);
    const ModelConfig& c = model->config();
    // The model's scheme is read (and checked) only when dependency attention runs.
    const bool dependency = std::find(names.begin(), names.end(), "depcache") != names.end();
    const PositionScheme scheme = o.scheme != "auto" ? *parse_position_scheme(o.scheme)
                                  : dependency       ? default_position_scheme(c)
                                                     : kDefaultPositionScheme;
    const std::string scheme_source =
        o.scheme != "auto" ? "--scheme" : (c.position_scheme.empty() ? "default" : "the model's metadata");
    o.chunk.tree_context = o.tree_context != "auto" ? *parse_tree_context(o.tree_context)
                           : dependency             ? default_tree_context(c)
                                                    : TreeContext::System;
    // Printed only when it is not DepCache's layout, which every other model is served with.
    const std::string trees =
        o.chunk.tree_context == TreeContext::None
            ? fmt::format("; trees see only themselves ({})",
                          o.tree_context != "auto" ? "--tree-context" : "the model's metadata")
            : "";
    fmt::print(
        "model: {} ({} layers, {} embd, {}/{} heads); {} requests; KV {} ; pool {} rows; positions {} "
        "({}){}\n",
        o.model_path, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, reqs.size(), o.kv_type, n_ctx,
        position_scheme_name(scheme), scheme_source, trees);
    std::vector<StrategyRun> runs;
    std::ofstream json;
    if (!o.json_path.empty()) {
      json.open(o.json_path, std::ios::binary | std::ios::trunc);
      if (!json) fail(ErrorKind::NotFound, "cannot write {}", o.json_path);
    }
    std::vector<FullAnswer> full;
    if (o.fidelity)
      full = full_answers(reqs, tok, model, parse_kv_type(o.kv_type), need, o.max_tokens, o.threads);
    if (o.sweep) return sweep_rates(names, reqs, parts, model, o, n_ctx, scheme);
    for (const std::string& name : names) {
      if (name == "subgcache") {
        // Served in cluster order; the rows go back to the stream's order.
        std::vector<FullAnswer> full_in_order;
        for (size_t i : subg.order)
          if (o.fidelity) full_in_order.push_back(full[i]);
        StrategyRun run = run_strategy(name, subg_reqs, subg_parts, model, o, n_ctx, scheme,
                                       o.fidelity ? &full_in_order : nullptr, &warm);
        std::vector<RequestRow> rows(run.rows.size());
        for (size_t k = 0; k < subg.order.size(); ++k) rows[subg.order[k]] = std::move(run.rows[k]);
        run.rows = std::move(rows);
        fmt::print(
            "subgcache: {} queries in {} batches of up to {}, {} clusters ({} linkage, {} embedding); "
            "clustering {:.1f} ms ({:.2f}% of its run's {:.1f} s)\n",
            reqs.size(), (reqs.size() + o.subgcache.batch - 1) / o.subgcache.batch, o.subgcache.batch,
            subg.n_clusters, linkage_name(o.subgcache.linkage),
            o.subgcache.embedding == SubgraphEmbedding::Text ? "text" : "ids", subg.clustering_ms,
            100.0 * subg.clustering_ms / 1000.0 / std::max(run.wall_s + subg.clustering_ms / 1000.0, 1e-9),
            run.wall_s);
        runs.push_back(std::move(run));
      } else {
        runs.push_back(
            run_strategy(name, reqs, parts, model, o, n_ctx, scheme, o.fidelity ? &full : nullptr, &warm));
      }
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (reqs[i].answers.empty()) continue;
        RequestRow& row = runs.back().rows[i];
        row.answer = generated_answer(tok, row.output);
        row.exact_match = answer_matches(*row.answer, reqs[i].answers);
        row.f1 = answer_f1(*row.answer, reqs[i].answers);
      }
      const StrategyRun& run = runs.back();
      if (!o.quiet) {
        fmt::print("\n{:<10} {:<12} {:>9} {:>7} {:>8} {:>7} {:>12}\n", "strategy", "request", "TTFT ms",
                   "prompt", "computed", "reused", "attn pairs");
        for (const RequestRow& r : run.rows)
          fmt::print("{:<10} {:<12} {:>9.2f} {:>7} {:>8} {:>7} {:>12}\n", run.name, r.id.substr(0, 12),
                     r.ttft_ms, r.report.prompt_tokens, r.report.computed_tokens, r.report.reused_tokens,
                     r.report.attention_pairs);
        fmt::print("index: {:.1f} MiB hot, {} nodes left the index\n", run.cached_bytes / 1048576.0,
                   run.evicted);
      }
      if (json)
        for (const RequestRow& r : run.rows)
          json << row_json(run.name, r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
               << '\n';
    }
    print_summary(runs, o.verify, o.fidelity);
    int64_t nonfinite = 0;
    for (const StrategyRun& run : runs)
      for (const RequestRow& r : run.rows)
        nonfinite += !r.finite || (r.logit_diff >= 0 && !std::isfinite(r.logit_diff));
    for (const FullAnswer& a : full) nonfinite += !a.finite;
    if (nonfinite > 0)
      fail(ErrorKind::InvalidInput,
           "{} requests gave non-finite logits (NaN or Inf); the model's weights may be corrupt", nonfinite);
  });
}

}  // namespace depcache::cli

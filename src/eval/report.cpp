#include "eval/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>

#include "eval/stats.h"
#include "retrieval/workload.h"

namespace depcache {

nlohmann::json request_row_json(const std::string& strategy, const RequestRow& r) {
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

namespace {

// The summary's column heads.
void append_summary_header(std::string& out, bool verify, bool fidelity) {
  fmt::format_to(
      std::back_inserter(out),
      "\n{:<10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9} {:>10} {:>10} {:>9} {:>13}{}{}\n",
      "strategy", "requests", "TTFT p50", "TTFT p99", "TTFT mean", "e2e p50", "req/s", "tok/s", "prompt",
      "computed", "reused", "hit rate", "attn pairs", verify ? "  max |dlogit|  top-1 agree" : "",
      fidelity ? "  1st token   KL mean  identical  ROUGE-L" : "");
}

// The fidelity columns of a run's summary row.
void append_fidelity_columns(std::string& out, const StrategyRun& run) {
  const auto n = static_cast<double>(run.rows.size());
  int64_t first = 0, identical = 0;
  double kl = 0, rouge = 0;
  for (const RequestRow& r : run.rows) {
    first += r.fidelity->first_token_agrees;
    identical += r.fidelity->identical;
    kl += r.fidelity->kl_first_token / n;
    rouge += r.fidelity->rouge_l / n;
  }
  fmt::format_to(std::back_inserter(out), "  {:>6}/{:<3} {:>9.2e} {:>6}/{:<3} {:>8.3f}", first,
                 run.rows.size(), kl, identical, run.rows.size(), rouge);
}

// One run's row of the summary.
void append_summary_row(std::string& out, const StrategyRun& run, bool verify, bool fidelity) {
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
  fmt::format_to(
      std::back_inserter(out),
      "{:<10} {:>8} {:>8.1f}ms {:>8.1f}ms {:>8.1f}ms {:>8.1f}ms {:>8.2f} {:>8.1f} {:>9} {:>10} {:>10} "
      "{:>8.1f}% "
      "{:>13}",
      run.name, run.rows.size(), percentile(ttft, 50), percentile(ttft, 99), mean, percentile(e2e, 50),
      n / run.wall_s, static_cast<double>(generated) / run.wall_s, prompt, computed, reused, 100.0 * hit / n,
      pairs);
  if (verify)
    fmt::format_to(std::back_inserter(out), "  {:>13.2e}  {:>5}/{}", max_diff, agree, run.rows.size());
  if (fidelity) append_fidelity_columns(out, run);
  fmt::format_to(std::back_inserter(out), "\n");
}

// A line per run that judged answers; returns each such run's token F1.
std::map<std::string, double> append_answer_lines(std::string& out, const std::vector<StrategyRun>& runs) {
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
    fmt::format_to(
        std::back_inserter(out),
        "{:<10} answers: {} of {} exact ({:.1f}%), token F1 {:.3f}; greedy output up to a newline or end of "
        "generation\n",
        run.name, right, asked, 100.0 * static_cast<double>(right) / static_cast<double>(asked), f1);
  }
  return f1_of;
}

// FusionRAG's normalized F1: where a strategy sits between full reuse (0)
// and full attention (1). Undefined when the two are closer than
// kMinF1Gap: the ratio would be noise (bench/experiments/chunks.sh applies the same
// rule to its separate runs).
void append_normalized_f1(std::string& out, std::map<std::string, double> f1_of) {
  constexpr double kMinF1Gap = 0.01;
  if (!f1_of.count("full") || !f1_of.count("fullreuse")) return;
  const double span = f1_of["full"] - f1_of["fullreuse"];
  for (const auto& [name, f1] : f1_of) {
    if (name == "full" || name == "fullreuse") continue;
    if (std::abs(span) < kMinF1Gap)
      fmt::format_to(std::back_inserter(out),
                     "{:<10} normalized F1: undefined (full and fullreuse are within {} F1)\n", name,
                     kMinF1Gap);
    else
      fmt::format_to(std::back_inserter(out),
                     "{:<10} normalized F1 (F1 - F1 fullreuse) / (F1 full - F1 fullreuse): {:.3f}\n", name,
                     (f1 - f1_of["fullreuse"]) / span);
  }
}

// A run's warnings and notes: non-finite logits, spans not kept, preemptions.
void append_run_warnings(std::string& out, const StrategyRun& run) {
  const RadixIndex::Stats& s = run.stats;
  const int64_t nonfinite =
      std::count_if(run.rows.begin(), run.rows.end(), [](const RequestRow& r) { return !r.finite; });
  if (nonfinite > 0)
    fmt::format_to(std::back_inserter(out),
                   "{:<10} warning: {} of {} requests gave non-finite logits (NaN or Inf)\n", run.name,
                   nonfinite, run.rows.size());
  if (s.oversized[0] > 0)
    fmt::format_to(
        std::back_inserter(out),
        "{:<10} warning: {} spans were not cached: each alone is larger than the hot tier (--cache-mib)\n",
        run.name, s.oversized[0]);
  if (s.oversized[2] > 0)
    fmt::format_to(
        std::back_inserter(out),
        "{:<10} warning: {} spans were dropped instead of written: each alone is larger than the disk tier "
        "(--disk-mib)\n",
        run.name, s.oversized[2]);
  if (s.disk_write_failures > 0)
    fmt::format_to(
        std::back_inserter(out),
        "{:<10} warning: {} spans could not be written to the disk tier (disk full or not writable)\n",
        run.name, s.disk_write_failures);
  if (run.preemptions > 0)
    fmt::format_to(
        std::back_inserter(out),
        "{:<10} note: the KV pool ({} rows) ran out {} times; the latest admitted requests gave their rows "
        "back and were prefilled again (-c/--ctx-size raises it)\n",
        run.name, run.pool_rows, run.preemptions);
}

// A tiered run's line of tier counters.
void append_tier_line(std::string& out, const StrategyRun& run) {
  const RadixIndex::Stats& s = run.stats;
  fmt::format_to(
      std::back_inserter(out),
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

}  // namespace

std::string summary_report(const std::vector<StrategyRun>& runs, bool verify, bool fidelity) {
  std::string out;
  append_summary_header(out, verify, fidelity);
  for (const StrategyRun& run : runs) append_summary_row(out, run, verify, fidelity);
  fmt::format_to(
      std::back_inserter(out),
      "TTFT and e2e (end-to-end latency) from each request's arrival; req/s and tok/s (generated) over the "
      "replay's wall time. hit rate: reused / prompt tokens per request, averaged. attn pairs: (query, key) "
      "pairs per layer.\n");
  if (fidelity)
    fmt::format_to(
        std::back_inserter(out),
        "fidelity, against full attention on the flat prompt: same first token; KL(full || strategy) of the "
        "first-token distributions (mean); identical greedy continuations; token ROUGE-L of the "
        "continuations (mean).\n");
  append_normalized_f1(out, append_answer_lines(out, runs));
  for (const StrategyRun& run : runs) {
    append_run_warnings(out, run);
    if (run.tiered) append_tier_line(out, run);
  }
  return out;
}

std::string request_table(const StrategyRun& run) {
  std::string out = fmt::format("\n{:<10} {:<12} {:>9} {:>7} {:>8} {:>7} {:>12}\n", "strategy", "request",
                                "TTFT ms", "prompt", "computed", "reused", "attn pairs");
  for (const RequestRow& r : run.rows)
    out += fmt::format("{:<10} {:<12} {:>9.2f} {:>7} {:>8} {:>7} {:>12}\n", run.name, r.id.substr(0, 12),
                       r.ttft_ms, r.report.prompt_tokens, r.report.computed_tokens, r.report.reused_tokens,
                       r.report.attention_pairs);
  out += fmt::format("index: {:.1f} MiB hot, {} nodes left the index\n", run.cached_bytes / 1048576.0,
                     run.evicted);
  return out;
}

int64_t nonfinite_requests(const std::vector<StrategyRun>& runs, const std::vector<FullAnswer>& full) {
  int64_t n = 0;
  for (const StrategyRun& run : runs)
    for (const RequestRow& r : run.rows)
      n += !r.finite || (r.logit_diff >= 0 && !std::isfinite(r.logit_diff));
  for (const FullAnswer& a : full) n += !a.finite;
  return n;
}

RateSweep sweep_rate(const std::vector<RagRequest>& reqs, double slo_ms, uint64_t seed,
                     const std::function<StrategyRun(const std::vector<RagRequest>&, bool serial)>& replay_at,
                     SloStatistic statistic) {
  RateSweep s;
  s.statistic = statistic;
  const auto point = [](double rate, const StrategyRun& run, size_t n) {
    const std::vector<double> t = ttfts(run);
    return RateSweep::Point{rate, percentile(t, 50), percentile(t, 99), mean(t),
                            static_cast<double>(n) / run.wall_s};
  };
  s.unloaded = point(0, replay_at(reqs, true), reqs.size());
  s.slo = slo_ms > 0 ? slo_ms : 5 * (statistic == SloStatistic::Mean ? s.unloaded.mean : s.unloaded.p50);
  const auto within = [&](double rate) {
    std::vector<RagRequest> at = reqs;
    const std::vector<double> arrivals = poisson_arrivals(at.size(), rate, seed);
    for (size_t i = 0; i < at.size(); ++i) at[i].arrival_s = arrivals[i];
    const RateSweep::Point p = point(rate, replay_at(at, false), at.size());
    s.points.push_back(p);
    return s.within(p);
  };
  // One request at a time is the least load there is: when it breaks the
  // SLO, no rate keeps it (and the rates below would take ever longer).
  if (!s.within(s.unloaded)) return s;
  double good = 0, bad = 0, rate = s.unloaded.served;
  // A finite stream offered much faster than the system serves it arrives
  // nearly at once: once the completed rate stops growing (saturation), a
  // higher offered rate only compresses the arrivals further, and the
  // doubling ends there (the rate reported is then a lower bound).
  for (int i = 0; i < 10 && bad == 0; ++i, rate *= 2) {
    if (!within(rate)) {
      bad = rate;
      break;
    }
    // Every point so far was within the SLO: the one before is `good`'s.
    const bool saturated = good > 0 && s.points.back().served < 1.05 * s.points[s.points.size() - 2].served;
    good = rate;
    if (saturated) break;
  }
  if (good == 0) {  // even the unloaded rate breaks it: search below
    for (int i = 0; i < 4 && good == 0; ++i) {
      rate = bad / 2;
      (within(rate) ? good : bad) = rate;
    }
  }
  for (int i = 0; i < 3 && good > 0 && bad > 0; ++i) {
    const double mid = (good + bad) / 2;
    (within(mid) ? good : bad) = mid;
  }
  s.best_rate = good;
  // The throughput: the most completed at any rate within the SLO (at the
  // highest such rate it may be a little lower, by noise).
  for (const RateSweep::Point& p : s.points)
    if (s.within(p)) s.best_served = std::max(s.best_served, p.served);
  return s;
}

std::string sweep_markdown(const std::vector<std::string>& names, const std::vector<RateSweep>& sweeps) {
  std::string md =
      "| strategy | unloaded TTFT p50 | unloaded TTFT p99 | SLO on TTFT | highest rate within it | served "
      "there |\n|---|---|---|---|---|---|\n";
  std::string curve =
      "| strategy | offered req/s | TTFT p50 | TTFT p99 | TTFT mean | served req/s | within SLO "
      "|\n|---|---|---|---|---|---|---|\n";
  for (size_t k = 0; k < names.size(); ++k) {
    const RateSweep& s = sweeps[k];
    md += fmt::format("| {} | {:.1f}ms | {:.1f}ms | {} <= {:.1f}ms | {} | {} |\n", names[k], s.unloaded.p50,
                      s.unloaded.p99, s.statistic == SloStatistic::Mean ? "mean" : "p99", s.slo,
                      s.best_rate > 0 ? fmt::format("{:.2f} req/s", s.best_rate) : "none",
                      s.best_rate > 0 ? fmt::format("{:.2f} req/s", s.best_served) : "-");
    for (const RateSweep::Point& p : s.points)
      curve += fmt::format("| {} | {:.2f} | {:.1f}ms | {:.1f}ms | {:.1f}ms | {:.2f} | {} |\n", names[k],
                           p.rate, p.p50, p.p99, p.mean, p.served, s.within(p) ? "yes" : "no");
  }
  return md + "\n" + curve;
}

std::string sweep_plot_commands(const std::vector<std::string>& names) {
  std::string plot =
      "set logscale xy; set xlabel 'offered load (req/s)'; set ylabel 'TTFT p99 (ms)'; set key outside "
      "right; plot ";
  for (size_t i = 0; i < names.size(); ++i)
    plot += fmt::format("{}$DATA index {} using 1:2 with linespoints title '{}'", i ? ", " : "", i, names[i]);
  return plot;
}

std::string sweep_plot_data(const std::vector<std::string>& names, const std::vector<RateSweep>& sweeps) {
  std::string data;
  for (size_t k = 0; k < names.size(); ++k) {
    std::map<double, double> p99_at;  // a rate tried twice: its last replay
    for (const RateSweep::Point& p : sweeps[k].points) p99_at[p.rate] = p.p99;
    data += fmt::format("# {}\n", names[k]);
    for (const auto& [rate, p99] : p99_at) data += fmt::format("{} {}\n", rate, p99);
    data += "\n\n";
  }
  return data;
}

}  // namespace depcache

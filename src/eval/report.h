#pragma once
// What `run` reports of its runs: a request's JSON row, the side-by-side
// summary (latencies, reuse, verification, fidelity, answers, warnings) and
// a rate sweep's tables.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/replay.h"

namespace depcache {

nlohmann::json request_row_json(const std::string& strategy, const RequestRow& r);

// One line per request: TTFT, prompt, computed and reused tokens, attention
// pairs; then what the index held.
std::string request_table(const StrategyRun& run);

// Requests whose logits (or whose difference to their prompt alone) were
// not finite, full attention's answers included.
int64_t nonfinite_requests(const std::vector<StrategyRun>& runs, const std::vector<FullAnswer>& full);

std::string summary_report(const std::vector<StrategyRun>& runs, bool verify, bool fidelity);

// A rate sweep of one strategy: the unloaded TTFT (one request at a time),
// the SLO (slo_ms, or 5x that p50, as RAGCache defines throughput), then
// Poisson replays at rising rates — doubling from the unloaded throughput
// until p99 TTFT breaks the SLO, then bisecting — and the highest rate that
// kept it. replay_at(requests with arrival times, serial) runs the stream.
struct RateSweep {
  double unloaded_p50 = 0, slo = 0;
  // 0: one request at a time broke the SLO already (then nothing else is
  // tried), or so did 1/16 of the unloaded throughput.
  double best_rate = 0, best_served = 0;
  struct Point {
    double rate = 0, p50 = 0, p99 = 0, served = 0;
  };
  std::vector<Point> points;  // in the order tried
};
RateSweep sweep_rate(
    const std::vector<RagRequest>& reqs, double slo_ms, uint64_t seed,
    const std::function<StrategyRun(const std::vector<RagRequest>&, bool serial)>& replay_at);
// The sweeps of several strategies as Markdown (a summary table and the
// curve), and as gnuplot data blocks ("rate p99", one per strategy).
std::string sweep_markdown(const std::vector<std::string>& names, const std::vector<RateSweep>& sweeps);
std::string sweep_plot_data(const std::vector<std::string>& names, const std::vector<RateSweep>& sweeps);
// The gnuplot commands that draw sweep_plot_data ('$DATA'): TTFT p99 against
// offered load, one line per strategy, both axes logarithmic.
std::string sweep_plot_commands(const std::vector<std::string>& names);

}  // namespace depcache

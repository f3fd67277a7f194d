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
// the SLO (slo_ms, or 5x the unloaded TTFT), then Poisson replays at rising
// rates — doubling from the unloaded throughput until the SLO's statistic
// of TTFT breaks it, then bisecting, or until the completed rate stops
// growing (saturated: a faster offer only compresses the arrivals) — the
// highest rate found within it (a lower bound when saturated) and the most
// requests completed per second within it.
// replay_at(requests with arrival times, serial) runs the stream.
// P99 is a tail bound: on a few dozen requests it is their slowest one.
// Mean is how RAGCache defines throughput (mean TTFT under 5x that at the
// lowest rate).
enum class SloStatistic { P99, Mean };
struct RateSweep {
  struct Point {
    double rate = 0, p50 = 0, p99 = 0, mean = 0, served = 0;
  };
  SloStatistic statistic = SloStatistic::P99;
  Point unloaded;  // one request at a time (rate 0)
  double slo = 0;
  // 0: one request at a time broke the SLO already (then nothing else is
  // tried), or so did 1/16 of the unloaded throughput.
  double best_rate = 0, best_served = 0;
  std::vector<Point> points;  // in the order tried
  // Whether the statistic the SLO bounds keeps it, at a point or unloaded.
  bool within(const Point& p) const { return (statistic == SloStatistic::Mean ? p.mean : p.p99) <= slo; }
};
RateSweep sweep_rate(const std::vector<RagRequest>& reqs, double slo_ms, uint64_t seed,
                     const std::function<StrategyRun(const std::vector<RagRequest>&, bool serial)>& replay_at,
                     SloStatistic statistic = SloStatistic::P99);
// The sweeps of several strategies as Markdown (a summary table and the
// curve), and as gnuplot data blocks ("rate p99", one per strategy).
std::string sweep_markdown(const std::vector<std::string>& names, const std::vector<RateSweep>& sweeps);
std::string sweep_plot_data(const std::vector<std::string>& names, const std::vector<RateSweep>& sweeps);
// The gnuplot commands that draw sweep_plot_data ('$DATA'): TTFT p99 against
// offered load, one line per strategy, both axes logarithmic.
std::string sweep_plot_commands(const std::vector<std::string>& names);

}  // namespace depcache

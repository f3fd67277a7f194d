// The rate sweep's search: a replay whose p99 TTFT grows with the offered
// rate is searched up to the highest rate within the SLO, and a stream that
// breaks the SLO one request at a time is not searched at all.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "eval/report.h"

namespace depcache {
namespace {

std::vector<RagRequest> stream(size_t n) {
  std::vector<RagRequest> reqs(n);
  for (size_t i = 0; i < n; ++i) reqs[i].id = std::to_string(i);
  return reqs;
}

// A run of reqs whose every TTFT is ttft_ms and whose wall time is the
// arrival span (or n * 0.1 s one at a time).
StrategyRun run_of(const std::vector<RagRequest>& reqs, double ttft_ms, bool serial) {
  StrategyRun run;
  for (const RagRequest& r : reqs) {
    RequestRow row;
    row.id = r.id;
    row.ttft_ms = ttft_ms;
    run.rows.push_back(row);
  }
  run.wall_s = serial ? 0.1 * static_cast<double>(reqs.size()) : std::max(reqs.back().arrival_s, 0.1);
  return run;
}

TEST(RateSweep, FindsTheHighestRateWithinTheSlo) {
  // TTFT: 10 ms alone, 10 ms * rate / 20 under load (the SLO, 50 ms, breaks above 100 req/s).
  int calls = 0;
  const RateSweep s = sweep_rate(stream(20), 50, 1, [&](const std::vector<RagRequest>& at, bool serial) {
    ++calls;
    if (serial) return run_of(at, 10, true);
    const double rate = static_cast<double>(at.size()) / std::max(at.back().arrival_s, 1e-9);
    return run_of(at, 10 * rate / 20, false);
  });
  EXPECT_EQ(s.slo, 50);
  EXPECT_GT(s.best_rate, 0);
  EXPECT_FALSE(s.points.empty());
  for (const RateSweep::Point& p : s.points) {
    if (p.rate <= s.best_rate) {
      EXPECT_LE(p.p99, s.slo);
    }
  }
  EXPECT_LE(calls, 20);
}

TEST(RateSweep, AStreamThatBreaksTheSloAloneIsNotSearched) {
  int calls = 0;
  const RateSweep s = sweep_rate(stream(10), 50, 1, [&](const std::vector<RagRequest>& at, bool serial) {
    ++calls;
    return run_of(at, 80, serial);
  });
  EXPECT_EQ(s.best_rate, 0);
  EXPECT_EQ(calls, 1) << "only the unloaded run";
  EXPECT_TRUE(s.points.empty());
}

}  // namespace
}  // namespace depcache

// The rate sweep's search: a replay whose p99 TTFT grows with the offered
// rate is searched up to the highest rate within the SLO, and a stream that
// breaks the SLO one request at a time is not searched at all; the mean
// TTFT as the SLO's statistic (RAGCache's), and a stream that saturates
// the system within the SLO stops the doubling.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "eval/report.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

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

TEST(RateSweep, TheMeanIgnoresOneSlowRequestThatP99Counts) {
  // One request in ten takes 200 ms, the others 10 ms, at any load.
  const auto replay = [](const std::vector<RagRequest>& at, bool serial) {
    StrategyRun run = run_of(at, 10, serial);
    run.rows[3].ttft_ms = 200;
    return run;
  };
  const RateSweep p99 = sweep_rate(stream(10), 50, 1, replay);
  EXPECT_EQ(p99.best_rate, 0);
  const RateSweep mean = sweep_rate(stream(10), 50, 1, replay, SloStatistic::Mean);
  EXPECT_NEAR(mean.unloaded.mean, 29, 1e-9);
  EXPECT_GT(mean.best_rate, 0);
  for (const RateSweep::Point& p : mean.points) EXPECT_TRUE(mean.within(p));
}

TEST(RateSweep, SaturationWithinTheSloEndsTheDoubling) {
  // The system completes at most 30 req/s; TTFT stays 10 ms however fast requests come.
  int calls = 0;
  const RateSweep s = sweep_rate(stream(20), 50, 1, [&](const std::vector<RagRequest>& at, bool serial) {
    ++calls;
    StrategyRun run = run_of(at, 10, serial);
    if (!serial) run.wall_s = std::max(run.wall_s, static_cast<double>(at.size()) / 30);
    return run;
  });
  EXPECT_GT(s.best_rate, 0);
  EXPECT_NEAR(s.best_served, 30, 3);
  EXPECT_LE(calls, 4) << "unloaded, 10 req/s, 20 and 40 req/s (saturated)";
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

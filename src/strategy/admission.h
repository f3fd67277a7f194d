#pragma once
// Admission: which waiting request goes into the cache next, and what the
// waiting requests tell the cache meanwhile. The window the scheduler sees,
// its pick, the passed-over counts its starvation bound reads and LACR's
// lookahead are decided here once, for the engine and for the simulator,
// whose hit rates must be the engine's.
#include <cstddef>
#include <span>
#include <vector>

#include "kv/radix_index.h"
#include "strategy/scheduler.h"

namespace depcache {

struct AdmissionOptions {
  SchedulerOptions scheduler;
  size_t window = 32;      // waiting requests (from the oldest) the scheduler and the lookahead see
  bool lookahead = false;  // LACR's future term, refreshed from the window
};

class Admission {
 public:
  explicit Admission(AdmissionOptions options);  // InvalidInput for an unknown scheduler
  size_t window() const { return window_; }      // at least 1
  const SchedulerOptions& scheduler() const { return options_.scheduler; }
  bool lookahead() const { return options_.lookahead; }

  // Index into `candidates` (arrival order, at most window(), non-empty) of
  // the one to admit.
  size_t pick(std::span<const WaitingRequest> candidates, const RadixIndex& index) const;
  // candidates[chosen] was admitted: every other one waited once more.
  static void admitted(std::span<const WaitingRequest> candidates, size_t chosen);
  // With the lookahead on: the index's lookahead weights from the first
  // window() of `waiting` (arrival order), ranked in the scheduler's
  // expected_order (scheduler.h): LACR's lookahead weighs a request by how
  // soon it runs, which a reordering scheduler decides, not its arrival.
  // Otherwise nothing.
  void refresh_lookahead(RadixIndex& index, std::span<const WaitingRequest> waiting) const;

 private:
  AdmissionOptions options_;
  size_t window_;
};

}  // namespace depcache

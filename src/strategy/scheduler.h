#pragma once
// The order in which waiting requests are served: one implementation for
// the engine and the simulator.
//   fifo      arrival order
//   lpm       longest cached prefix first (most tokens matched)
//   lsp       longest shared prefix groups first: the request whose runs the
//             most other waiting requests share (by tokens), so a group runs
//             together
//   ragcache  RAGCache's order: highest cached / to-compute ratio first
// Every order but fifo has a starvation bound: a request passed over
// `starvation_bound` times goes next (the oldest such first).
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/radix_index.h"
#include "strategy/strategy.h"

namespace depcache {

struct WaitingRequest {
  const std::vector<Lookup>* lookups = nullptr;  // what it will look up
  int64_t prompt_tokens = 0;
  int* passed_over = nullptr;  // times another request was picked while it waited (read; Admission counts)
};

struct SchedulerOptions {
  std::string order = "fifo";
  int starvation_bound = 32;
};

// Index into `queue` (arrival order, non-empty) of the request to serve next.
// Reads the index (peek), never changes it. Admission (strategy/admission.h)
// decides the window and counts passed_over.
size_t pick_next(const SchedulerOptions& options, std::span<const WaitingRequest> queue,
                 const RadixIndex& index);

// Every index of `queue` in the order pick_next would serve them were the
// index to stay as it is: its pick, then its pick among the rest, the
// passed-over counts advanced on a copy (the real ones are left alone).
std::vector<size_t> expected_order(const SchedulerOptions& options, std::span<const WaitingRequest> queue,
                                   const RadixIndex& index);

std::vector<std::string> scheduler_names();
void check_scheduler(std::string_view name);  // InvalidInput for an unknown order

}  // namespace depcache

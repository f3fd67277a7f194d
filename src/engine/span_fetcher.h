#pragma once
// Reads what waiting requests will reuse from the index's lower tiers (a
// disk, a remote store) on a thread of its own, ahead of their admission
// (RadixIndex::prefetch, which reads with the index's lock released). The
// engine admits a request once its fetch is done and computes the others
// meanwhile, so neither its thread nor the requests already running ever
// wait on a disk or a Redis; the request itself waits at most what the
// stores' deadlines allow.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kv/radix_index.h"
#include "strategy/strategy.h"

namespace depcache {

class SpanFetcher {
 public:
  // One request's fetch. `done` turns true once; a cancelled job that has
  // not started is skipped.
  struct Job {
    std::vector<Lookup> lookups;
    std::atomic<bool> done{false};
    std::atomic<bool> cancelled{false};
  };

  explicit SpanFetcher(RadixIndex& index) : index_(index) {}
  // Stops after the lookup in progress.
  ~SpanFetcher();
  SpanFetcher(const SpanFetcher&) = delete;
  SpanFetcher& operator=(const SpanFetcher&) = delete;

  // Queues a fetch (jobs run in order; the thread starts with the first).
  std::shared_ptr<Job> start(std::vector<Lookup> lookups);
  // Blocks until a job finishes after this call began, or `timeout`.
  void wait_any(std::chrono::milliseconds timeout);
  // Tokens brought from lower tiers so far.
  int64_t loaded() const { return loaded_.load(std::memory_order_relaxed); }

 private:
  void run();

  RadixIndex& index_;
  std::mutex mu_;
  std::condition_variable work_, finished_;
  std::deque<std::shared_ptr<Job>> queue_;
  uint64_t n_finished_ = 0;
  bool stop_ = false;
  std::atomic<int64_t> loaded_{0};
  std::thread thread_;
};

}  // namespace depcache

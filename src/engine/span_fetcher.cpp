#include "engine/span_fetcher.h"

namespace depcache {

SpanFetcher::~SpanFetcher() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<SpanFetcher::Job> SpanFetcher::start(std::vector<Lookup> lookups) {
  auto job = std::make_shared<Job>();
  job->lookups = std::move(lookups);
  {
    std::lock_guard lk(mu_);
    queue_.push_back(job);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  work_.notify_one();
  return job;
}

void SpanFetcher::wait_any(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  const uint64_t seen = n_finished_;
  finished_.wait_for(lk, timeout, [&] { return n_finished_ != seen || stop_; });
}

void SpanFetcher::run() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lk(mu_);
      work_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    // Under a layer-wise preload the match reads disk spans while the pass
    // computes: the fetch leaves them to it.
    const bool disk = index_.layer_preload().mode == RadixIndex::LayerPreload::Mode::Off;
    for (const Lookup& l : job->lookups) {
      if (job->cancelled.load(std::memory_order_relaxed)) break;
      {
        std::lock_guard lk(mu_);
        if (stop_) return;
      }
      // A store that fails is a miss: the request computes those tokens.
      try {
        loaded_.fetch_add(index_.prefetch(l.ns, l.tokens, disk), std::memory_order_relaxed);
      } catch (const std::exception&) {
      }
    }
    job->done.store(true, std::memory_order_release);
    {
      std::lock_guard lk(mu_);
      ++n_finished_;
    }
    finished_.notify_all();
  }
}

}  // namespace depcache

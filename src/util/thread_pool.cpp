#include "util/thread_pool.h"

#include <immintrin.h>

#include <thread>

namespace depcache {

int ThreadPool::default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads <= 0 ? default_threads() : n_threads) {
  for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    work_.fetch_add(uint64_t{1} << 32);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_tasks(uint32_t gen, int thread) {
  uint64_t w = work_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(w >> 32) != gen) return;
    const int64_t task = static_cast<int64_t>(w & 0xffffffffu);
    const Fn* fn = fn_.load(std::memory_order_relaxed);
    if (task >= n_tasks_.load(std::memory_order_relaxed)) return;
    if (!work_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) continue;
    try {
      (*fn)(task, thread);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    n_done_.fetch_add(1, std::memory_order_release);
    w = work_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_loop(int thread) {
  uint32_t seen = 0;
  for (;;) {
    auto current = [&] { return static_cast<uint32_t>(work_.load(std::memory_order_acquire) >> 32); };
    // Spin for a short while (20,000 pauses: 0.5 ms on a Zen 4) before
    // sleeping, yielding now and then to a thread that waits for this core.
    for (int spin = 0; spin < 20000 && current() == seen; ++spin) {
      if (spin % 128 == 127)
        std::this_thread::yield();
      else
        _mm_pause();
    }
    if (current() == seen) {
      std::unique_lock lock(mutex_);
      n_sleeping_.fetch_add(1);
      wake_.wait(lock, [&] { return current() != seen; });
      n_sleeping_.fetch_sub(1);
    }
    // The generation first, then stop_: the destructor sets stop_ before it
    // bumps the generation, so a worker that sees the bump sees stop_ too.
    // (Checked the other way round, a worker could take the destructor's
    // bump for a new loop and then sleep forever waiting for the next one.)
    seen = current();
    if (stop_) return;
    run_tasks(seen, thread);
  }
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    std::exception_ptr error;
    for (int64_t t = 0; t < n_tasks; ++t) {
      try {
        fn(t, 0);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
  // First close the previous loop (a generation with no claimable task), so
  // a worker still holding that loop's word cannot claim a task against the
  // new function and count; then publish the new loop.
  const uint32_t closed = static_cast<uint32_t>(work_.load() >> 32) + 1;
  work_.store((uint64_t{closed} << 32) | 0xffffffffu, std::memory_order_seq_cst);
  fn_.store(&fn, std::memory_order_relaxed);
  n_tasks_.store(n_tasks, std::memory_order_relaxed);
  n_done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = closed + 1;
  {
    // Publishing under the mutex closes the window in which a worker checks
    // the generation and then goes to sleep, missing this wake-up.
    std::lock_guard lock(mutex_);
    work_.store(uint64_t{gen} << 32, std::memory_order_release);
  }
  if (n_sleeping_.load() > 0) wake_.notify_all();
  run_tasks(gen, 0);
  // The last tasks may be held by a worker that the OS has descheduled (more
  // runnable threads than cores: other processes, or other engines): after a
  // short spin, give it the core instead of spinning through a time slice.
  for (int spin = 0; n_done_.load(std::memory_order_acquire) < n_tasks; ++spin) {
    if (spin < 2000)
      _mm_pause();
    else
      std::this_thread::yield();
  }
  std::exception_ptr error;
  {
    std::lock_guard lock(error_mutex_);
    std::swap(error, error_);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace depcache

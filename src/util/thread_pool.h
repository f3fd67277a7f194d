#pragma once
// A fixed pool of workers for data-parallel loops. The calling thread takes
// part, and idle workers spin briefly before sleeping: decode issues a few
// hundred short loops per token, and a sleeping wake-up per loop would cost
// more than the loop itself. A loop finishes when its tasks are done, not
// when every worker has woken, so a worker that the OS has not scheduled yet
// does not stall the caller.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace depcache {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: one per core
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(task, thread) for task in [0, n_tasks); tasks are handed out
  // dynamically. Returns when all are done. Not reentrant. If tasks throw,
  // the others still run and the first exception is rethrown here.
  void parallel_for(int64_t n_tasks, const std::function<void(int64_t task, int thread)>& fn);

  static int default_threads();

 private:
  using Fn = std::function<void(int64_t, int)>;
  void worker_loop(int thread);
  // Claims and runs tasks of loop `gen` until none are left.
  void run_tasks(uint32_t gen, int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  // High 32 bits: loop generation; low 32 bits: next task index. Claiming a
  // task is a compare-exchange on both, so a late worker can never take a
  // task of a newer loop under an old loop's function.
  std::atomic<uint64_t> work_{0};
  std::atomic<int64_t> n_tasks_{0};
  std::atomic<const Fn*> fn_{nullptr};
  std::atomic<int64_t> n_done_{0};
  std::atomic<int> n_sleeping_{0};
  std::atomic<bool> stop_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;  // the first exception of the current loop
};

}  // namespace depcache

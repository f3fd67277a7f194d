#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int round = 0; round < 20000; ++round) {
      const int n = round % 37;
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int> max_thread{0};
      pool.parallel_for(n, [&](int64_t task, int thread) {
        hits[task].fetch_add(1);
        int m = max_thread.load();
        while (thread > m && !max_thread.compare_exchange_weak(m, thread)) {
        }
      });
      for (int i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "task " << i << " round " << round;
      ASSERT_LT(max_thread.load(), threads);
    }
  }
}

// A throwing task does not end the process or the loop: every other task
// runs, the first exception reaches the caller, and the pool keeps working.
TEST(ThreadPool, TaskExceptionsReachTheCaller) {
  for (int threads : {1, 2})
    for (int round = 0; round < 20; ++round) {
      ThreadPool pool(threads);
      std::atomic<int> ran{0};
      EXPECT_THROW(pool.parallel_for(64,
                                     [&](int64_t t, int) {
                                       ran.fetch_add(1);
                                       if (t % 7 == 3) throw std::runtime_error("task failed");
                                     }),
                   std::runtime_error);
      EXPECT_EQ(ran.load(), 64);
      std::atomic<int> after{0};
      pool.parallel_for(16, [&](int64_t, int) { after.fetch_add(1); });
      EXPECT_EQ(after.load(), 16);
    }
}

// Pools created, used once and destroyed many times: the destructor must
// always wake and join its workers (a worker once could take the shutdown
// for a new loop and sleep forever). A hang fails after 120 s, not at the
// suite's timeout.
TEST(ThreadPool, ShutdownNeverHangs) {
  std::atomic<bool> done{false};
  std::thread runner([&done] {
    for (int i = 0; i < 3000; ++i) {
      ThreadPool pool(3);
      pool.parallel_for(i % 4, [](int64_t, int) {});
    }
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!done && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!done) {
    ADD_FAILURE() << "a ThreadPool destructor did not return";
    runner.detach();
    std::_Exit(1);  // a hung worker cannot be joined
  }
  runner.join();
}

TEST(ThreadPool, DefaultsToOnePerCore) { EXPECT_EQ(ThreadPool(0).size(), ThreadPool::default_threads()); }

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

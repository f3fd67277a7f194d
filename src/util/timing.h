#pragma once
// Wall-clock intervals for reports and benchmarks, and the steady clock in
// milliseconds for deadlines.
#include <chrono>
#include <cstdint>

namespace depcache {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Milliseconds on the steady clock: deadlines and times kept as integers
// (in atomics, in Redis connections' waits).
inline int64_t steady_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace depcache

#pragma once
// Pins held for one request, released when the lease ends: on completion, on
// an error or exception in the middle of a prefill, and on cancellation
// alike, so no path can leave a node pinned (and unevictable) for good.
#include <vector>

#include "kv/radix_index.h"

namespace depcache {

class PinLease {
 public:
  explicit PinLease(RadixIndex& index) : index_(index) {}
  ~PinLease() { release(); }
  PinLease(const PinLease&) = delete;
  PinLease& operator=(const PinLease&) = delete;

  // Pins the nodes of m until release.
  void hold(const RadixIndex::Match& m) {
    index_.pin(m);
    held_.push_back(m);
  }
  // Unpins everything held (then the index evicts back to its budget).
  void release() {
    const auto lk = index_.lock();
    for (const RadixIndex::Match& m : held_) index_.unpin(m);
    held_.clear();
  }
  size_t size() const { return held_.size(); }

 private:
  RadixIndex& index_;
  std::vector<RadixIndex::Match> held_;
};

}  // namespace depcache

#pragma once
// The one lock of the KV index and the rules its two parts (the tree,
// kv/radix_tree.h, and the tier controller, kv/tier_controller.h) obey:
//
//  1. Every read or change of the tree or of the tiers' accounting is made
//     holding it. The tree and the controller never lock it themselves; the
//     index's public methods do, and a caller may hold it across several
//     calls (lock()), e.g. to use the spans of what it matched.
//  2. Slow I/O (a disk file's layers, the remote store) is done with the
//     lock released (Released) only when the index's own call is its only
//     holder (held_alone()). Under a caller's lock the caller expects
//     nothing to move, so the I/O is done in place.
//  3. What is used across a release stays pinned, and after the lock is
//     taken back nothing read before is trusted: a node is adopted only if
//     it is still live, in the same tier, under the same file; a match is
//     taken again.
//  4. Waiting on another thread (a layer loader's last layers, the remote
//     queue's drain) is done without the lock.
#include <atomic>
#include <mutex>
#include <thread>

namespace depcache {

// A recursive mutex that knows how deep its owner holds it, so the index can
// tell its own lock (released around I/O) from a caller's.
class IndexMutex {
 public:
  void lock() {
    const std::thread::id me = std::this_thread::get_id();
    // Only this thread can have stored its own id: a relaxed load suffices.
    if (owner_.load(std::memory_order_relaxed) == me) {
      ++depth_;
      return;
    }
    mu_.lock();
    owner_.store(me, std::memory_order_relaxed);
    depth_ = 1;
  }
  bool try_lock() {
    const std::thread::id me = std::this_thread::get_id();
    if (owner_.load(std::memory_order_relaxed) == me) {
      ++depth_;
      return true;
    }
    if (!mu_.try_lock()) return false;
    owner_.store(me, std::memory_order_relaxed);
    depth_ = 1;
    return true;
  }
  void unlock() {
    if (--depth_ > 0) return;
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    mu_.unlock();
  }
  // For the owning thread: whether only the index's own call holds it (rule 2).
  bool held_alone() const { return depth_ == 1; }

  // Releases the lock its owner holds once, for I/O, and takes it back when
  // it goes (also when the I/O throws).
  class Released {
   public:
    explicit Released(IndexMutex& mu) : mu_(mu) { mu_.unlock(); }
    ~Released() { mu_.lock(); }
    Released(const Released&) = delete;
    Released& operator=(const Released&) = delete;

   private:
    IndexMutex& mu_;
  };

 private:
  std::mutex mu_;
  std::atomic<std::thread::id> owner_{};
  int depth_ = 0;
};

}  // namespace depcache

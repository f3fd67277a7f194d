#pragma once
// Cache-Craft's layer-wise preload: a span on disk is read layer by layer on
// a thread of its own, so a forward pass can compute its first layers while
// the later ones are still being read. The first `preload` layers are read
// before the loader is handed over; the pass waits for layer l only when it
// gets there. How many to read first follows from the per-layer times of
// loading and of computing (preload_depth).
#include <condition_variable>
#include <mutex>
#include <thread>

#include "kv/disk_store.h"

namespace depcache {

class LayerLoader {
 public:
  // Reads layers [0, preload) before returning (fewer if one fails), the
  // rest on a thread, in order.
  LayerLoader(DiskSpanStore::LayerReader reader, int preload);
  // Stops reading (after the layer in progress) and joins the thread.
  ~LayerLoader();
  LayerLoader(const LayerLoader&) = delete;
  LayerLoader& operator=(const LayerLoader&) = delete;

  int n_layer() const { return n_layer_; }
  uint64_t key() const { return key_; }  // of the file it reads
  // Bytes of K/V it reads in all.
  size_t bytes() const { return reader_.layer_bytes() * static_cast<size_t>(n_layer_); }
  // Blocks until layer il is read and checked: true; false when it, or a
  // layer before it, could not be read or failed its checksum (the record
  // is bad: the caller computes instead and drops the file).
  bool wait(int il);
  // Layers read and checked so far, without waiting.
  int ready() const;
  bool failed() const;
  // The span: positions always; layer il's K/V once wait(il) was true.
  const KvSpan& span() const { return reader_.span(); }
  // The whole span, once every layer is in (waits for them); empty when one
  // failed.
  KvSpan take();
  // Time spent reading, and time wait() blocked: the part of the load the
  // preload depth did not hide behind computation.
  double read_ms() const;
  double waited_ms() const;

 private:
  void read_from(int il);  // reads layers il.. in order, publishing each

  DiskSpanStore::LayerReader reader_;
  const int n_layer_;
  const uint64_t key_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int ready_ = 0;
  bool failed_ = false, stop_ = false;
  double read_ms_ = 0, waited_ms_ = 0;
  std::thread thread_;
};

// Layers to read before computing starts so that, reading one layer in
// `load_ms_per_layer` and computing one in `compute_ms_per_layer`, no layer
// waits for its K/V: layer i is in at (i + 1) * load and is needed at
// preload * load + i * compute, so the last layer sets the depth,
// ceil(L - (L - 1) * compute / load), at least 1 and at most L.
int preload_depth(int n_layer, double load_ms_per_layer, double compute_ms_per_layer);

}  // namespace depcache

#include "kv/layer_loader.h"

#include <algorithm>
#include <cmath>

#include "util/timing.h"

namespace depcache {

LayerLoader::LayerLoader(DiskSpanStore::LayerReader reader, int preload)
    : reader_(std::move(reader)), n_layer_(reader_.n_layer()), key_(reader_.key()) {
  const int first = std::clamp(preload, 0, n_layer_);
  const auto t0 = Clock::now();
  for (int il = 0; il < first; ++il) {
    if (!reader_.read_layer(il)) {
      failed_ = true;
      break;
    }
    ready_ = il + 1;
  }
  read_ms_ = ms_since(t0);
  if (!failed_ && ready_ < n_layer_) thread_ = std::thread([this, from = ready_] { read_from(from); });
}

LayerLoader::~LayerLoader() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void LayerLoader::read_from(int il) {
  for (; il < n_layer_; ++il) {
    {
      std::lock_guard lk(mu_);
      if (stop_) return;
    }
    // Layer il is written here only; readers look at it after ready_ says so.
    const auto t0 = Clock::now();
    const bool ok = reader_.read_layer(il);
    std::lock_guard lk(mu_);
    read_ms_ += ms_since(t0);
    if (ok) {
      ready_ = il + 1;
    } else {
      failed_ = true;
    }
    cv_.notify_all();
    if (!ok) return;
  }
}

bool LayerLoader::wait(int il) {
  if (il < 0 || il >= n_layer_) return false;
  std::unique_lock lk(mu_);
  if (ready_ > il) return true;
  const auto t0 = Clock::now();
  cv_.wait(lk, [&] { return ready_ > il || failed_; });
  waited_ms_ += ms_since(t0);
  return ready_ > il;
}

int LayerLoader::ready() const {
  std::lock_guard lk(mu_);
  return ready_;
}

bool LayerLoader::failed() const {
  std::lock_guard lk(mu_);
  return failed_;
}

KvSpan LayerLoader::take() {
  if (n_layer_ > 0 && !wait(n_layer_ - 1)) return KvSpan();
  if (thread_.joinable()) thread_.join();
  return std::move(reader_.span());
}

double LayerLoader::read_ms() const {
  std::lock_guard lk(mu_);
  return read_ms_;
}

double LayerLoader::waited_ms() const {
  std::lock_guard lk(mu_);
  return waited_ms_;
}

int preload_depth(int n_layer, double load_ms_per_layer, double compute_ms_per_layer) {
  if (n_layer <= 1) return std::max(n_layer, 0);
  if (!(load_ms_per_layer > compute_ms_per_layer)) return 1;  // reading keeps ahead (NaN: assume so)
  const double ratio = std::max(compute_ms_per_layer, 0.0) / load_ms_per_layer;
  const double depth = std::ceil(n_layer - (n_layer - 1) * ratio - 1e-9);
  return std::clamp(static_cast<int>(depth), 1, n_layer);
}

}  // namespace depcache

#pragma once
// Per-sequence key/value storage: for every layer, one row of
// n_head_kv*head_dim keys (after RoPE) and values per position.
#include <cstdint>
#include <vector>

#include "compute/attention.h"
#include "compute/dtype.h"
#include "model/model_config.h"

namespace depcache {

class KvCache {
 public:
  // type: F32 or F16.
  KvCache(const ModelConfig& config, int64_t n_ctx, DType type);

  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return n_past_; }
  void set_n_past(int64_t n);  // truncate (or keep) the sequence
  void clear() { n_past_ = 0; }
  DType type() const { return type_; }
  size_t bytes() const;

  // Stores n_rows rows of float keys and values at positions pos0...
  void write(int il, int64_t pos0, const float* k_rows, const float* v_rows, int64_t n_rows);
  KvLayerView layer(int il) const;

 private:
  int64_t n_ctx_;
  int64_t row_;  // elements per position
  DType type_;
  int64_t n_past_ = 0;
  std::vector<std::vector<uint8_t>> k_, v_;  // per layer
};

}  // namespace depcache

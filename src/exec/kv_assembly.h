#pragma once
// A request's KV assembly: for every layer, one row of n_head_kv*head_dim
// keys (after RoPE) and values per slot, plus the RoPE position each row was
// encoded at. Rows are slots, not positions: under dependency attention
// siblings share positions, and spans from the cache land wherever the plan
// puts them (their keys rotated to the new positions).
#include <cstdint>
#include <span>
#include <vector>

#include "compute/attention.h"
#include "compute/dtype.h"
#include "kv/kv_span.h"
#include "model/model_config.h"
#include "util/zeroed_array.h"

namespace depcache {

class KvAssembly {
 public:
  // type: a KV storage type (compute/kv_format.h) that fits the model's rows,
  // else Error(InvalidInput) saying why.
  KvAssembly(const ModelConfig& config, int64_t n_ctx, DType type);

  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_past() const { return n_past_; }  // rows in use
  void set_n_past(int64_t n);                 // truncate (or keep) the assembly
  void clear() { n_past_ = 0; }
  DType type() const { return type_; }
  int n_layer() const { return static_cast<int>(k_.size()); }
  int64_t row_elems() const { return row_; }
  size_t bytes() const;

  // Stores n_rows rows of float keys and values at rows row0...
  void write(int il, int64_t row0, const float* k_rows, const float* v_rows, int64_t n_rows);
  void set_positions(int64_t row0, std::span<const int32_t> positions);
  int32_t position(int64_t row) const { return positions_[row]; }
  const int32_t* positions() const { return positions_.data(); }  // per row
  // One past the largest position among the rows in use (0 when empty): where
  // decoding continues.
  int32_t next_position() const;
  // Row `row` of layer il as floats (n_head_kv*head_dim each).
  void read(int il, int64_t row, float* k_row, float* v_row) const;
  KvLayerView layer(int il) const;

  // The given rows (any order) as a span, with their positions.
  KvSpan extract(std::span<const int64_t> rows) const;
  // Copies span tokens [from, from + n) into rows row0... at `positions`,
  // rotating each key by (new position - encoded position) with its layer's
  // frequencies (layers without RoPE are copied). Values do not depend on
  // position and are copied as they are. Only layers
  // [layer_begin, layer_end) when given (-1: to the last): a span still
  // being read is placed layer by layer as its layers arrive, with the same
  // result as placing it whole.
  void place(const KvSpan& span, int64_t from, int64_t n, int64_t row0, std::span<const int32_t> positions,
             int layer_begin = 0, int layer_end = -1);

 private:
  int64_t n_ctx_;
  int64_t row_;  // elements per row
  size_t row_bytes_;
  DType type_;
  int n_head_kv_, head_dim_, n_rot_;
  ModelConfig config_;  // per-layer RoPE (base, scaling, layers without it)
  bool neox_;
  int64_t n_past_ = 0;
  std::vector<ZeroedArray<uint8_t>> k_, v_;  // per layer
  ZeroedArray<int32_t> positions_;
};

}  // namespace depcache

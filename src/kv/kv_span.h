#pragma once
// A KV span: the keys and values of a run of tokens for every layer, in the
// KV type of the cache they came from (compute/kv_format.h), with the RoPE positions their keys
// were encoded at. Spans are what the index stores and what a request's KV
// assembly is built from.
#include <cstdint>
#include <functional>
#include <vector>

#include "compute/dtype.h"

namespace depcache {

class KvSpan {
 public:
  KvSpan() = default;
  KvSpan(int n_layer, int64_t row_elems, DType type, int64_t n_tokens);

  int n_layer() const { return n_layer_; }
  int64_t row_elems() const { return row_elems_; }
  DType type() const { return type_; }
  int64_t n_tokens() const { return static_cast<int64_t>(positions_.size()); }
  size_t row_bytes() const { return row_bytes_; }
  size_t bytes() const { return data_.size() + positions_.size() * sizeof(int32_t); }

  std::vector<int32_t>& positions() { return positions_; }
  const std::vector<int32_t>& positions() const { return positions_; }
  // Rows of layer il, (n_tokens, row_elems) each.
  uint8_t* k(int il) { return data_.data() + layer_offset(il); }
  uint8_t* v(int il) { return k(il) + n_tokens() * row_bytes(); }
  const uint8_t* k(int il) const { return data_.data() + layer_offset(il); }
  const uint8_t* v(int il) const { return k(il) + n_tokens() * row_bytes(); }

  // All K/V bytes (per layer: K rows, then V rows), for storage.
  std::vector<uint8_t>& data() { return data_; }
  const std::vector<uint8_t>& data() const { return data_; }

  // Tokens [begin, end) as a span of their own.
  KvSpan slice(int64_t begin, int64_t end) const;

 private:
  size_t layer_offset(int il) const { return static_cast<size_t>(il) * 2 * n_tokens() * row_bytes(); }

  int n_layer_ = 0;
  int64_t row_elems_ = 0;
  DType type_ = DType::F32;
  size_t row_bytes_ = 0;
  std::vector<int32_t> positions_;
  std::vector<uint8_t> data_;  // per layer: K rows, then V rows
};

// Makes the span of sequence tokens [begin, end): how the index asks a
// caller for the K/V of what it inserts.
using SpanMaker = std::function<KvSpan(int64_t begin, int64_t end)>;

}  // namespace depcache

#include "exec/kv_assembly.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "compute/kv_format.h"
#include "compute/ops.h"
#include "util/error.h"

namespace depcache {

KvAssembly::KvAssembly(const ModelConfig& config, int64_t n_ctx, DType type)
    : n_ctx_(n_ctx),
      row_(config.n_embd_kv()),
      type_(type),
      n_head_kv_(config.n_head_kv),
      head_dim_(config.head_dim),
      n_rot_(config.n_rot),
      config_(config),
      neox_(config.rope_style == RopeStyle::Neox) {
  row_bytes_ = kv_row_bytes(type, row_);  // refuses a type that does not fit the rows
  if (n_ctx <= 0) fail(ErrorKind::InvalidInput, "context size must be positive, got {}", n_ctx);
  const size_t row_bytes = row_bytes_;
  const double total = 2.0 * config.n_layer * static_cast<double>(n_ctx) * static_cast<double>(row_bytes);
  const auto too_large = [&] {
    fail(ErrorKind::LimitExceeded,
         "cannot allocate {:.1f} MiB for a KV assembly of {} rows ({} layers, {} KV): lower the context size",
         total / 1048576.0, n_ctx, config.n_layer, dtype_info(type).name);
  };
  if (static_cast<size_t>(n_ctx) > (SIZE_MAX / 4) / std::max<size_t>(row_bytes, 1)) too_large();
  const size_t layer_bytes = static_cast<size_t>(n_ctx) * row_bytes;
  for (int il = 0; il < config.n_layer; ++il)
    for (auto* side : {&k_, &v_}) {
      auto a = ZeroedArray<uint8_t>::allocate(layer_bytes);
      if (!a) too_large();
      side->push_back(std::move(*a));
    }
  auto positions = ZeroedArray<int32_t>::allocate(static_cast<size_t>(n_ctx));
  if (!positions) too_large();
  positions_ = std::move(*positions);
}

void KvAssembly::set_n_past(int64_t n) {
  if (n < 0 || n > n_ctx_) fail(ErrorKind::Internal, "KV row {} outside [0, {}]", n, n_ctx_);
  n_past_ = n;
}

size_t KvAssembly::bytes() const { return k_.empty() ? 0 : 2 * k_.size() * k_[0].size(); }

void KvAssembly::write(int il, int64_t row0, const float* k_rows, const float* v_rows, int64_t n_rows) {
  if (row0 < 0 || row0 + n_rows > n_ctx_)
    fail(ErrorKind::LimitExceeded, "KV write at rows {}..{} exceeds the context size {}", row0, row0 + n_rows,
         n_ctx_);
  kv_encode(type_, k_rows, k_[il].data() + row0 * row_bytes_, n_rows, row_);
  kv_encode(type_, v_rows, v_[il].data() + row0 * row_bytes_, n_rows, row_);
}

void KvAssembly::set_positions(int64_t row0, std::span<const int32_t> positions) {
  if (row0 < 0 || row0 + static_cast<int64_t>(positions.size()) > n_ctx_)
    fail(ErrorKind::LimitExceeded, "KV positions at rows {}..{} exceed the context size {}", row0,
         row0 + static_cast<int64_t>(positions.size()), n_ctx_);
  std::copy(positions.begin(), positions.end(), positions_.begin() + row0);
}

int32_t KvAssembly::next_position() const {
  if (n_past_ == 0) return 0;
  return *std::max_element(positions_.begin(), positions_.begin() + n_past_) + 1;
}

void KvAssembly::read(int il, int64_t row, float* k_row, float* v_row) const {
  kv_decode(type_, k_[il].data() + row * row_bytes_, k_row, 1, row_);
  kv_decode(type_, v_[il].data() + row * row_bytes_, v_row, 1, row_);
}

KvLayerView KvAssembly::layer(int il) const { return {k_[il].data(), v_[il].data(), type_, row_bytes_}; }

KvSpan KvAssembly::extract(std::span<const int64_t> rows) const {
  KvSpan span(n_layer(), row_, type_, static_cast<int64_t>(rows.size()));
  const size_t rb = span.row_bytes();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= n_ctx_)
      fail(ErrorKind::Internal, "KV extract: row {} outside [0, {})", rows[i], n_ctx_);
    span.positions()[i] = positions_[rows[i]];
  }
  for (int il = 0; il < n_layer(); ++il)
    for (size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(span.k(il) + i * rb, k_[il].data() + rows[i] * rb, rb);
      std::memcpy(span.v(il) + i * rb, v_[il].data() + rows[i] * rb, rb);
    }
  return span;
}

void KvAssembly::place(const KvSpan& span, int64_t from, int64_t n, int64_t row0,
                       std::span<const int32_t> positions, int layer_begin, int layer_end) {
  if (layer_end < 0) layer_end = n_layer();
  if (layer_begin < 0 || layer_begin > layer_end || layer_end > n_layer())
    fail(ErrorKind::Internal, "KV place: layers [{}, {}) of {}", layer_begin, layer_end, n_layer());
  if (span.type() != type_ || span.row_elems() != row_ || span.n_layer() != n_layer())
    fail(ErrorKind::Internal, "KV span of another shape or type cannot be placed in this cache");
  if (from < 0 || n < 0 || from + n > span.n_tokens() || static_cast<int64_t>(positions.size()) != n)
    fail(ErrorKind::Internal, "KV place: tokens [{}, {}) of a {}-token span at {} positions", from, from + n,
         span.n_tokens(), positions.size());
  if (row0 < 0 || row0 + n > n_ctx_)
    fail(ErrorKind::LimitExceeded, "KV place at rows {}..{} exceeds the context size {}", row0, row0 + n,
         n_ctx_);
  const size_t rb = span.row_bytes();
  std::vector<int32_t> delta(n);
  bool rotate = false;
  for (int64_t i = 0; i < n; ++i) {
    delta[i] = positions[i] - span.positions()[from + i];
    rotate = rotate || delta[i] != 0;
  }
  // One table per distinct frequency set (Gemma 3: local and global layers).
  RopeTable table;
  float table_base = 0;
  const std::vector<float>* table_divisors = nullptr;
  std::vector<float> keys(rotate ? n * row_ : 0);
  for (int il = layer_begin; il < layer_end; ++il) {
    uint8_t* kd = k_[il].data() + row0 * rb;
    std::memcpy(v_[il].data() + row0 * rb, span.v(il) + from * rb, n * rb);
    if (!rotate || !config_.rotates(il)) {
      std::memcpy(kd, span.k(il) + from * rb, n * rb);
      continue;
    }
    // Rotations compose: R(delta) R(old) = R(new). Rotate in float, store in
    // the cache type (one extra rounding for f16 and q8_0 caches).
    kv_decode(type_, span.k(il) + from * rb, keys.data(), n, row_);
    if (!table_divisors || table_base != config_.layer_rope_base(il) ||
        *table_divisors != config_.layer_rope_divisors(il)) {
      table_base = config_.layer_rope_base(il);
      table_divisors = &config_.layer_rope_divisors(il);
      table.build(delta.data(), n, n_rot_, table_base, *table_divisors);
    }
    rope(keys.data(), n, n_head_kv_, head_dim_, table, neox_);
    kv_encode(type_, keys.data(), kd, n, row_);
  }
  std::copy(positions.begin(), positions.end(), positions_.begin() + row0);
}

}  // namespace depcache

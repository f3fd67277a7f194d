#include "engine/kv_cache.h"

#include <cstring>

#include "compute/vec.h"
#include "util/error.h"

namespace depcache {

KvCache::KvCache(const ModelConfig& config, int64_t n_ctx, DType type)
    : n_ctx_(n_ctx), row_(config.n_embd_kv()), type_(type) {
  if (type != DType::F32 && type != DType::F16)
    fail(ErrorKind::InvalidInput, "KV cache type {} is not supported (f32, f16)", dtype_info(type).name);
  if (n_ctx <= 0) fail(ErrorKind::InvalidInput, "context size must be positive, got {}", n_ctx);
  const size_t layer_bytes = static_cast<size_t>(n_ctx) * row_ * (type == DType::F16 ? 2 : 4);
  k_.assign(config.n_layer, std::vector<uint8_t>(layer_bytes));
  v_.assign(config.n_layer, std::vector<uint8_t>(layer_bytes));
}

void KvCache::set_n_past(int64_t n) {
  if (n < 0 || n > n_ctx_) fail(ErrorKind::Internal, "KV position {} outside [0, {}]", n, n_ctx_);
  n_past_ = n;
}

size_t KvCache::bytes() const { return k_.empty() ? 0 : 2 * k_.size() * k_[0].size(); }

void KvCache::write(int il, int64_t pos0, const float* k_rows, const float* v_rows, int64_t n_rows) {
  if (pos0 < 0 || pos0 + n_rows > n_ctx_)
    fail(ErrorKind::LimitExceeded, "KV write at positions {}..{} exceeds the context size {}", pos0,
         pos0 + n_rows, n_ctx_);
  const int64_t n = n_rows * row_;
  if (type_ == DType::F32) {
    std::memcpy(reinterpret_cast<float*>(k_[il].data()) + pos0 * row_, k_rows, n * sizeof(float));
    std::memcpy(reinterpret_cast<float*>(v_[il].data()) + pos0 * row_, v_rows, n * sizeof(float));
  } else {
    uint16_t* kd = reinterpret_cast<uint16_t*>(k_[il].data()) + pos0 * row_;
    uint16_t* vd = reinterpret_cast<uint16_t*>(v_[il].data()) + pos0 * row_;
    for (int64_t i = 0; i < n; ++i) {
      kd[i] = vec::f32_to_f16(k_rows[i]);
      vd[i] = vec::f32_to_f16(v_rows[i]);
    }
  }
}

KvLayerView KvCache::layer(int il) const { return {k_[il].data(), v_[il].data(), type_ == DType::F16, row_}; }

}  // namespace depcache

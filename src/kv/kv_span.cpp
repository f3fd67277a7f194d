#include "kv/kv_span.h"

#include <cstring>

#include "compute/kv_format.h"
#include "util/error.h"

namespace depcache {

KvSpan::KvSpan(int n_layer, int64_t row_elems, DType type, int64_t n_tokens)
    : n_layer_(n_layer), row_elems_(row_elems), type_(type), positions_(n_tokens) {
  if (!kv_type_fits(type, row_elems))
    fail(ErrorKind::Internal, "KV span: {}", kv_type_refusal(type, row_elems));
  row_bytes_ = kv_row_bytes(type, row_elems);
  data_.resize(static_cast<size_t>(n_layer) * 2 * n_tokens * row_bytes());
}

KvSpan KvSpan::slice(int64_t begin, int64_t end) const {
  if (begin < 0 || end < begin || end > n_tokens())
    fail(ErrorKind::Internal, "KV span slice [{}, {}) of {} tokens", begin, end, n_tokens());
  KvSpan out(n_layer_, row_elems_, type_, end - begin);
  std::copy(positions_.begin() + begin, positions_.begin() + end, out.positions_.begin());
  const size_t rb = row_bytes(), n = (end - begin) * rb;
  for (int il = 0; il < n_layer_; ++il) {
    if (n == 0) break;
    std::memcpy(out.k(il), k(il) + begin * rb, n);
    std::memcpy(out.v(il), v(il) + begin * rb, n);
  }
  return out;
}

}  // namespace depcache

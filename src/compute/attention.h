#pragma once
// Scaled dot-product attention of query rows against a KV store, computed
// with an online softmax over key blocks (no score matrix is materialised).
#include <cstdint>

namespace depcache {

class ThreadPool;

struct KvLayerView {
  const void* k = nullptr;  // (n_rows, n_head_kv*head_dim), f32 or f16
  const void* v = nullptr;  // same layout as k
  bool f16 = false;
  int64_t row_stride = 0;  // elements between consecutive positions
};

// q: (n_tokens, n_head*head_dim). Query t attends to KV rows [0, n_visible[t]).
// out: (n_tokens, n_head*head_dim). GQA: query head h reads KV head
// h / (n_head / n_head_kv).
void attention(const float* q, int64_t n_tokens, const KvLayerView& kv, const int64_t* n_visible, int n_head,
               int n_head_kv, int head_dim, float* out, ThreadPool& pool);

}  // namespace depcache

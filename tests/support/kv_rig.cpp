#include "kv_rig.h"

#include <gtest/gtest.h>

#include <cstring>

namespace depcache::kv_rig {

KvSpan span_of(const Tokens& seq, int64_t begin, int64_t end, int salt, SpanShape shape) {
  KvSpan s(shape.n_layer, shape.row_elems, shape.type, end - begin);
  const size_t rb = s.row_bytes();
  auto byte = [&](int64_t i, int il, size_t j) {
    return static_cast<uint8_t>(
        (static_cast<int64_t>(seq[i]) * 131 + i * 31 + il * 7 + static_cast<int64_t>(j) + salt) & 0xff);
  };
  for (int il = 0; il < shape.n_layer; ++il)
    for (int64_t i = begin; i < end; ++i)
      for (size_t j = 0; j < rb; ++j) {
        s.k(il)[(i - begin) * rb + j] = byte(i, il, j);
        s.v(il)[(i - begin) * rb + j] = byte(i, il, j + rb);
      }
  for (int64_t i = begin; i < end; ++i) s.positions()[i - begin] = static_cast<int32_t>(i);
  return s;
}

RadixIndex::SpanMaker maker(const Tokens& seq) {
  return [&seq](int64_t b, int64_t e) { return span_of(seq, b, e); };
}

void expect_true_kv(const RadixIndex& index, const RadixIndex::Match& m, const Tokens& seq) {
  int64_t at = 0;
  for (const RadixIndex::Piece& p : m.pieces) {
    const KvSpan& got = index.span(p.node);
    ASSERT_GE(got.n_tokens(), p.offset + p.length) << "a piece beyond its node's span at token " << at;
    const KvSpan want = span_of(seq, at, at + p.length);
    for (int il = 0; il < kLayers; ++il) {
      ASSERT_EQ(std::memcmp(got.k(il) + p.offset * got.row_bytes(), want.k(il), want.row_bytes() * p.length),
                0)
          << "K of layer " << il << " at token " << at;
      ASSERT_EQ(std::memcmp(got.v(il) + p.offset * got.row_bytes(), want.v(il), want.row_bytes() * p.length),
                0)
          << "V of layer " << il << " at token " << at;
    }
    for (int64_t i = 0; i < p.length; ++i)
      ASSERT_EQ(got.positions()[p.offset + i], at + i) << "position at token " << at + i;
    at += p.length;
  }
  EXPECT_EQ(at, m.length);
}

size_t token_bytes() { return span_of({1}, 0, 1).bytes(); }

Tokens sequence(int id, int64_t n, int64_t shared) {
  Tokens t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(i < shared ? 1000 + i : id * 97 + i);
  return t;
}

}  // namespace depcache::kv_rig

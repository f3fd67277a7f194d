#pragma once
// What the tier tests share: sequences of tokens, K/V that depends only on
// (token, row, layer) as real prefill's does, and the check that a match
// serves exactly that K/V.
#include <cstdint>
#include <vector>

#include "kv/radix_index.h"
#include "kv/span_record.h"

namespace depcache::kv_rig {

using Tokens = std::vector<int32_t>;
inline constexpr int kLayers = 2;
inline constexpr int64_t kRowElems = 8;
inline constexpr SpanShape kShape{kLayers, kRowElems, DType::F16};

// The K/V of rows [begin, end) of `seq`, shifted by `salt`: salt 0 is the
// true K/V, any other a forgery of the same shape. A slice of a span is the
// span of the slice's tokens, whichever piece the index hands out.
KvSpan span_of(const Tokens& seq, int64_t begin, int64_t end, int salt = 0, SpanShape shape = kShape);
// The index's maker of true spans of `seq` (which must outlive it).
RadixIndex::SpanMaker maker(const Tokens& seq);
// Every matched piece holds the true K/V and positions of its rows, and the
// pieces cover the match.
void expect_true_kv(const RadixIndex& index, const RadixIndex::Match& m, const Tokens& seq);
// Bytes of one token's K/V in kShape.
size_t token_bytes();
// n tokens, the first `shared` the same in every sequence, the rest the id's own.
Tokens sequence(int id, int64_t n, int64_t shared = 0);

}  // namespace depcache::kv_rig

#pragma once
// The byte format of a stored span, shared by the disk tier (one file per
// span) and the remote tier (one value per block). A record names the span's
// key and namespace, carries the whole token sequence from its namespace's
// root to the span's end (the first `prefix` tokens are context, the rest
// are the span's own), the positions its keys were encoded at, the K/V bytes
// and a checksum (XXH3-64) over everything after the checksum itself. A reader accepts
// a record only when all of these agree with what it asked for.
//
// Layout (little-endian): magic "DKVSPAN3" | checksum u64 | key u64 |
// size u64 | n_layer u32 | dtype u32 | row_elems u64 | n_tokens u64 |
// prefix u64 | ns u64 | reserved u64 | tokens i32[n_tokens] |
// positions i32[n_tokens - prefix] | K/V bytes.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kv/kv_span.h"

namespace depcache {

inline constexpr size_t kSpanRecordHeader = 80;

struct SpanRecordHeader {
  uint64_t key = 0;
  uint64_t ns = 0;
  uint64_t size = 0;  // bytes of the whole record
  int64_t n_tokens = 0;
  int64_t prefix = 0;
};

// The content key of a token sequence in a namespace: what the disk and
// remote tiers file a span under, the same in every process.
uint64_t span_content_key(uint64_t ns, std::span<const int32_t> tokens);

// tokens: the whole sequence; the span holds its last tokens.size() - prefix.
std::vector<uint8_t> encode_span_record(uint64_t key, uint64_t ns, std::span<const int32_t> tokens,
                                        int64_t prefix, const KvSpan& span);
size_t span_record_bytes(int64_t n_tokens, const KvSpan& span);

// The header of a record whose first kSpanRecordHeader bytes are given
// (sanity-checked: magic, dtype, sizes); the checksum is not verified.
std::optional<SpanRecordHeader> decode_span_record_header(std::span<const uint8_t> head);
// A whole record read back: Corrupt when it is not sound (magic, size,
// checksum, shape), Other when it is sound but not the one asked for (key,
// namespace, tokens, prefix: a hash collision or a stale record).
enum class RecordStatus { Ok, Corrupt, Other };
struct DecodedSpan {
  RecordStatus status = RecordStatus::Corrupt;
  KvSpan span;
};
DecodedSpan decode_span_record(std::span<const uint8_t> record, uint64_t key, uint64_t ns,
                               std::span<const int32_t> tokens, int64_t prefix);
// The tokens of a record (after its header), for scanning without loading K/V.
std::vector<int32_t> span_record_tokens(std::span<const uint8_t> record_start, int64_t n_tokens);

}  // namespace depcache

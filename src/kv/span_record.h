#pragma once
// The byte format of a stored span, shared by the disk tier (one file per
// span) and the remote tier (one value per block). A record names the span's
// key and namespace, carries the whole token sequence from its namespace's
// root to the span's end (the first `prefix` tokens are context, the rest
// are the span's own), the positions its keys were encoded at and the K/V
// bytes, layer after layer. A reader accepts a record only when all of these
// agree with what it asked for.
//
// Two kinds of checksum (XXH3-64), so a record can be read layer by layer
// (Cache-Craft's layer-wise preload: the first layers computed on while the
// later ones are still being read): one over the head (the header after the
// checksum itself, the tokens, the positions and the table of layer
// checksums), and one per layer over that layer's K/V bytes.
//
// Layout (little-endian): magic "DKVSPAN4" | head checksum u64 | key u64 |
// size u64 | n_layer u32 | dtype u32 | row_elems u64 | n_tokens u64 |
// prefix u64 | ns u64 | reserved u64 | tokens i32[n_tokens] |
// positions i32[n_tokens - prefix] | layer checksums u64[n_layer] |
// per layer: K rows, then V rows (the layout of KvSpan::data()).
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
  int n_layer = 0;
  DType type = DType::F32;
  int64_t row_elems = 0;

  // Bytes before layer 0's K/V: header, tokens, positions, layer checksums.
  size_t head_bytes() const;
  // Bytes of one layer's K and V rows.
  size_t layer_bytes() const;
};

// The content key of a token sequence in a namespace: what the disk and
// remote tiers file a span under, the same in every process.
uint64_t span_content_key(uint64_t ns, std::span<const int32_t> tokens);

// tokens: the whole sequence; the span holds its last tokens.size() - prefix.
std::vector<uint8_t> encode_span_record(uint64_t key, uint64_t ns, std::span<const int32_t> tokens,
                                        int64_t prefix, const KvSpan& span);
size_t span_record_bytes(int64_t n_tokens, const KvSpan& span);

// The header of a record whose first kSpanRecordHeader bytes are given
// (sanity-checked: magic, dtype, sizes); no checksum is verified.
std::optional<SpanRecordHeader> decode_span_record_header(std::span<const uint8_t> head);

// Corrupt: the record is not sound (magic, size, a checksum, shape). Other:
// sound but not the one asked for (key, namespace, tokens, prefix: a hash
// collision or a stale record).
enum class RecordStatus { Ok, Corrupt, Other };

// A record's head, checked, for reading its layers one at a time: `span` has
// its positions and room for every layer's K/V, none of it filled yet.
struct SpanRecordHead {
  RecordStatus status = RecordStatus::Corrupt;
  SpanRecordHeader header;
  KvSpan span;
  std::vector<uint64_t> layer_checksums;
};
// `head`: at least the record's first head_bytes() bytes (more is ignored);
// a record's size is taken from its header, the caller checks it against
// what it holds.
SpanRecordHead decode_span_record_head(std::span<const uint8_t> head, uint64_t key, uint64_t ns,
                                       std::span<const int32_t> tokens, int64_t prefix);
// Whether layer il's K/V, as now in head.span, matches the record's checksum.
bool span_record_layer_ok(const SpanRecordHead& head, int il);

// A whole record read back: its head and every layer checked.
struct DecodedSpan {
  RecordStatus status = RecordStatus::Corrupt;
  KvSpan span;
};
DecodedSpan decode_span_record(std::span<const uint8_t> record, uint64_t key, uint64_t ns,
                               std::span<const int32_t> tokens, int64_t prefix);
// The tokens of a record (after its header), for scanning without loading K/V.
std::vector<int32_t> span_record_tokens(std::span<const uint8_t> record_start, int64_t n_tokens);

}  // namespace depcache

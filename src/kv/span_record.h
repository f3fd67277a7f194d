#pragma once
// The byte format of a stored span, shared by the disk tier (one file per
// span) and the remote tier (one value per block). A record names the span's
// key and namespace, carries the whole token sequence from its namespace's
// root to the span's end (the first `prefix` tokens are context, the rest
// are the span's own), the positions its keys were encoded at and the K/V
// bytes, layer after layer. A reader accepts a record only when all of these
// agree with what it asked for, and its shape (layers, row size, dtype) is
// the running model's. K/V rows are in the KV storage type's bytes
// (compute/kv_format.h: f32, f16 or q8_0 blocks).
//
// Confidentiality, integrity and authenticity against whoever can read or
// write the tier. The disk directory and Redis are shared: anyone who can
// write there could otherwise plant K/V that every replica serves, and
// anyone who can read there would read every tenant's prompts. With a
// deployment key (util/mac.h, --cache-key-file) a record is sealed with
// AES-256-GCM in sections, so it can still be read layer by layer
// (Cache-Craft's layer-wise preload: the first layers computed on while the
// later ones are still being read):
//  - the head's secret part (tokens, positions, namespace) is encrypted, its
//    tag covering the clear header and the table of layer tags;
//  - each layer's K/V is encrypted with its own tag, checked as that layer
//    arrives.
// Each section has its own nonce (the record's random 96 bits with the
// section's number) and every tag covers the clear header, so no section can
// be swapped for another's, within a record or across records. The name a
// record is filed under is its content key's stored_name(): a reader of the
// tier learns sizes and nothing else (not even which records share a
// namespace), and cannot test a guessed prompt against the names. Without a
// key, tokens and K/V are in clear with XXH3-64 checksums (in the first 8
// bytes of the tag slots): they catch torn or flipped bytes, not someone
// writing a record on purpose. The scheme is in the header and a reader
// accepts only its own, so an unkeyed record is never accepted by a keyed
// reader, nor the reverse.
//
// Layout (little-endian): magic "DKVSPAN5" | scheme u32 (1: checksums,
// 3: sealed) | nonce[8..12] u32 (sealed; else 0) | name u64 | size u64 |
// n_layer u32 | dtype u32 | row_elems u64 | n_tokens u64 | prefix u64 |
// ns u64 (sealed: 0) | nonce[0..8] u64 (sealed; else 0) |
// tokens i32[n_tokens] | positions i32[n_tokens - prefix] | (sealed: ns u64) |
// layer tags [32 B][n_layer] | head tag [32 B] | per layer: K rows, then V
// rows (KvSpan::data()). A sealed record's tags are GCM's 16 bytes and 16
// zeros.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kv/kv_span.h"
#include "util/mac.h"

namespace depcache {

inline constexpr size_t kSpanRecordHeader = 80;
inline constexpr size_t kSpanRecordTag = 32;

// What a span's K/V looks like for the running model and KV dtype.
struct SpanShape {
  int n_layer = 0;
  int64_t row_elems = 0;
  DType type = DType::F32;
  bool operator==(const SpanShape&) const = default;
};

// How records are written and checked: a key (null: unkeyed checksums) and,
// when known, the shape every record must have.
struct RecordSeal {
  const MacKey* key = nullptr;
  std::optional<SpanShape> shape;
};

struct SpanRecordHeader {
  uint32_t scheme = 0;  // 1: XXH3 checksums, 3: sealed (AES-256-GCM)
  uint64_t key = 0;     // the stored name
  uint64_t ns = 0;      // sealed: 0 (the namespace is encrypted)
  uint64_t size = 0;    // bytes of the whole record
  int64_t n_tokens = 0;
  int64_t prefix = 0;
  int n_layer = 0;
  DType type = DType::F32;
  int64_t row_elems = 0;

  // Bytes before layer 0's K/V: header, tokens, positions, layer tags, head tag.
  size_t head_bytes() const;
  // Bytes of one layer's K and V rows.
  size_t layer_bytes() const;
  SpanShape shape() const { return {n_layer, row_elems, type}; }
};

// The content key of a token sequence in a namespace, the same in every
// process.
uint64_t span_content_key(uint64_t ns, std::span<const int32_t> tokens);
// What the disk and remote tiers file a span under, and KV events call it:
// its content key, or with a deployment key the key's MacKey::name().
uint64_t stored_name(const MacKey* key, uint64_t content_key);

// tokens: the whole sequence; the span holds its last tokens.size() - prefix.
// key: the content key. nonce: drawn at random unless given (tests).
std::vector<uint8_t> encode_span_record(uint64_t key, uint64_t ns, std::span<const int32_t> tokens,
                                        int64_t prefix, const KvSpan& span, const MacKey* mac = nullptr,
                                        const CipherNonce* nonce = nullptr);
size_t span_record_bytes(int64_t n_tokens, const KvSpan& span, bool keyed);
// The bytes of a record of `shape` for a sequence of n_tokens whose last
// own_tokens are the span's.
size_t span_record_bytes(const SpanShape& shape, int64_t n_tokens, int64_t own_tokens, bool keyed);

// The header of a record whose first kSpanRecordHeader bytes are given
// (sanity-checked: magic, dtype, sizes); no tag is verified.
std::optional<SpanRecordHeader> decode_span_record_header(std::span<const uint8_t> head);

// Why a record is refused. Mac: a tag or checksum does not match (forged or
// damaged, or sealed under another key or scheme). Shape: authentic but not
// the running model's layers, row size or dtype. Other: malformed (magic,
// version, sizes, truncated) or authentic but not the one asked for (key,
// namespace, tokens, prefix: a hash collision or a record replayed under
// another name).
enum class RecordStatus { Ok, Mac, Shape, Other };
inline constexpr int kRejectReasons = 3;  // Mac, Shape, Other
inline int reject_index(RecordStatus s) { return static_cast<int>(s) - 1; }
const char* reject_reason_name(int reason);  // "mac", "shape", "other"

// A record's head, checked, for reading its layers one at a time: `span` has
// its positions and room for every layer's K/V, none of it filled yet.
struct SpanRecordHead {
  RecordStatus status = RecordStatus::Other;
  SpanRecordHeader header;
  KvSpan span;
  std::vector<MacTag> layer_tags;
  const MacKey* mac = nullptr;        // what the layers are checked (and decrypted) with
  std::vector<uint8_t> header_bytes;  // the clear header, which every tag covers
};
// `head`: at least the record's first head_bytes() bytes (more is ignored);
// a record's size is taken from its header, the caller checks it against
// what it holds.
SpanRecordHead decode_span_record_head(std::span<const uint8_t> head, uint64_t key, uint64_t ns,
                                       std::span<const int32_t> tokens, int64_t prefix,
                                       const RecordSeal& seal = {});
// Whether layer il's K/V, as now in head.span, matches the record's tag;
// a sealed record's layer is decrypted in place (unusable when false).
bool span_record_layer_ok(SpanRecordHead& head, int il);

// A whole record read back: its head and every layer checked.
struct DecodedSpan {
  RecordStatus status = RecordStatus::Other;
  KvSpan span;
};
DecodedSpan decode_span_record(std::span<const uint8_t> record, uint64_t key, uint64_t ns,
                               std::span<const int32_t> tokens, int64_t prefix, const RecordSeal& seal = {});
// What a record holds, from its head alone (at least head_bytes()), for
// scanning without loading K/V: nullopt when the head cannot be read with
// `mac` (another scheme; a sealed head whose tag fails). An unkeyed head's
// checksum is not checked here (decode_span_record_head does).
struct SpanRecordContents {
  uint64_t ns = 0;
  std::vector<int32_t> tokens;
  int64_t prefix = 0;
};
std::optional<SpanRecordContents> open_span_record_contents(std::span<const uint8_t> head, const MacKey* mac);

}  // namespace depcache

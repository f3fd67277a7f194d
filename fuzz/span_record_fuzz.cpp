// Span records, as the disk and remote tiers read them back from storage
// others can write to. Two kinds of input:
//  - raw bytes (mode 0): every decoder either refuses the bytes or returns a
//    span; a record accepted is exactly what encode_span_record writes for
//    that span (nothing in it goes unchecked); no sealed record opens (the
//    fuzzer does not hold the key);
//  - a record made by encode_span_record from shape, tokens and K/V taken
//    from the input (keyed or not), then changed at fuzzer-chosen offsets:
//    unchanged, it decodes to the same span; any byte changed, cut or added
//    makes every reader refuse it, as does a reader with the other seal.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "fuzz_support.h"
#include "kv/span_record.h"
#include "util/mac.h"

namespace {

using depcache::DType;
using depcache::KvSpan;
using depcache::RecordSeal;
using depcache::RecordStatus;
using depcache::fuzz::violated;

const depcache::MacKey& fuzz_key() {
  static const depcache::MacKey key(std::vector<uint8_t>(depcache::MacKey::kMinBytes, 0x5a));
  return key;
}

bool same_span(const KvSpan& a, const KvSpan& b) {
  return a.n_layer() == b.n_layer() && a.row_elems() == b.row_elems() && a.type() == b.type() &&
         a.positions() == b.positions() && a.data() == b.data();
}

// Raw bytes: decoded under the record's own names, so the decoders get as
// far as the bytes allow.
void raw_record(std::span<const uint8_t> bytes) {
  const std::optional<depcache::SpanRecordHeader> h = depcache::decode_span_record_header(bytes);
  if (!h) return;
  if (h->prefix < 0 || h->prefix > h->n_tokens || h->n_layer < 0) violated("header with an impossible shape");
  for (const depcache::MacKey* mac : {static_cast<const depcache::MacKey*>(nullptr), &fuzz_key()}) {
    const std::optional<depcache::SpanRecordContents> contents =
        depcache::open_span_record_contents(bytes, mac);
    if (!contents) continue;
    // Bytes not made with the key cannot open under it.
    if (mac) violated("a sealed head opened that was not sealed with the key");
    const std::vector<int32_t>& tokens = contents->tokens;
    if (contents->prefix != h->prefix || static_cast<int64_t>(tokens.size()) != h->n_tokens)
      violated("a head's contents disagree with its header");
    const RecordSeal seal{mac, std::nullopt};
    // The head alone, as the layer loader reads it; its contract: the caller
    // has checked the declared size against what it holds.
    if (h->size <= bytes.size()) {
      const depcache::SpanRecordHead head =
          depcache::decode_span_record_head(bytes, h->key, h->ns, tokens, h->prefix, seal);
      if (head.status == RecordStatus::Ok && head.span.n_tokens() != h->n_tokens - h->prefix)
        violated("head decoded with the wrong number of tokens");
    }
    const depcache::DecodedSpan d =
        depcache::decode_span_record(bytes, h->key, h->ns, tokens, h->prefix, seal);
    if (d.status != RecordStatus::Ok) continue;
    const std::vector<uint8_t> again =
        depcache::encode_span_record(h->key, h->ns, tokens, h->prefix, d.span, mac);
    if (!std::equal(again.begin(), again.end(), bytes.begin(), bytes.end()))
      violated("an accepted record is not what encoding its span gives");
  }
}

// A record encoded from the input, then changed (or not).
void made_record(uint8_t mode, depcache::fuzz::Bytes& in) {
  const uint8_t shape = in.u8();
  const int n_layer = 1 + shape % 3;
  // q8_0 rows are whole blocks of 32; f32 and f16 rows any length.
  const DType type = shape & 0x80 ? DType::F16 : shape & 0x40 ? DType::Q8_0 : DType::F32;
  const int64_t row_elems = type == DType::Q8_0 ? 32 * (1 + (shape >> 2) % 2) : 1 + (shape >> 2) % 5;
  const int64_t n_tokens = 1 + in.u8() % 12;
  const int64_t prefix = in.u8() % n_tokens;  // at least one own token
  std::vector<int32_t> tokens(static_cast<size_t>(n_tokens));
  for (int32_t& t : tokens) t = static_cast<int32_t>(in.u8()) * 37;
  KvSpan span(n_layer, row_elems, type, n_tokens - prefix);
  for (int32_t& p : span.positions()) p = static_cast<int32_t>(in.u8());
  for (uint8_t& b : span.data()) b = in.u8();
  const uint64_t key = 0x1000 + in.u8(), ns = in.u8();
  const depcache::MacKey* mac = mode & 2 ? &fuzz_key() : nullptr;
  depcache::CipherNonce nonce{};
  for (uint8_t& b : nonce) b = in.u8();  // drawn at random in use; from the input here, to replay a case
  std::vector<uint8_t> record = depcache::encode_span_record(key, ns, tokens, prefix, span, mac, &nonce);
  const std::vector<uint8_t> original = record;

  // Changes: (offset, xor) pairs, then a cut or an extension.
  const uint8_t n_changes = in.u8() % 4;
  for (uint8_t i = 0; i < n_changes; ++i) {
    const size_t at = (static_cast<size_t>(in.u8()) << 8 | in.u8()) % record.size();
    record[at] ^= in.u8();
  }
  const uint8_t resize = in.u8();
  if (resize & 0x80)
    record.resize(record.size() - std::min<size_t>(record.size(), resize & 0x7f));
  else if (resize & 0x40)
    record.resize(record.size() + (resize & 0x3f), 0);
  const bool changed = record != original;

  const RecordSeal own{mac, depcache::SpanShape{n_layer, row_elems, type}};
  const depcache::DecodedSpan d = depcache::decode_span_record(record, key, ns, tokens, prefix, own);
  if (!changed && (d.status != RecordStatus::Ok || !same_span(d.span, span)))
    violated("a record as encoded does not decode to its span");
  if (changed && d.status == RecordStatus::Ok) violated("a changed record was accepted");

  // The head, then each layer, as the layer-wise loader reads them.
  if (record.size() >= depcache::kSpanRecordHeader) {
    depcache::SpanRecordHead head = depcache::decode_span_record_head(record, key, ns, tokens, prefix, own);
    if (head.status == RecordStatus::Ok) {
      const size_t from = head.header.head_bytes();
      const size_t layer = head.header.layer_bytes();
      bool all_ok = true;
      for (int il = 0; il < n_layer; ++il) {
        const size_t at = from + static_cast<size_t>(il) * layer;
        if (at + layer > record.size()) {
          all_ok = false;
          break;
        }
        std::memcpy(head.span.k(il), record.data() + at, layer);
        all_ok = all_ok && depcache::span_record_layer_ok(head, il);
      }
      if (!changed && !all_ok) violated("a layer as encoded fails its check");
      if (changed && all_ok && record.size() == head.header.size)
        violated("a changed record passed layer by layer");
    } else if (!changed) {
      violated("the head of a record as encoded was refused");
    }
  }

  // Another seal: the other scheme, or the right one with another shape.
  const RecordSeal other{mac ? nullptr : &fuzz_key(), std::nullopt};
  if (depcache::decode_span_record(record, key, ns, tokens, prefix, other).status == RecordStatus::Ok)
    violated("a record was accepted under the other scheme");
  const RecordSeal wrong_shape{mac, depcache::SpanShape{n_layer + 1, row_elems, type}};
  if (depcache::decode_span_record(record, key, ns, tokens, prefix, wrong_shape).status == RecordStatus::Ok)
    violated("a record was accepted for another model's shape");
  // Another name: key, namespace or prefix.
  if (depcache::decode_span_record(record, key + 1, ns, tokens, prefix, own).status == RecordStatus::Ok ||
      depcache::decode_span_record(record, key, ns + 1, tokens, prefix, own).status == RecordStatus::Ok)
    violated("a record was accepted under another name");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  depcache::fuzz::Bytes in(data, size);
  const uint8_t mode = in.u8();
  if (mode & 1)
    made_record(mode, in);
  else
    raw_record(in.rest());
  return 0;
}

#include "kv/span_record.h"

#include <openssl/crypto.h>

#include <cstring>

#include "compute/kv_format.h"
#include "util/error.h"
#include "util/hash.h"

namespace depcache {
namespace {

constexpr char kSpanMagic[8] = {'D', 'K', 'V', 'S', 'P', 'A', 'N', '5'};
constexpr uint32_t kSchemeChecksum = 1, kSchemeHmac = 2;
// Domain separation: a layer's tag can never stand for a head's.
constexpr uint8_t kHeadDomain[1] = {'H'}, kLayerDomain[1] = {'L'};

// memcpy and memcmp where a side may be an empty vector's data(), which can
// be null: passing null is undefined even for 0 bytes.
void copy_bytes(void* to, const void* from, size_t n) {
  if (n > 0) std::memcpy(to, from, n);
}
bool same_bytes(const void* a, const void* b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

template <typename T>
void put_at(std::vector<uint8_t>& buf, size_t at, T v) {
  std::memcpy(buf.data() + at, &v, sizeof v);
}
template <typename T>
T get_at(std::span<const uint8_t> buf, size_t at) {
  T v;
  std::memcpy(&v, buf.data() + at, sizeof v);
  return v;
}

size_t head_bytes_of(uint64_t n_tokens, uint64_t prefix, uint64_t n_layer) {
  return kSpanRecordHeader + 4 * n_tokens + 4 * (n_tokens - prefix) + kSpanRecordTag * (n_layer + 1);
}

size_t layer_bytes_of(uint64_t row_elems, DType type, uint64_t own_tokens) {
  return static_cast<size_t>(2 * own_tokens) * kv_row_bytes(type, static_cast<int64_t>(row_elems));
}

// The tag (keyed) or checksum (unkeyed, zero-padded) of some bytes.
MacTag seal_of(const MacKey* mac, std::span<const uint8_t> domain, std::span<const uint8_t> bytes) {
  if (mac) return mac->tag({domain, bytes});
  MacTag t{};
  const uint64_t h = hash_bytes(bytes.data(), bytes.size(), domain[0]);
  std::memcpy(t.data(), &h, sizeof h);
  return t;
}

bool seal_ok(const MacKey* mac, std::span<const uint8_t> domain, std::span<const uint8_t> bytes,
             const uint8_t* expected) {
  if (mac) return mac->check({expected, kSpanRecordTag}, {domain, bytes});
  const MacTag t = seal_of(nullptr, domain, bytes);
  return std::memcmp(t.data(), expected, t.size()) == 0;
}

std::span<const uint8_t> layer_of(const KvSpan& span, int il) {
  return {span.k(il), 2 * static_cast<size_t>(span.n_tokens()) * span.row_bytes()};
}

}  // namespace

const char* reject_reason_name(int reason) {
  static const char* const names[kRejectReasons] = {"mac", "shape", "other"};
  return reason >= 0 && reason < kRejectReasons ? names[reason] : "other";
}

size_t SpanRecordHeader::head_bytes() const {
  return head_bytes_of(static_cast<uint64_t>(n_tokens), static_cast<uint64_t>(prefix),
                       static_cast<uint64_t>(n_layer));
}

size_t SpanRecordHeader::layer_bytes() const {
  return layer_bytes_of(static_cast<uint64_t>(row_elems), type, static_cast<uint64_t>(n_tokens - prefix));
}

uint64_t span_content_key(uint64_t ns, std::span<const int32_t> tokens) {
  const uint64_t h = hash_bytes(&ns, sizeof ns);
  return hash_bytes(tokens.data(), tokens.size_bytes(), h);
}

size_t span_record_bytes(int64_t n_tokens, const KvSpan& span) {
  const auto n = static_cast<uint64_t>(n_tokens);
  return head_bytes_of(n, n - static_cast<uint64_t>(span.n_tokens()), static_cast<uint64_t>(span.n_layer())) +
         span.data().size();
}

std::vector<uint8_t> encode_span_record(uint64_t key, uint64_t ns, std::span<const int32_t> tokens,
                                        int64_t prefix, const KvSpan& span, const MacKey* mac) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (prefix < 0 || n - prefix != span.n_tokens())
    fail(ErrorKind::Internal, "span record: {} tokens after a prefix of {} for a span of {}", n - prefix,
         prefix, span.n_tokens());
  const size_t size = span_record_bytes(n, span);
  std::vector<uint8_t> buf(size, 0);
  std::memcpy(buf.data(), kSpanMagic, sizeof kSpanMagic);
  put_at<uint32_t>(buf, 8, mac ? kSchemeHmac : kSchemeChecksum);
  put_at<uint64_t>(buf, 16, key);
  put_at<uint64_t>(buf, 24, size);
  put_at<uint32_t>(buf, 32, static_cast<uint32_t>(span.n_layer()));
  put_at<uint32_t>(buf, 36, static_cast<uint32_t>(span.type()));
  put_at<uint64_t>(buf, 40, static_cast<uint64_t>(span.row_elems()));
  put_at<uint64_t>(buf, 48, static_cast<uint64_t>(n));
  put_at<uint64_t>(buf, 56, static_cast<uint64_t>(prefix));
  put_at<uint64_t>(buf, 64, ns);
  size_t at = kSpanRecordHeader;
  copy_bytes(buf.data() + at, tokens.data(), 4 * tokens.size());
  at += 4 * tokens.size();
  copy_bytes(buf.data() + at, span.positions().data(), 4 * span.positions().size());
  at += 4 * span.positions().size();
  for (int il = 0; il < span.n_layer(); ++il, at += kSpanRecordTag) {
    const MacTag t = seal_of(mac, kLayerDomain, layer_of(span, il));
    std::memcpy(buf.data() + at, t.data(), t.size());
  }
  const MacTag head = seal_of(mac, kHeadDomain, {buf.data(), at});
  std::memcpy(buf.data() + at, head.data(), head.size());
  at += kSpanRecordTag;
  copy_bytes(buf.data() + at, span.data().data(), span.data().size());
  return buf;
}

std::optional<SpanRecordHeader> decode_span_record_header(std::span<const uint8_t> head) {
  if (head.size() < kSpanRecordHeader || std::memcmp(head.data(), kSpanMagic, sizeof kSpanMagic) != 0)
    return std::nullopt;
  const uint32_t scheme = get_at<uint32_t>(head, 8);
  const uint32_t n_layer = get_at<uint32_t>(head, 32), type_id = get_at<uint32_t>(head, 36);
  const uint64_t row_elems = get_at<uint64_t>(head, 40), n = get_at<uint64_t>(head, 48),
                 prefix = get_at<uint64_t>(head, 56);
  const auto type = static_cast<DType>(type_id);
  // Reserved fields are zero: nothing in a record goes unchecked.
  if (get_at<uint32_t>(head, 12) != 0 || get_at<uint64_t>(head, 72) != 0) return std::nullopt;
  // The type and row length are checked before any size is computed from
  // them (q8_0 rows must be whole blocks).
  if ((scheme != kSchemeChecksum && scheme != kSchemeHmac) || n_layer > 4096 || row_elems > (1u << 20) ||
      n > (1u << 26) || prefix > n || !dtype_info(type_id) ||
      !kv_type_fits(type, static_cast<int64_t>(row_elems)))
    return std::nullopt;
  SpanRecordHeader h;
  h.scheme = scheme;
  h.key = get_at<uint64_t>(head, 16);
  h.size = get_at<uint64_t>(head, 24);
  h.ns = get_at<uint64_t>(head, 64);
  h.n_tokens = static_cast<int64_t>(n);
  h.prefix = static_cast<int64_t>(prefix);
  h.n_layer = static_cast<int>(n_layer);
  h.type = type;
  h.row_elems = static_cast<int64_t>(row_elems);
  if (h.size != h.head_bytes() + n_layer * h.layer_bytes()) return std::nullopt;
  return h;
}

std::vector<int32_t> span_record_tokens(std::span<const uint8_t> record_start, int64_t n_tokens) {
  std::vector<int32_t> tokens(static_cast<size_t>(n_tokens));
  if (record_start.size() < kSpanRecordHeader + 4 * tokens.size())
    fail(ErrorKind::Internal, "span record: {} bytes hold no {} tokens", record_start.size(), n_tokens);
  copy_bytes(tokens.data(), record_start.data() + kSpanRecordHeader, 4 * tokens.size());
  return tokens;
}

SpanRecordHead decode_span_record_head(std::span<const uint8_t> head, uint64_t key, uint64_t ns,
                                       std::span<const int32_t> tokens, int64_t prefix,
                                       const RecordSeal& seal) {
  SpanRecordHead out;
  const std::optional<SpanRecordHeader> h = decode_span_record_header(head);
  if (!h || head.size() < h->head_bytes()) return out;  // foreign, old or truncated
  out.header = *h;
  // Authenticity first: nothing in a head that fails is believed, not even
  // its shape. A record of the other scheme cannot be checked: refused.
  const size_t tag_at = h->head_bytes() - kSpanRecordTag;
  out.status = RecordStatus::Mac;
  if (h->scheme != (seal.key ? kSchemeHmac : kSchemeChecksum) ||
      !seal_ok(seal.key, kHeadDomain, head.first(tag_at), head.data() + tag_at))
    return out;
  out.status = RecordStatus::Shape;
  if (seal.shape && h->shape() != *seal.shape) return out;
  out.status = RecordStatus::Other;
  if (h->key != key || h->ns != ns || h->prefix != prefix ||
      h->n_tokens != static_cast<int64_t>(tokens.size()))
    return out;
  if (!same_bytes(head.data() + kSpanRecordHeader, tokens.data(), tokens.size_bytes())) return out;
  const int64_t own = h->n_tokens - h->prefix;
  out.status = RecordStatus::Ok;
  out.mac = seal.key;
  out.span = KvSpan(h->n_layer, h->row_elems, h->type, own);
  size_t at = kSpanRecordHeader + tokens.size_bytes();
  copy_bytes(out.span.positions().data(), head.data() + at, 4 * static_cast<size_t>(own));
  at += 4 * static_cast<size_t>(own);
  out.layer_tags.resize(static_cast<size_t>(h->n_layer));
  for (MacTag& t : out.layer_tags) {
    std::memcpy(t.data(), head.data() + at, t.size());
    at += t.size();
  }
  return out;
}

bool span_record_layer_ok(const SpanRecordHead& head, int il) {
  return head.status == RecordStatus::Ok && il >= 0 && il < head.span.n_layer() &&
         seal_ok(head.mac, kLayerDomain, layer_of(head.span, il),
                 head.layer_tags[static_cast<size_t>(il)].data());
}

DecodedSpan decode_span_record(std::span<const uint8_t> record, uint64_t key, uint64_t ns,
                               std::span<const int32_t> tokens, int64_t prefix, const RecordSeal& seal) {
  DecodedSpan out;
  // A record's size is checked before anything is made from its header: a
  // header may claim a span far larger than the bytes that came.
  if (const std::optional<SpanRecordHeader> h = decode_span_record_header(record);
      h && h->size != record.size()) {
    out.status = RecordStatus::Mac;  // cut or extended: not the record that was sealed
    return out;
  }
  SpanRecordHead head = decode_span_record_head(record, key, ns, tokens, prefix, seal);
  out.status = head.status;
  if (head.status != RecordStatus::Ok) return out;
  const size_t from = head.header.head_bytes();
  copy_bytes(head.span.data().data(), record.data() + from, head.span.data().size());
  for (int il = 0; il < head.span.n_layer(); ++il)
    if (!span_record_layer_ok(head, il)) {
      out.status = RecordStatus::Mac;
      return out;
    }
  out.span = std::move(head.span);
  return out;
}

}  // namespace depcache

#include "kv/span_record.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

#include "compute/kv_format.h"
#include "util/error.h"
#include "util/hash.h"

namespace depcache {
namespace {

constexpr char kSpanMagic[8] = {'D', 'K', 'V', 'S', 'P', 'A', 'N', '5'};
// 2 (HMAC tags over clear tokens and K/V) was written by earlier releases:
// refused now, as any record of another scheme.
constexpr uint32_t kSchemeChecksum = 1, kSchemeSealed = 3;
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

// The encrypted part of a sealed record's head: tokens, positions and, last,
// the namespace (in clear it would tell whose records are whose).
size_t secret_bytes_of(uint32_t scheme, uint64_t n_tokens, uint64_t prefix) {
  return 4 * n_tokens + 4 * (n_tokens - prefix) + (scheme == kSchemeSealed ? 8 : 0);
}

size_t head_bytes_of(uint32_t scheme, uint64_t n_tokens, uint64_t prefix, uint64_t n_layer) {
  return kSpanRecordHeader + secret_bytes_of(scheme, n_tokens, prefix) + kSpanRecordTag * (n_layer + 1);
}

// A sealed record's nonce for section s (0: the head, 1 + il: layer il):
// the record's random 96 bits (header bytes 72..80 and 12..16) with s in
// the last 32. Records draw theirs at random, so no two sections of any two
// records share one (but with odds of 2^-64 per pair).
CipherNonce section_nonce(std::span<const uint8_t> header, uint32_t s) {
  CipherNonce n{};
  std::memcpy(n.data(), header.data() + 72, 8);
  uint32_t low;
  std::memcpy(&low, header.data() + 12, 4);
  low ^= s;
  std::memcpy(n.data() + 8, &low, 4);
  return n;
}

bool zero_bytes(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}

size_t layer_bytes_of(uint64_t row_elems, DType type, uint64_t own_tokens) {
  return static_cast<size_t>(2 * own_tokens) * kv_row_bytes(type, static_cast<int64_t>(row_elems));
}

// The checksum of an unkeyed record's part, zero-padded to a tag's slot.
MacTag checksum_of(std::span<const uint8_t> domain, std::span<const uint8_t> bytes) {
  MacTag t{};
  const uint64_t h = hash_bytes(bytes.data(), bytes.size(), domain[0]);
  std::memcpy(t.data(), &h, sizeof h);
  return t;
}

bool checksum_ok(std::span<const uint8_t> domain, std::span<const uint8_t> bytes, const uint8_t* expected) {
  const MacTag t = checksum_of(domain, bytes);
  return std::memcmp(t.data(), expected, t.size()) == 0;
}

std::span<uint8_t> layer_of(KvSpan& span, int il) {
  return {span.k(il), 2 * static_cast<size_t>(span.n_tokens()) * span.row_bytes()};
}

}  // namespace

const char* reject_reason_name(int reason) {
  static const char* const names[kRejectReasons] = {"mac", "shape", "other"};
  return reason >= 0 && reason < kRejectReasons ? names[reason] : "other";
}

size_t SpanRecordHeader::head_bytes() const {
  return head_bytes_of(scheme, static_cast<uint64_t>(n_tokens), static_cast<uint64_t>(prefix),
                       static_cast<uint64_t>(n_layer));
}

size_t SpanRecordHeader::layer_bytes() const {
  return layer_bytes_of(static_cast<uint64_t>(row_elems), type, static_cast<uint64_t>(n_tokens - prefix));
}

uint64_t span_content_key(uint64_t ns, std::span<const int32_t> tokens) {
  const uint64_t h = hash_bytes(&ns, sizeof ns);
  return hash_bytes(tokens.data(), tokens.size_bytes(), h);
}

uint64_t stored_name(const MacKey* key, uint64_t content_key) {
  return key ? key->name(content_key) : content_key;
}

size_t span_record_bytes(const SpanShape& shape, int64_t n_tokens, int64_t own_tokens, bool keyed) {
  const auto n = static_cast<uint64_t>(n_tokens), own = static_cast<uint64_t>(own_tokens);
  return head_bytes_of(keyed ? kSchemeSealed : kSchemeChecksum, n, n - own,
                       static_cast<uint64_t>(shape.n_layer)) +
         static_cast<size_t>(shape.n_layer) *
             layer_bytes_of(static_cast<uint64_t>(shape.row_elems), shape.type, own);
}

size_t span_record_bytes(int64_t n_tokens, const KvSpan& span, bool keyed) {
  const auto n = static_cast<uint64_t>(n_tokens);
  return head_bytes_of(keyed ? kSchemeSealed : kSchemeChecksum, n, n - static_cast<uint64_t>(span.n_tokens()),
                       static_cast<uint64_t>(span.n_layer())) +
         span.data().size();
}

std::vector<uint8_t> encode_span_record(uint64_t key, uint64_t ns, std::span<const int32_t> tokens,
                                        int64_t prefix, const KvSpan& span, const MacKey* mac,
                                        const CipherNonce* nonce) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (prefix < 0 || n - prefix != span.n_tokens())
    fail(ErrorKind::Internal, "span record: {} tokens after a prefix of {} for a span of {}", n - prefix,
         prefix, span.n_tokens());
  const uint32_t scheme = mac ? kSchemeSealed : kSchemeChecksum;
  const size_t size = span_record_bytes(n, span, mac != nullptr);
  std::vector<uint8_t> buf(size, 0);
  std::memcpy(buf.data(), kSpanMagic, sizeof kSpanMagic);
  put_at<uint32_t>(buf, 8, scheme);
  put_at<uint64_t>(buf, 16, stored_name(mac, key));
  put_at<uint64_t>(buf, 24, size);
  put_at<uint32_t>(buf, 32, static_cast<uint32_t>(span.n_layer()));
  put_at<uint32_t>(buf, 36, static_cast<uint32_t>(span.type()));
  put_at<uint64_t>(buf, 40, static_cast<uint64_t>(span.row_elems()));
  put_at<uint64_t>(buf, 48, static_cast<uint64_t>(n));
  put_at<uint64_t>(buf, 56, static_cast<uint64_t>(prefix));
  put_at<uint64_t>(buf, 64, mac ? 0 : ns);
  if (mac) {
    CipherNonce drawn{};
    if (!nonce) {
      if (RAND_bytes(drawn.data(), static_cast<int>(drawn.size())) != 1)
        fail(ErrorKind::Internal, "span record: OpenSSL drew no random nonce");
      nonce = &drawn;
    }
    std::memcpy(buf.data() + 72, nonce->data(), 8);
    std::memcpy(buf.data() + 12, nonce->data() + 8, 4);
  }
  const std::span<const uint8_t> header(buf.data(), kSpanRecordHeader);
  size_t at = kSpanRecordHeader;
  const size_t secret_at = at;
  copy_bytes(buf.data() + at, tokens.data(), 4 * tokens.size());
  at += 4 * tokens.size();
  copy_bytes(buf.data() + at, span.positions().data(), 4 * span.positions().size());
  at += 4 * span.positions().size();
  if (mac) {
    put_at<uint64_t>(buf, at, ns);
    at += 8;
  }
  const size_t table_at = at;
  const size_t layers_at = table_at + kSpanRecordTag * static_cast<size_t>(span.n_layer() + 1);
  copy_bytes(buf.data() + layers_at, span.data().data(), span.data().size());
  const size_t layer_bytes =
      span.n_layer() > 0 ? span.data().size() / static_cast<size_t>(span.n_layer()) : 0;
  for (int il = 0; il < span.n_layer(); ++il, at += kSpanRecordTag) {
    const std::span<uint8_t> layer(buf.data() + layers_at + static_cast<size_t>(il) * layer_bytes,
                                   layer_bytes);
    if (mac) {
      const CipherTag t = mac->seal(section_nonce(header, static_cast<uint32_t>(il + 1)), {header}, layer);
      std::memcpy(buf.data() + at, t.data(), t.size());
    } else {
      const MacTag t = checksum_of(kLayerDomain, layer);
      std::memcpy(buf.data() + at, t.data(), t.size());
    }
  }
  if (mac) {
    const CipherTag t = mac->seal(section_nonce(header, 0), {header, {buf.data() + table_at, at - table_at}},
                                  {buf.data() + secret_at, table_at - secret_at});
    std::memcpy(buf.data() + at, t.data(), t.size());
  } else {
    const MacTag t = checksum_of(kHeadDomain, {buf.data(), at});
    std::memcpy(buf.data() + at, t.data(), t.size());
  }
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
  // Reserved fields are zero: nothing in a record goes unchecked. A sealed
  // record's nonce sits where an unkeyed one has zeros, and its namespace
  // is in the encrypted head.
  if (scheme == kSchemeChecksum && (get_at<uint32_t>(head, 12) != 0 || get_at<uint64_t>(head, 72) != 0))
    return std::nullopt;
  if (scheme == kSchemeSealed && get_at<uint64_t>(head, 64) != 0) return std::nullopt;
  // The type and row length are checked before any size is computed from
  // them (q8_0 rows must be whole blocks).
  if ((scheme != kSchemeChecksum && scheme != kSchemeSealed) || n_layer > 4096 || row_elems > (1u << 20) ||
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

namespace {

// A head's secret part (tokens, positions, and a sealed record's namespace)
// in clear: decrypted and checked against the head tag for a sealed record
// (nullopt when it does not match, or the record is of another scheme than
// the key asks), as it is for one with checksums (checked by the caller).
std::optional<std::vector<uint8_t>> open_head(const SpanRecordHeader& h, std::span<const uint8_t> head,
                                              const MacKey* mac) {
  if (h.scheme != (mac ? kSchemeSealed : kSchemeChecksum) || head.size() < h.head_bytes())
    return std::nullopt;
  const size_t secret =
      secret_bytes_of(h.scheme, static_cast<uint64_t>(h.n_tokens), static_cast<uint64_t>(h.prefix));
  std::vector<uint8_t> clear(head.begin() + kSpanRecordHeader, head.begin() + kSpanRecordHeader + secret);
  if (!mac) return clear;
  const size_t table_at = kSpanRecordHeader + secret, tag_at = h.head_bytes() - kSpanRecordTag;
  const std::span<const uint8_t> header = head.first(kSpanRecordHeader);
  // The tags' unused halves are zero, so a record has one form only.
  for (size_t t = table_at; t <= tag_at; t += kSpanRecordTag)
    if (!zero_bytes(head.data() + t + sizeof(CipherTag), kSpanRecordTag - sizeof(CipherTag)))
      return std::nullopt;
  if (!mac->open(section_nonce(header, 0), {header, head.subspan(table_at, tag_at - table_at)}, clear,
                 head.subspan(tag_at, sizeof(CipherTag))))
    return std::nullopt;
  return clear;
}

}  // namespace

std::optional<SpanRecordContents> open_span_record_contents(std::span<const uint8_t> head,
                                                            const MacKey* mac) {
  const std::optional<SpanRecordHeader> h = decode_span_record_header(head);
  if (!h) return std::nullopt;
  const std::optional<std::vector<uint8_t>> clear = open_head(*h, head, mac);
  if (!clear) return std::nullopt;
  SpanRecordContents out;
  out.tokens.resize(static_cast<size_t>(h->n_tokens));
  copy_bytes(out.tokens.data(), clear->data(), 4 * out.tokens.size());
  out.ns = mac ? get_at<uint64_t>(*clear, clear->size() - 8) : h->ns;
  out.prefix = h->prefix;
  return out;
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
  const std::optional<std::vector<uint8_t>> clear = open_head(*h, head, seal.key);
  if (!clear || (!seal.key && !checksum_ok(kHeadDomain, head.first(tag_at), head.data() + tag_at)))
    return out;
  out.status = RecordStatus::Shape;
  if (seal.shape && h->shape() != *seal.shape) return out;
  out.status = RecordStatus::Other;
  const uint64_t held_ns = seal.key ? get_at<uint64_t>(*clear, clear->size() - 8) : h->ns;
  if (h->key != stored_name(seal.key, key) || held_ns != ns || h->prefix != prefix ||
      h->n_tokens != static_cast<int64_t>(tokens.size()))
    return out;
  if (!same_bytes(clear->data(), tokens.data(), tokens.size_bytes())) return out;
  const int64_t own = h->n_tokens - h->prefix;
  out.status = RecordStatus::Ok;
  out.mac = seal.key;
  out.span = KvSpan(h->n_layer, h->row_elems, h->type, own);
  copy_bytes(out.span.positions().data(), clear->data() + tokens.size_bytes(), 4 * static_cast<size_t>(own));
  size_t at = kSpanRecordHeader + clear->size();
  out.header_bytes.assign(head.begin(), head.begin() + kSpanRecordHeader);
  out.layer_tags.resize(static_cast<size_t>(h->n_layer));
  for (MacTag& t : out.layer_tags) {
    std::memcpy(t.data(), head.data() + at, t.size());
    at += t.size();
  }
  return out;
}

bool span_record_layer_ok(SpanRecordHead& head, int il) {
  if (head.status != RecordStatus::Ok || il < 0 || il >= head.span.n_layer()) return false;
  const MacTag& tag = head.layer_tags[static_cast<size_t>(il)];
  if (!head.mac) return checksum_ok(kLayerDomain, layer_of(head.span, il), tag.data());
  const std::span<const uint8_t> header(head.header_bytes);
  return head.mac->open(section_nonce(header, static_cast<uint32_t>(il + 1)), {header},
                        layer_of(head.span, il), std::span<const uint8_t>(tag.data(), sizeof(CipherTag)));
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

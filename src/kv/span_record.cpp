#include "kv/span_record.h"

#include <cstring>

#include "util/error.h"
#include "util/hash.h"

namespace depcache {
namespace {

constexpr char kSpanMagic[8] = {'D', 'K', 'V', 'S', 'P', 'A', 'N', '4'};
constexpr size_t kChecksumFrom = 16;  // the head checksum covers the head after itself

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

size_t elem_bytes(DType type) { return type == DType::F16 ? 2 : 4; }

size_t head_bytes_of(uint64_t n_tokens, uint64_t prefix, uint64_t n_layer) {
  return kSpanRecordHeader + 4 * n_tokens + 4 * (n_tokens - prefix) + 8 * n_layer;
}

size_t layer_bytes_of(uint64_t row_elems, DType type, uint64_t own_tokens) {
  return static_cast<size_t>(2 * own_tokens * row_elems * elem_bytes(type));
}

uint64_t layer_checksum(const KvSpan& span, int il) {
  return hash_bytes(span.k(il), 2 * static_cast<size_t>(span.n_tokens()) * span.row_bytes());
}

}  // namespace

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
                                        int64_t prefix, const KvSpan& span) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (prefix < 0 || n - prefix != span.n_tokens())
    fail(ErrorKind::Internal, "span record: {} tokens after a prefix of {} for a span of {}", n - prefix,
         prefix, span.n_tokens());
  const size_t size = span_record_bytes(n, span);
  std::vector<uint8_t> buf(size, 0);
  std::memcpy(buf.data(), kSpanMagic, sizeof kSpanMagic);
  put_at<uint64_t>(buf, 16, key);
  put_at<uint64_t>(buf, 24, size);
  put_at<uint32_t>(buf, 32, static_cast<uint32_t>(span.n_layer()));
  put_at<uint32_t>(buf, 36, static_cast<uint32_t>(span.type()));
  put_at<uint64_t>(buf, 40, static_cast<uint64_t>(span.row_elems()));
  put_at<uint64_t>(buf, 48, static_cast<uint64_t>(n));
  put_at<uint64_t>(buf, 56, static_cast<uint64_t>(prefix));
  put_at<uint64_t>(buf, 64, ns);
  size_t at = kSpanRecordHeader;
  std::memcpy(buf.data() + at, tokens.data(), 4 * tokens.size());
  at += 4 * tokens.size();
  std::memcpy(buf.data() + at, span.positions().data(), 4 * span.positions().size());
  at += 4 * span.positions().size();
  for (int il = 0; il < span.n_layer(); ++il, at += 8) put_at<uint64_t>(buf, at, layer_checksum(span, il));
  const size_t head = at;
  if (!span.data().empty()) std::memcpy(buf.data() + at, span.data().data(), span.data().size());
  put_at<uint64_t>(buf, 8, hash_bytes(buf.data() + kChecksumFrom, head - kChecksumFrom));
  return buf;
}

std::optional<SpanRecordHeader> decode_span_record_header(std::span<const uint8_t> head) {
  if (head.size() < kSpanRecordHeader || std::memcmp(head.data(), kSpanMagic, sizeof kSpanMagic) != 0)
    return std::nullopt;
  const uint32_t n_layer = get_at<uint32_t>(head, 32), type_id = get_at<uint32_t>(head, 36);
  const uint64_t row_elems = get_at<uint64_t>(head, 40), n = get_at<uint64_t>(head, 48),
                 prefix = get_at<uint64_t>(head, 56);
  const auto type = static_cast<DType>(type_id);
  if ((type != DType::F32 && type != DType::F16) || n_layer > 4096 || row_elems > (1u << 20) ||
      n > (1u << 26) || prefix > n)
    return std::nullopt;
  SpanRecordHeader h;
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
  std::memcpy(tokens.data(), record_start.data() + kSpanRecordHeader, 4 * tokens.size());
  return tokens;
}

SpanRecordHead decode_span_record_head(std::span<const uint8_t> head, uint64_t key, uint64_t ns,
                                       std::span<const int32_t> tokens, int64_t prefix) {
  SpanRecordHead out;
  const std::optional<SpanRecordHeader> h = decode_span_record_header(head);
  if (!h || head.size() < h->head_bytes()) return out;  // foreign or truncated
  const size_t head_end = h->head_bytes();
  if (get_at<uint64_t>(head, 8) != hash_bytes(head.data() + kChecksumFrom, head_end - kChecksumFrom))
    return out;
  out.status = RecordStatus::Other;
  out.header = *h;
  if (h->key != key || h->ns != ns || h->prefix != prefix ||
      h->n_tokens != static_cast<int64_t>(tokens.size()))
    return out;
  if (std::memcmp(head.data() + kSpanRecordHeader, tokens.data(), tokens.size_bytes()) != 0) return out;
  const int64_t own = h->n_tokens - h->prefix;
  out.status = RecordStatus::Ok;
  out.span = KvSpan(h->n_layer, h->row_elems, h->type, own);
  size_t at = kSpanRecordHeader + tokens.size_bytes();
  std::memcpy(out.span.positions().data(), head.data() + at, 4 * static_cast<size_t>(own));
  at += 4 * static_cast<size_t>(own);
  out.layer_checksums.resize(static_cast<size_t>(h->n_layer));
  std::memcpy(out.layer_checksums.data(), head.data() + at, 8 * out.layer_checksums.size());
  return out;
}

bool span_record_layer_ok(const SpanRecordHead& head, int il) {
  return head.status == RecordStatus::Ok && il >= 0 && il < head.span.n_layer() &&
         layer_checksum(head.span, il) == head.layer_checksums[static_cast<size_t>(il)];
}

DecodedSpan decode_span_record(std::span<const uint8_t> record, uint64_t key, uint64_t ns,
                               std::span<const int32_t> tokens, int64_t prefix) {
  DecodedSpan out;
  SpanRecordHead head = decode_span_record_head(record, key, ns, tokens, prefix);
  if (head.status != RecordStatus::Corrupt && head.header.size != record.size())
    return out;  // cut or extended
  out.status = head.status;
  if (head.status != RecordStatus::Ok) return out;
  const size_t from = head.header.head_bytes();
  if (!head.span.data().empty())
    std::memcpy(head.span.data().data(), record.data() + from, head.span.data().size());
  for (int il = 0; il < head.span.n_layer(); ++il)
    if (!span_record_layer_ok(head, il)) {
      out.status = RecordStatus::Corrupt;
      return out;
    }
  out.span = std::move(head.span);
  return out;
}

}  // namespace depcache

#include "kv/span_record.h"

#include <cstring>

#include "util/error.h"
#include "util/hash.h"

namespace depcache {
namespace {

constexpr char kMagic[8] = {'D', 'K', 'V', 'S', 'P', 'A', 'N', '3'};
constexpr size_t kChecksumFrom = 16;  // the checksum covers everything after itself

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

size_t data_bytes(uint64_t n_layer, uint64_t row_elems, DType type, uint64_t n_tokens) {
  return static_cast<size_t>(n_layer * 2 * n_tokens * row_elems * (type == DType::F16 ? 2 : 4));
}

size_t record_bytes(uint64_t n_tokens, uint64_t prefix, size_t data) {
  return kSpanRecordHeader + 4 * n_tokens + 4 * (n_tokens - prefix) + data;
}

}  // namespace

uint64_t span_content_key(uint64_t ns, std::span<const int32_t> tokens) {
  const uint64_t h = hash_bytes(&ns, sizeof ns);
  return hash_bytes(tokens.data(), tokens.size_bytes(), h);
}

size_t span_record_bytes(int64_t n_tokens, const KvSpan& span) {
  return record_bytes(static_cast<uint64_t>(n_tokens), static_cast<uint64_t>(n_tokens - span.n_tokens()),
                      span.data().size());
}

std::vector<uint8_t> encode_span_record(uint64_t key, uint64_t ns, std::span<const int32_t> tokens,
                                        int64_t prefix, const KvSpan& span) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (prefix < 0 || n - prefix != span.n_tokens())
    fail(ErrorKind::Internal, "span record: {} tokens after a prefix of {} for a span of {}", n - prefix,
         prefix, span.n_tokens());
  const size_t size = span_record_bytes(n, span);
  std::vector<uint8_t> buf(size, 0);
  std::memcpy(buf.data(), kMagic, sizeof kMagic);
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
  if (!span.data().empty()) std::memcpy(buf.data() + at, span.data().data(), span.data().size());
  put_at<uint64_t>(buf, 8, hash_bytes(buf.data() + kChecksumFrom, size - kChecksumFrom));
  return buf;
}

std::optional<SpanRecordHeader> decode_span_record_header(std::span<const uint8_t> head) {
  if (head.size() < kSpanRecordHeader || std::memcmp(head.data(), kMagic, sizeof kMagic) != 0)
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
  if (h.size != record_bytes(n, prefix, data_bytes(n_layer, row_elems, type, n - prefix)))
    return std::nullopt;
  return h;
}

std::vector<int32_t> span_record_tokens(std::span<const uint8_t> record_start, int64_t n_tokens) {
  std::vector<int32_t> tokens(static_cast<size_t>(n_tokens));
  if (record_start.size() < kSpanRecordHeader + 4 * tokens.size())
    fail(ErrorKind::Internal, "span record: {} bytes hold no {} tokens", record_start.size(), n_tokens);
  std::memcpy(tokens.data(), record_start.data() + kSpanRecordHeader, 4 * tokens.size());
  return tokens;
}

DecodedSpan decode_span_record(std::span<const uint8_t> record, uint64_t key, uint64_t ns,
                               std::span<const int32_t> tokens, int64_t prefix) {
  DecodedSpan out;
  const std::optional<SpanRecordHeader> h = decode_span_record_header(record);
  if (!h || h->size != record.size()) return out;  // foreign, truncated or extended
  if (get_at<uint64_t>(record, 8) != hash_bytes(record.data() + kChecksumFrom, record.size() - kChecksumFrom))
    return out;
  out.status = RecordStatus::Other;
  if (h->key != key || h->ns != ns || h->prefix != prefix ||
      h->n_tokens != static_cast<int64_t>(tokens.size()))
    return out;
  if (std::memcmp(record.data() + kSpanRecordHeader, tokens.data(), tokens.size_bytes()) != 0) return out;
  const int64_t own = h->n_tokens - h->prefix;
  out.status = RecordStatus::Ok;
  KvSpan& span = out.span;
  span = KvSpan(static_cast<int>(get_at<uint32_t>(record, 32)),
                static_cast<int64_t>(get_at<uint64_t>(record, 40)),
                static_cast<DType>(get_at<uint32_t>(record, 36)), own);
  size_t at = kSpanRecordHeader + tokens.size_bytes();
  std::memcpy(span.positions().data(), record.data() + at, 4 * static_cast<size_t>(own));
  at += 4 * static_cast<size_t>(own);
  if (!span.data().empty()) std::memcpy(span.data().data(), record.data() + at, span.data().size());
  return out;
}

}  // namespace depcache

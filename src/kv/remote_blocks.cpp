#include "kv/remote_blocks.h"

#include <algorithm>

#include "kv/span_record.h"
#include "util/error.h"

namespace depcache {

RemoteBlocks::RemoteBlocks(RemoteStore& store, int64_t block_tokens)
    : store_(store), block_tokens_(block_tokens) {
  if (block_tokens < 1) fail(ErrorKind::InvalidInput, "remote block size must be at least 1 token");
}

int64_t RemoteBlocks::publish(uint64_t ns, std::span<const int32_t> tokens, int64_t from,
                              const SpanMaker& make) {
  const auto n = static_cast<int64_t>(tokens.size());
  int64_t published = 0;
  for (int64_t b0 = (from / block_tokens_) * block_tokens_; b0 < n; b0 += block_tokens_) {
    const int64_t b1 = std::min(n, b0 + block_tokens_);
    const std::span<const int32_t> seq = tokens.first(static_cast<size_t>(b1));
    const uint64_t key = span_content_key(ns, seq);
    store_.put(key, encode_span_record(key, ns, seq, b0, make(b0, b1)));
    ++published;
  }
  return published;
}

int64_t RemoteBlocks::fetch(uint64_t ns, std::span<const int32_t> tokens, int64_t length,
                            const std::function<bool(int64_t, int64_t, const KvSpan&)>& take,
                            int64_t* dropped) {
  const auto n = static_cast<int64_t>(tokens.size());
  for (int64_t b0 = (length / block_tokens_) * block_tokens_; b0 < n; b0 += block_tokens_) {
    const int64_t b1 = std::min(n, b0 + block_tokens_);
    const std::span<const int32_t> seq = tokens.first(static_cast<size_t>(b1));
    const uint64_t key = span_content_key(ns, seq);
    const std::optional<std::vector<uint8_t>> record = store_.get(key);
    if (!record) break;
    const DecodedSpan d = decode_span_record(*record, key, ns, seq, b0);
    if (d.status != RecordStatus::Ok) {
      if (d.status == RecordStatus::Corrupt) {
        ++*dropped;
        store_.remove(key);
      }
      break;
    }
    if (!take(b0, b1, d.span)) break;
    length = b1;
  }
  return length;
}

}  // namespace depcache

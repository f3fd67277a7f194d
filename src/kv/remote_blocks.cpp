#include "kv/remote_blocks.h"

#include <algorithm>

#include "util/error.h"

namespace depcache {

RemoteBlocks::RemoteBlocks(std::shared_ptr<RemoteStore> store, int64_t block_tokens,
                           std::shared_ptr<const MacKey> key, size_t queue_bytes)
    : store_(std::move(store)), block_tokens_(block_tokens), key_(std::move(key)), queue_bytes_(queue_bytes) {
  if (block_tokens < 1) fail(ErrorKind::InvalidInput, "remote block size must be at least 1 token");
  thread_ = std::thread([this] { run(); });
}

RemoteBlocks::~RemoteBlocks() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t RemoteBlocks::publish(uint64_t ns, std::span<const int32_t> tokens, int64_t from,
                              const SpanMaker& make) {
  const auto n = static_cast<int64_t>(tokens.size());
  int64_t queued = 0;
  for (int64_t b0 = (from / block_tokens_) * block_tokens_; b0 < n; b0 += block_tokens_) {
    const int64_t b1 = std::min(n, b0 + block_tokens_);
    Job job{ns, std::vector<int32_t>(tokens.begin(), tokens.begin() + b1), b0, make(b0, b1)};
    std::lock_guard lk(mu_);
    const size_t bytes = job.span.bytes();
    if (queued_bytes_ + bytes > queue_bytes_) {  // Redis cannot keep up: this block stays local
      ++dropped_;
      continue;
    }
    queued_bytes_ += bytes;
    queue_.push_back(std::move(job));
    ++queued;
    cv_.notify_all();
  }
  return queued;
}

void RemoteBlocks::flush() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

int64_t RemoteBlocks::n_publish_dropped() const {
  std::lock_guard lk(mu_);
  return dropped_;
}

void RemoteBlocks::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and all sent
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    const uint64_t key = span_content_key(job.ns, job.seq);
    store_->put(stored_name(key_.get(), key),
                encode_span_record(key, job.ns, job.seq, job.b0, job.span, key_.get()));
    lk.lock();
    queued_bytes_ -= job.span.bytes();
    busy_ = false;
    cv_.notify_all();
  }
}

RemoteBlocks::Fetched RemoteBlocks::fetch(uint64_t ns, std::span<const int32_t> tokens, int64_t length,
                                          const std::optional<SpanShape>& shape, int64_t max_blocks) const {
  Fetched out;
  const RecordSeal seal{key_.get(), shape};
  const auto n = static_cast<int64_t>(tokens.size());
  // Every block's key up front, asked for in one exchange (one deadline for
  // the whole fetch); then used in order up to the first gap.
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::vector<uint64_t> keys, names;  // content keys; what the store files them under
  for (int64_t b0 = (length / block_tokens_) * block_tokens_;
       b0 < n && static_cast<int64_t>(spans.size()) < std::min(max_blocks, kMaxBlocksPerFetch);
       b0 += block_tokens_) {
    const int64_t b1 = std::min(n, b0 + block_tokens_);
    spans.emplace_back(b0, b1);
    keys.push_back(span_content_key(ns, tokens.first(static_cast<size_t>(b1))));
    names.push_back(stored_name(key_.get(), keys.back()));
  }
  // Each value bounded by the record of its block (with the model's shape
  // known), so a store cannot make this read hold much more. Four times it:
  // a record of another model's shape (f32 rows where this one keeps q8_0
  // are 3.8 times as large) must still be read, to be refused by name and
  // deleted, or it would fail every fetch of its prefix.
  size_t max_value = kDefaultMaxValueBytes;
  if (shape && !spans.empty())
    max_value = 4 * span_record_bytes(*shape, spans.back().second, block_tokens_, key_ != nullptr);
  const std::vector<std::optional<std::vector<uint8_t>>> records = store_->get_many(names, max_value);
  for (size_t i = 0; i < spans.size() && i < records.size(); ++i) {
    const auto [b0, b1] = spans[i];
    const std::optional<std::vector<uint8_t>>& record = records[i];
    if (!record) break;
    DecodedSpan d = decode_span_record(*record, keys[i], ns, tokens.first(static_cast<size_t>(b1)), b0, seal);
    if (d.status != RecordStatus::Ok) {
      ++out.rejected[reject_index(d.status)];
      // Refused for everyone: deleted. Except an authentic record of other
      // tokens under this key (a hash collision): someone else's span.
      const std::optional<SpanRecordHeader> h = decode_span_record_header(*record);
      if (d.status != RecordStatus::Other || !h || h->key != names[i]) store_->remove(names[i]);
      break;
    }
    out.blocks.push_back({b0, b1, std::move(d.span)});
  }
  return out;
}

}  // namespace depcache

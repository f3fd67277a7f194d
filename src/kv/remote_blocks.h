#pragma once
// The remote tier as the index layers it on match and insert. The store is
// shared between processes and content-addressed: a sequence is cut into
// blocks of block_tokens, each filed under the hash of its namespace and
// every token up to the block's end, so a process that computed the same
// prefix (in the same context) finds it. New KV is published block by block
// as it is inserted; a match that ends early reads the following blocks.
// A store that fails only makes matches shorter; a record refused (forged,
// damaged, of another shape: kv/span_record.h) is deleted, counted and ends
// the read there.
//
// Neither direction runs under the index's lock: publishing queues the
// blocks for a thread of its own (encoding, tagging and sending them), and
// fetch touches nothing but the store, so the index reads with its lock
// released and adopts what came back under it.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "kv/kv_span.h"
#include "kv/remote_store.h"
#include "kv/span_record.h"

namespace depcache {

class RemoteBlocks {
 public:
  // key: the deployment's MAC key (null: unkeyed checksums). queue_bytes:
  // K/V waiting to be published beyond which new blocks are not queued. The
  // store is kept alive until the queue is sent.
  RemoteBlocks(std::shared_ptr<RemoteStore> store, int64_t block_tokens,
               std::shared_ptr<const MacKey> key = nullptr, size_t queue_bytes = size_t{256} << 20);
  // Publishes what is still queued (each command within the store's
  // deadline), then stops.
  ~RemoteBlocks();
  RemoteBlocks(const RemoteBlocks&) = delete;
  RemoteBlocks& operator=(const RemoteBlocks&) = delete;
  int64_t block_tokens() const { return block_tokens_; }

  // Queues the blocks that hold tokens [from, n) of the sequence (the first
  // may start before `from`) for publishing; make(b0, b1) gives a block's
  // span, called now. Returns the blocks queued.
  int64_t publish(uint64_t ns, std::span<const int32_t> tokens, int64_t from, const SpanMaker& make);
  // Waits until every queued block was sent (or failed to be).
  void flush();
  int64_t n_publish_dropped() const;  // blocks not queued: the queue was full

  // Tokens [b0, b1) of a sequence and their K/V, as read.
  struct Block {
    int64_t b0 = 0, b1 = 0;
    KvSpan span;
  };
  struct Fetched {
    std::vector<Block> blocks;
    int64_t rejected[kRejectReasons] = {};  // records refused (and deleted), by reason
  };
  // Reads the blocks after the first `length` tokens (asked for together,
  // RemoteStore::get_many) and keeps them in order until one is missing or
  // refused, or max_blocks (at most kMaxBlocksPerFetch) were read. shape:
  // what a span must look like (unchecked when unset). Thread-safe; takes
  // no index lock.
  static constexpr int64_t kMaxBlocksPerFetch = 256;
  Fetched fetch(uint64_t ns, std::span<const int32_t> tokens, int64_t length,
                const std::optional<SpanShape>& shape, int64_t max_blocks = INT64_MAX) const;

 private:
  struct Job {
    uint64_t ns = 0;
    std::vector<int32_t> seq;  // tokens up to the block's end
    int64_t b0 = 0;
    KvSpan span;
  };
  void run();

  std::shared_ptr<RemoteStore> store_;
  int64_t block_tokens_;
  std::shared_ptr<const MacKey> key_;
  size_t queue_bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  size_t queued_bytes_ = 0;
  bool busy_ = false, stop_ = false;
  int64_t dropped_ = 0;
  std::thread thread_;
};

}  // namespace depcache

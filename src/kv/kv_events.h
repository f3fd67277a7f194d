#pragma once
// What a replica holds, told to others: its index reports each span that
// enters or leaves it (any tier), and this log turns them into content keys
// and events in the manner of vLLM's KV events (BlockStored/BlockRemoved):
// a key per block of `block_tokens` counted from a namespace's root (the
// hash of the namespace and every token up to the block's end, the remote
// tier's key scheme), plus one at the end of each span the index holds, so
// that a short sequence — a KG subtree, a chunk — has a key too. A router that
// computes the same keys for a request's lookups can tell how many of its
// tokens a replica holds: prefix chains, chunks at any position and KG
// subtrees alike, since each is a namespace of its own.
//
// With the deployment's key every key and namespace a log tells is its
// stored_name() (kv/span_record.h): whoever reads the channel or a summary
// learns which blocks come and go, not what they hold, and cannot test a
// guessed prompt against them (a router holding the key computes the same
// names).
//
// The live key set and the events since the last batch are kept together,
// so a summary and the batches after it compose: set := summary, then apply
// every batch numbered above summary.seq (set operations replayed in order
// are idempotent, so a batch whose events the summary already holds does no
// harm).
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/radix_index.h"
#include "util/mac.h"

namespace depcache {

// The keys of a sequence's blocks that end in (from, n], and of the
// sequence's end n.
std::vector<uint64_t> chain_keys(uint64_t ns, std::span<const int32_t> tokens, int64_t from,
                                 int64_t block_tokens);

struct KvEvent {
  enum class Type { Stored, Removed };
  Type type = Type::Stored;
  uint64_t ns = 0;
  std::vector<uint64_t> keys;
  uint64_t parent = 0;      // Stored: the key of the block before the first (0: none)
  int64_t token_count = 0;  // Stored: tokens from the namespace's root to the last key
};

struct KvEventBatch {
  int64_t seq = 0;  // 1, 2, ... per process (with its epoch)
  std::vector<KvEvent> events;
};

class KvEventLog final : public IndexObserver {
 public:
  explicit KvEventLog(int64_t block_tokens, std::shared_ptr<const MacKey> key = nullptr);
  int64_t block_tokens() const { return block_tokens_; }

  void stored(uint64_t ns, std::span<const int32_t> path, int64_t from) override;
  void removed(uint64_t ns, std::span<const int32_t> path, int64_t from) override;
  // The first part of a cut span ends at a key of its own now (unless that
  // is a block's end, already a key): a lookup that ends there is held.
  void split(uint64_t ns, std::span<const int32_t> path) override;

  // The events since the last batch, numbered (empty events: a heartbeat).
  KvEventBatch take();
  struct Summary {
    int64_t seq = 0;  // the last batch taken
    std::vector<uint64_t> keys;
  };
  Summary summary() const;
  size_t n_keys() const;
  bool has_pending() const;

 private:
  // chain_keys as this log names them.
  std::vector<uint64_t> named_chain(uint64_t ns, std::span<const int32_t> path, int64_t from) const;

  int64_t block_tokens_;
  std::shared_ptr<const MacKey> key_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, int32_t> live_;  // key -> spans holding it
  std::vector<KvEvent> pending_;
  int64_t seq_ = 0;
};

// A batch as the JSON the replicas publish (docs/replicas.md); `replica`,
// `epoch` and the load figures are the publisher's.
struct KvEventHeader {
  std::string replica, epoch;
  int64_t block_tokens = 0;
  int64_t running = 0, waiting = 0;  // requests in the replica's engine
};
std::string kv_events_json(const KvEventHeader& h, const KvEventBatch& b);

// A batch as it goes on the channel. With the deployment's key
// (--cache-key-file) the JSON is preceded by 64 hex digits of
// HMAC-SHA256(key, domain | JSON): whoever can publish on the channel but
// holds no key cannot make a batch a router accepts. Without a key: the JSON.
std::string seal_kv_events(const MacKey* key, const std::string& json);
// The JSON of a batch off the channel, its tag checked when `key` is given
// (a sealed batch without a key, or the reverse, is refused: the router and
// the replicas must agree); nullopt with *why when refused.
std::optional<std::string_view> open_kv_events(const MacKey* key, std::string_view message, std::string* why);

}  // namespace depcache

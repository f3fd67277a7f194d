#pragma once
// A compressed radix tree from token sequences to KV spans. Non-branching
// runs are merged into one node, and every node owns the span of its own
// tokens. Sequences live in namespaces (one tree each): the namespace key
// carries everything the KV depends on besides the tokens themselves — the
// model fingerprint, the KV dtype, and for dependency attention the context a
// subtree hangs under — so a match is always exact.
//
// Capacity is a byte budget; when it is exceeded, the unpinned leaf the
// replacement policy ranks lowest is evicted (LRU by default). A parent
// becomes evictable once its children are gone. Nodes may also be virtual
// (a size, no K/V): the simulator replays workloads through the same index
// and policies without running a model.
#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/kv_span.h"
#include "kv/policy.h"

namespace depcache {

class RadixIndex {
 public:
  using NodeId = int32_t;

  // A matched run: tokens [offset, offset + length) of a node's span.
  struct Piece {
    NodeId node = -1;
    int64_t offset = 0;
    int64_t length = 0;
  };
  struct Match {
    int64_t length = 0;  // tokens matched from the start of the sequence
    std::vector<Piece> pieces;
  };
  // Makes the span of sequence tokens [begin, end) when insert needs it.
  using SpanMaker = std::function<KvSpan(int64_t begin, int64_t end)>;

  // policy: null for LRU.
  explicit RadixIndex(size_t byte_budget, std::unique_ptr<ReplacementPolicy> policy = nullptr);

  // Longest cached prefix of `tokens` in namespace ns; counts an access of
  // every node used. Pieces stay valid until the next insert (which may
  // split nodes).
  Match match(uint64_t ns, std::span<const int32_t> tokens);
  // The same without counting an access (for schedulers looking ahead).
  Match peek(uint64_t ns, std::span<const int32_t> tokens) const;
  // Adds what is missing of `tokens` (split where it diverges), then evicts
  // to the budget. Returns the tokens that were new. A span that alone
  // exceeds the budget is not stored. cost_per_token feeds cost-aware
  // policies (recompute time per token of the request that computed it).
  // When `path` is given it receives the nodes now holding the sequence (as
  // a match would), so a caller inserting several sequences can pin each
  // until all are in.
  int64_t insert(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker& make_span,
                 double cost_per_token = 1.0, Match* path = nullptr);
  // The same with virtual nodes of bytes_per_token each and no K/V.
  int64_t insert_virtual(uint64_t ns, std::span<const int32_t> tokens, size_t bytes_per_token,
                         double cost_per_token = 1.0, Match* path = nullptr);

  // Pinned nodes (and so their ancestors, which are never leaves) are not
  // evicted; pins count. Unpinning evicts back to the budget.
  void pin(const Match& m);
  void unpin(const Match& m);

  const KvSpan& span(NodeId node) const { return nodes_[node].span; }
  ReplacementPolicy& policy() { return *policy_; }
  size_t bytes() const { return bytes_; }
  size_t budget() const { return budget_; }
  size_t n_nodes() const { return n_live_; }
  int64_t n_evicted() const { return n_evicted_; }
  // Evicts LRU unpinned leaves until bytes() <= target.
  void evict_to(size_t target);
  // Walks every live node; checks the tree's invariants (for tests).
  void check_invariants() const;

 private:
  struct Node {
    std::vector<int32_t> tokens;  // edge label; empty only for roots
    KvSpan span;                  // empty for a virtual node
    size_t bytes_per_token = 0;
    uint64_t hits = 0;
    NodeId parent = -1;
    std::unordered_map<int32_t, NodeId> children;  // by first token
    int32_t pins = 0;
    uint64_t last_used = 0;
    bool live = false;
  };

  NodeId root(uint64_t ns);
  NodeId new_node();
  NodeId split(NodeId node, int64_t at);
  int64_t insert_impl(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                      size_t virtual_bytes_per_token, double cost_per_token, Match* path);
  int64_t insert_path(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                      size_t virtual_bytes_per_token, double cost_per_token);
  size_t node_bytes(const Node& n) const {
    return n.tokens.size() * n.bytes_per_token;
  }  // node keeps [at, end); returns the new parent with [0, at)
  void remove_leaf(NodeId node);

  size_t budget_;
  std::unique_ptr<ReplacementPolicy> policy_;
  size_t bytes_ = 0;
  size_t n_live_ = 0;
  int64_t n_evicted_ = 0;
  uint64_t clock_ = 0;
  std::vector<Node> nodes_;
  std::vector<NodeId> free_;
  std::unordered_map<uint64_t, NodeId> roots_;
};

}  // namespace depcache

#pragma once
// The KV index's tree: a compressed radix tree from token sequences to
// nodes, one tree per namespace, with pins, access counts and, per tier, the
// eviction candidates in the replacement policy's order. Non-branching runs
// are merged into one node; every node owns the slot of its own tokens'
// span (kv/span_tiers.h), whose tier the tree reads to rank candidates but
// never moves. No I/O and no lock of its own: every call is made under the
// index's lock (kv/index_lock.h, rule 1).
//
// Eviction order. A candidate is a live, unpinned node that is not a root
// and has no child in its own tier (so eviction is leaf-only per tier, and
// a parent is always in the same or a faster tier than its children). The
// candidates are kept per tier in priority order (the policy's priority,
// then least recently used, then id), updated at every event that can change
// a node's priority or eligibility (touch), so finding a victim is a lookup.
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/layer_loader.h"
#include "kv/policy.h"
#include "kv/span_tiers.h"

namespace depcache {

// Told what enters the index and what leaves it (whatever tier it is in),
// under the index's lock: keep it quick. path: the tokens from the
// namespace's root to the span's end; from: where the span starts.
class IndexObserver {
 public:
  virtual ~IndexObserver() = default;
  virtual void stored(uint64_t ns, std::span<const int32_t> path, int64_t from) = 0;
  virtual void removed(uint64_t ns, std::span<const int32_t> path, int64_t from) = 0;
  // A span was cut in two: one now ends at path's end (nothing was added).
  virtual void split(uint64_t ns, std::span<const int32_t> path) = 0;
};

class RadixTree {
 public:
  using NodeId = int32_t;
  static constexpr int kTiers = 4;  // Tier values; Remote is not a node's tier

  // A matched run: tokens [offset, offset + length) of a node's span.
  struct Piece {
    NodeId node = -1;
    int64_t offset = 0;
    int64_t length = 0;
  };
  struct Match {
    int64_t length = 0;  // tokens matched from the start of the sequence
    std::vector<Piece> pieces;
    int64_t tokens_from[kTiers] = {};  // matched tokens by the tier they were found in
    double load_ms = 0;                // time spent bringing them to the hot tier
    // Layer-wise preload: by piece, the loader of a piece still being read
    // from disk (its node stays on disk until it is adopted); null for a
    // piece in memory. Empty when nothing is being read.
    std::vector<std::shared_ptr<LayerLoader>> loading;
  };

  // Where a node ranks among its tier's eviction candidates.
  struct EvictKey {
    double priority = 0;
    uint64_t last_used = 0;
    NodeId id = -1;
    auto operator<=>(const EvictKey&) const = default;
  };

  struct Node {
    std::vector<int32_t> tokens;  // edge label; empty only for roots
    SpanSlot slot;                // its span and the tier it is in
    uint64_t ns = 0;
    int64_t start = 0;  // tokens of the sequence before this node's
    uint64_t hits = 0;
    NodeId parent = -1;
    std::unordered_map<int32_t, NodeId> children;  // by first token
    int32_t pins = 0;
    uint64_t last_used = 0;
    bool live = false;
    bool keyed = false;  // listed among its tier's candidates under `key`
    // Removed while other requests pinned it: out of the tree, its id kept
    // until the last unpin.
    bool detached = false;
    // Brought to the hot tier from this tier by a prefetch: the next counted
    // match reports it as found there (Hot: nothing pending).
    Tier fetched_from = Tier::Hot;
    EvictKey key;
  };

  explicit RadixTree(std::unique_ptr<ReplacementPolicy> policy);

  // --- Reading.
  bool is_live(NodeId id) const { return id >= 0 && id < end_id() && nodes_[id].live; }
  NodeId end_id() const { return static_cast<NodeId>(nodes_.size()); }  // ids are below it
  const Node& node(NodeId id) const { return nodes_[id]; }
  // Changing a node's slot or fetched_from is the caller's; it then touches
  // the node (and its parent when the tier changed).
  Node& node(NodeId id) { return nodes_[id]; }
  Tier tier(NodeId id) const { return nodes_[id].slot.tier; }
  // as_fetched: a hot node a prefetch brought in counts in the tier it came from.
  Tier found_tier(NodeId id, bool as_fetched) const {
    const Node& n = nodes_[id];
    return as_fetched && n.slot.tier == Tier::Hot ? n.fetched_from : n.slot.tier;
  }
  // Longest run of `tokens` in namespace ns; changes nothing.
  Match peek(uint64_t ns, std::span<const int32_t> tokens, bool as_fetched = false) const;
  std::vector<int32_t> path_tokens(NodeId id) const;  // the sequence up to the node's end
  // The node and what hangs below it, children before their parents.
  std::vector<NodeId> subtree_children_first(NodeId id) const;
  size_t n_live() const { return n_live_; }
  int64_t n_evicted() const { return n_evicted_; }
  size_t n_pinned() const;
  size_t n_nodes(Tier t) const;  // live non-roots in tier t
  double priority(NodeId id) const;

  // --- Changing the tree.
  NodeId root(uint64_t ns);
  // Hangs a new node below `parent` with the tokens path[from, end) and the
  // slot given (already counted in its tier by the caller); one access,
  // at the current tick. content_key names the sequence for the policy.
  NodeId add_leaf(NodeId parent, std::span<const int32_t> path, int64_t from, SpanSlot slot,
                  double cost_per_token, uint64_t content_key);
  // Cuts a node at `at`: it keeps [at, end); returns the new parent holding
  // [0, at). Bytes are unchanged: the tokens moved, none were added.
  NodeId split(NodeId id, int64_t at);
  // Takes a leaf out (its slot already released by the caller). A node other
  // requests still pin is detached: its id stays taken until the last unpin.
  void remove_leaf(NodeId id);

  // --- Pins, accesses and the eviction order.
  void pin(const Match& m);
  // Drops one pin of every piece; a detached node is freed at its last.
  void unpin(const Match& m);
  void pin(NodeId id);
  void unpin(NodeId id);
  // One access of every piece at `tick`; with same_request, a node this
  // tick counted already is not counted again.
  void count_access(const Match& m, uint64_t tick, bool same_request);
  uint64_t tick() const { return clock_; }
  uint64_t next_tick() { return ++clock_; }
  // Re-ranks a node after anything that may change its priority or whether
  // it is a candidate (live, not a root, unpinned, no child in its tier).
  void touch(NodeId id);
  void untouch(NodeId id);  // out of the candidates
  // The candidate of tier t the policy ranks lowest; null when every node
  // of the tier is pinned or has a child there.
  const EvictKey* lowest(Tier t);
  ReplacementPolicy& policy() { return *policy_; }
  // The policy fed from outside: every candidate is re-ranked before the
  // next eviction.
  ReplacementPolicy& policy_to_feed() {
    keys_dirty_ = true;
    return *policy_;
  }
  void set_lookahead(std::unordered_map<int32_t, double> weights);
  void set_fix_overhead(const Match& m, double cfo);
  void set_observer(std::shared_ptr<IndexObserver> observer);

  // The links, starts, slot sizes, live count and eviction candidates agree
  // (fails with ErrorKind::Internal when not).
  void check_invariants() const;

 private:
  NodeId new_node();
  void rekey_all();
  EvictKey key_of(NodeId id) const;

  std::unique_ptr<ReplacementPolicy> policy_;
  std::shared_ptr<IndexObserver> observer_;
  std::vector<Node> nodes_;
  std::vector<NodeId> free_;
  std::unordered_map<uint64_t, NodeId> roots_;
  std::set<EvictKey> candidates_[kTiers];
  bool keys_dirty_ = false;
  std::vector<NodeId> lookahead_nodes_;  // weighted by the last set_lookahead
  size_t n_live_ = 0;
  int64_t n_evicted_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace depcache

#pragma once
// The KV index: token sequences to KV spans, in namespaces (one tree each):
// the namespace key carries everything the KV depends on besides the tokens
// themselves — the model fingerprint, the KV dtype, and for dependency
// attention the context a subtree hangs under — so a match is always exact.
//
// Two parts under one lock, each in its own header:
//  - the tree (RadixTree, kv/radix_tree.h): match, insert, pins, access
//    counts and the eviction order; no I/O;
//  - the tier controller (TierController, kv/tier_controller.h): where each
//    span lives (hot, host, disk; kv/span_tiers.h) and the moves between
//    tiers with their I/O, the remote tier (kv/remote_blocks.h) layered on
//    match and insert, the layer-wise preload and the costs that pace it;
//  - the lock both obey (IndexMutex, kv/index_lock.h), with its rules.
// This class is what callers use: each public method takes the lock and
// asks the two parts.
//
// Eviction. When a tier exceeds its budget, the unpinned node of that tier
// the policy ranks lowest and that has no child in the same tier moves one
// tier down, and from the last tier it leaves the index (so a parent goes
// once its children are gone). A match brings every node it uses back to
// the hot tier; the time this takes is part of the request's time to first
// token.
//
// Nodes may also be virtual (a size, no K/V): the simulator replays
// workloads through the same index and policies without running a model.
//
// A caller that uses span() of matched nodes holds lock() (or pins the
// nodes) so a concurrent prefetch cannot move them. The engine reads lower
// tiers ahead of admission, on a thread of its own (SpanFetcher, through
// prefetch), so the matches it makes under its lock find the spans in
// memory and leave the remote store alone.
//
// Prefetched spans keep the tier they came from until a counted match uses
// them: reuse is reported by the tier the KV was found in, whether a match
// or a prefetch moved it.
//
// Records from the disk and remote tiers are checked against the running
// model's span shape (expect_span_shape) and the deployment's MAC key (the
// stores', kv/span_record.h); a refused one is dropped, counted in
// Stats::rejected by tier and reason, and its tokens recomputed.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>

#include "kv/disk_store.h"
#include "kv/index_lock.h"
#include "kv/kv_span.h"
#include "kv/policy.h"
#include "kv/radix_tree.h"
#include "kv/remote_store.h"
#include "kv/tier_controller.h"

namespace depcache {

class RadixIndex {
 public:
  using NodeId = RadixTree::NodeId;
  static constexpr int kTiers = RadixTree::kTiers;
  static constexpr int kRejectDisk = IndexStats::kRejectDisk, kRejectRemote = IndexStats::kRejectRemote;
  using Piece = RadixTree::Piece;
  using Match = RadixTree::Match;
  // Insert asks for the span of the new tokens; with a remote tier it also
  // asks for whole blocks, which may start before them.
  using SpanMaker = depcache::SpanMaker;
  using Stats = IndexStats;
  using LayerPreload = depcache::LayerPreload;

  // byte_budget: the hot tier's. policy: null for LRU.
  explicit RadixIndex(size_t byte_budget, std::unique_ptr<ReplacementPolicy> policy = nullptr);
  ~RadixIndex();

  // Lower tiers, attached before use. The host tier holds spans in memory
  // under its own budget. Attaching a disk store adopts the spans it holds
  // from an earlier process (those whose context is on disk too; the others
  // are orphans and deleted). The remote store is shared with other
  // processes. The index does not own the stores.
  // Swap-out-once (RAGCache): a span keeps its host copy when brought back
  // to the hot tier, so evicting it again copies nothing; the copies count
  // against the host budget and are the first to go when it needs room.
  void attach_host(size_t byte_budget, bool swap_out_once = false);
  void attach_disk(DiskSpanStore& store);
  // key: the deployment's MAC key for the records (null: unkeyed checksums).
  // A store given by reference must outlive the index (or detach_remote());
  // one given shared lives until what is queued for it was sent.
  void attach_remote(RemoteStore& store, int64_t block_tokens = 32,
                     std::shared_ptr<const MacKey> key = nullptr);
  void attach_remote(std::shared_ptr<RemoteStore> store, int64_t block_tokens = 32,
                     std::shared_ptr<const MacKey> key = nullptr);
  // Reports what enters and leaves the index from now on (null: nobody).
  void set_observer(std::shared_ptr<IndexObserver> observer);
  // Publishes what is queued for the remote tier, then lets go of the store
  // (before it is destroyed).
  void detach_remote();
  // Waits until what insert queued for the remote tier was sent.
  void flush_remote();
  // The shape of the running model's spans: records of any other from the
  // disk or remote tier are refused (never placed into a KV cache of the
  // wrong shape). Unset, the first span inserted with K/V sets it.
  void expect_span_shape(const SpanShape& shape);
  // Moves every span still in memory to the disk tier, children first (as
  // far as its budget allows), so the next process finds them; for a clean
  // shutdown.
  void persist();
  // Prefill time of n tokens after `cached` ones (any unit; RAGCache's
  // profiled T(cached, new)), for cost-aware policies: see cost_per_token.
  void set_cost_model(std::function<double(int64_t cached, int64_t n)> cost);
  // The recompute time per token a request with `cached` tokens found and
  // `fresh` computed passes to insert: T(cached, fresh) / fresh with a cost
  // model, else `measured`.
  double cost_per_token(int64_t cached, int64_t fresh, double measured) const;

  // Longest cached prefix of `tokens` in namespace ns; counts an access of
  // every node used. Pieces stay valid until the next insert (which may
  // split nodes). A request that matches several sequences (the root-to-
  // leaf paths of its trees) passes the tick of begin_request() to each, so
  // a node shared by its paths counts one access, not one per path.
  // fresh_tokens: what the request will compute besides what it finds (an
  // estimate), for the automatic layer-wise preload depth.
  // remote: false leaves the remote store alone (what it held was fetched
  // ahead; the rest is computed).
  Match match(uint64_t ns, std::span<const int32_t> tokens, uint64_t request_tick = 0,
              int64_t fresh_tokens = 0, bool remote = true);
  // Layer-wise preload in match (see LayerPreload, kv/tier_controller.h).
  void set_layer_preload(LayerPreload preload) {
    auto lk = lock();
    controller_.set_layer_preload(preload);
  }
  LayerPreload layer_preload() const {
    auto lk = lock();
    return controller_.layer_preload();
  }
  // A forward pass computed prompt tokens at this many ms each (for the auto
  // depth).
  void note_prefill(double ms_per_token);
  // A layered load finished: its span becomes its node's (hot tier, file
  // removed), and its read rate is learned. False when the load failed or
  // the node changed meanwhile.
  bool adopt_loaded(NodeId node, LayerLoader& loader);
  // A layered load found a bad layer: the node and what hangs below it
  // leave the index (counted in dropped_bad) if it still holds that file;
  // the tokens are recomputed. Nodes other requests still pin are detached
  // from the tree at once and freed at their last unpin.
  bool drop_bad_load(NodeId node, uint64_t disk_key);
  uint64_t begin_request();
  // The same without counting an access and without moving anything (for
  // schedulers looking ahead).
  Match peek(uint64_t ns, std::span<const int32_t> tokens) const;
  // Brings what is cached of `tokens` to the hot tier (from lower tiers and
  // the remote store) without counting an access, for requests still
  // waiting. Returns the tokens loaded. disk: false stops before a piece on
  // disk (a layer-wise match reads it while its pass computes), and so
  // reads the remote store only after what is in memory.
  int64_t prefetch(uint64_t ns, std::span<const int32_t> tokens, bool disk = true);
  // Whether a disk or remote tier is attached (a prefetch may do I/O).
  bool has_io_tiers() const;
  // Whether all that is cached of `tokens` is in the hot tier.
  bool all_hot(uint64_t ns, std::span<const int32_t> tokens) const;
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

  // The span of a matched (hence hot) node.
  const KvSpan& span(NodeId node) const { return tree_.node(node).slot.span; }
  // LACR's lookahead weights (node -> weight of the pending requests that
  // will use it): re-ranks only the nodes whose weight changed.
  void set_lookahead(std::unordered_map<int32_t, double> weights);
  // Cache-Craft's fix overhead of reusing the matched nodes (the policy's
  // set_fix_overhead), before the access that reuses them.
  void set_fix_overhead(const Match& m, double cfo);
  // The policy, to feed it (lookahead weights, fix overheads): what the
  // caller sets may change any priority, so the candidates are re-ranked
  // before the next eviction.
  ReplacementPolicy& policy() { return tree_.policy_to_feed(); }
  std::unique_lock<IndexMutex> lock() const { return std::unique_lock(mu_); }
  // Bytes and budget of the hot tier; of any tier.
  size_t bytes() const { return bytes(Tier::Hot); }
  size_t budget() const { return budget(Tier::Hot); }
  size_t bytes(Tier t) const { return controller_.tiers().bytes(t); }
  size_t budget(Tier t) const { return controller_.tiers().budget(t); }
  size_t n_nodes() const { return tree_.n_live(); }
  size_t n_pinned() const;  // nodes with at least one pin
  size_t n_nodes(Tier t) const;
  int64_t n_evicted() const { return tree_.n_evicted(); }  // nodes that left the index
  const Stats& stats() const;
  // Moves hot nodes down (or out) until the hot tier holds <= target bytes.
  void evict_to(size_t target);
  // Walks every live node; checks the tree's and the tiers' invariants,
  // including that the disk tier's nodes and the store's files agree (for
  // tests).
  void check_invariants() const;

 private:
  mutable IndexMutex mu_;
  RadixTree tree_;
  TierController controller_;
};

}  // namespace depcache

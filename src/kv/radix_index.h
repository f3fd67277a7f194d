#pragma once
// A compressed radix tree from token sequences to KV spans. Non-branching
// runs are merged into one node, and every node owns the span of its own
// tokens. Sequences live in namespaces (one tree each): the namespace key
// carries everything the KV depends on besides the tokens themselves — the
// model fingerprint, the KV dtype, and for dependency attention the context a
// subtree hangs under — so a match is always exact.
//
// The index is three parts, one concern each:
//  - the tree (this class): tokens to nodes, pins, access counts, and per
//    tier the eviction candidates in the replacement policy's order;
//  - the tiers (SpanTiers, kv/span_tiers.h): where each node's span lives
//    (hot, host, disk), bytes against each tier's budget, and the moves
//    between tiers with their I/O;
//  - the remote tier (RemoteBlocks, kv/remote_blocks.h), layered on match
//    (a match that ends early reads the following blocks) and insert (new
//    KV is published block by block).
//
// Eviction. When a tier exceeds its budget, the unpinned node of that tier
// the policy ranks lowest and that has no child in the same tier moves one
// tier down, and from the last tier it leaves the index (which makes
// eviction leaf-only: a parent goes once its children are gone). The
// candidates are kept per tier in priority order, updated at every event
// that can change a node's priority or eligibility, so finding a victim is a
// lookup, not a scan. A parent is therefore always in the same or a faster
// tier than its children. A match brings every node it uses back to the hot
// tier; the time this takes is part of the request's time to first token. A
// disk file that turns out corrupt is dropped with the subtree below it, and
// the match stops there: the tokens are recomputed, never served from a bad
// file.
//
// Nodes may also be virtual (a size, no K/V): the simulator replays
// workloads through the same index and policies without running a model.
//
// All public methods lock the index; a caller that uses span() of matched
// nodes holds lock() (or pins the nodes) so a concurrent prefetch cannot move
// them. The remote tier is read without the lock when match or prefetch
// holds it alone (not under a caller's lock()): what is matched so far stays
// pinned, the blocks are read (and their tags checked) with the lock
// released, and adopted under it again against the tree as it is then, so a
// slow Redis holds up only the request reading from it. Disk reads follow
// the same rule: a span's layers are read with the lock released when match
// or prefetch holds it alone (a file's head is read under it), and a
// layer-wise preload reads on its own thread. Publishing to the remote tier
// never waits on it (RemoteBlocks queues), nor does a demotion to disk when
// the store writes behind (DiskSpanStore::write_behind). The engine reads
// lower tiers ahead of admission, on a thread of its own (SpanFetcher,
// through prefetch), so the matches it makes under its lock find the spans
// in memory and leave the remote store alone.
//
// Prefetched spans keep the tier they came from until a counted match uses
// them: reuse is reported by the tier the KV was found in, whether a match
// or a prefetch moved it.
//
// Records from the disk and remote tiers are checked against the running
// model's span shape (expect_span_shape) and the deployment's MAC key (the
// stores', kv/span_record.h); a refused one is dropped, counted in
// Stats::rejected by tier and reason, and its tokens recomputed.
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kv/disk_store.h"
#include "kv/kv_span.h"
#include "kv/policy.h"
#include "kv/remote_blocks.h"
#include "kv/remote_store.h"
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

// A recursive mutex that knows how deep its owner holds it, so the index can
// tell its own lock (released around remote reads) from a caller's.
class IndexMutex {
 public:
  void lock() {
    const std::thread::id me = std::this_thread::get_id();
    // Only this thread can have stored its own id: a relaxed load suffices.
    if (owner_.load(std::memory_order_relaxed) == me) {
      ++depth_;
      return;
    }
    mu_.lock();
    owner_.store(me, std::memory_order_relaxed);
    depth_ = 1;
  }
  bool try_lock() {
    const std::thread::id me = std::this_thread::get_id();
    if (owner_.load(std::memory_order_relaxed) == me) {
      ++depth_;
      return true;
    }
    if (!mu_.try_lock()) return false;
    owner_.store(me, std::memory_order_relaxed);
    depth_ = 1;
    return true;
  }
  void unlock() {
    if (--depth_ > 0) return;
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    mu_.unlock();
  }
  int depth() const { return depth_; }  // for the owning thread

  // Releases the lock its owner holds once, for I/O, and takes it back when
  // it goes (also when the I/O throws).
  class Released {
   public:
    explicit Released(IndexMutex& mu) : mu_(mu) { mu_.unlock(); }
    ~Released() { mu_.lock(); }
    Released(const Released&) = delete;
    Released& operator=(const Released&) = delete;

   private:
    IndexMutex& mu_;
  };

 private:
  std::mutex mu_;
  std::atomic<std::thread::id> owner_{};
  int depth_ = 0;
};

class RadixIndex {
 public:
  using NodeId = int32_t;
  static constexpr int kTiers = 4;  // Tier values; Remote is not a node's tier
  static constexpr int kRejectDisk = 0, kRejectRemote = 1;

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
    // from disk (its node stays on disk until adopt_loaded); null for a
    // piece in memory. Empty when nothing is being read.
    std::vector<std::shared_ptr<LayerLoader>> loading;
  };
  // Insert asks for the span of the new tokens; with a remote tier it also
  // asks for whole blocks, which may start before them.
  using SpanMaker = depcache::SpanMaker;

  struct Stats {
    int64_t hit_tokens[kTiers] = {};  // matched tokens by tier found in
    int64_t demoted[kTiers] = {};     // nodes moved down out of each tier
    int64_t promoted_bytes = 0;       // bytes brought to the hot tier
    int64_t swapped_out_bytes = 0;    // bytes copied from the hot tier to the host tier
    int64_t swap_outs_saved = 0;      // evictions from the hot tier that found a host copy (swap-out-once)
    double load_ms = 0;               // time spent doing so
    int64_t layered_loads = 0;        // spans read layer by layer and adopted
    double layer_wait_ms = 0;         // time passes waited for their layers (the rest was hidden)
    int64_t dropped_bad = 0;          // disk or remote records refused and dropped (all reasons)
    // Records refused, by tier (kRejectDisk, kRejectRemote) and reason
    // (reject_index: mac, shape, other; kv/span_record.h).
    int64_t rejected[2][kRejectReasons] = {};
    int64_t remote_published = 0;     // blocks offered to the remote tier
    int64_t disk_write_failures = 0;  // spans that could not be written (disk full)
    // Spans alone larger than a tier's budget: in the hot tier never cached,
    // in the disk tier dropped instead of written.
    int64_t oversized[kTiers] = {};
    // Read with the lock released and adopted under it again (not what the
    // tree's changes meanwhile left unusable): disk spans and remote blocks
    // whose I/O held up no other request.
    int64_t unlocked_disk_reads = 0;
    int64_t unlocked_remote_blocks = 0;
  };

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
  // Layer-wise preload in match (Cache-Craft; not in prefetch, which has
  // time): a piece on disk is read layer by layer, its first layers before
  // match returns (see Match::loading), the rest while the caller computes.
  // Auto: as many first layers as keep the pass from waiting (preload_depth)
  // given the disk's read rate, learned from finished layered loads, and the
  // pass's compute time per layer (the cost model's T(cached, fresh), else
  // fresh tokens times the per-token time note_prefill learned); all layers
  // while either is unknown.
  struct LayerPreload {
    enum class Mode { Off, Fixed, Auto } mode = Mode::Off;
    int depth = 0;  // Fixed: layers read before match returns
  };
  void set_layer_preload(LayerPreload preload) {
    auto lk = lock();
    layer_preload_ = preload;
  }
  LayerPreload layer_preload() const {
    auto lk = lock();
    return layer_preload_;
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
  const KvSpan& span(NodeId node) const { return nodes_[node].slot.span; }
  // LACR's lookahead weights (node -> weight of the pending requests that
  // will use it): re-ranks only the nodes whose weight changed.
  void set_lookahead(std::unordered_map<int32_t, double> weights);
  // Cache-Craft's fix overhead of reusing the matched nodes (the policy's
  // set_fix_overhead), before the access that reuses them.
  void set_fix_overhead(const Match& m, double cfo);
  // The policy, to feed it (lookahead weights, fix overheads): what the
  // caller sets may change any priority, so the candidates are re-ranked
  // before the next eviction.
  ReplacementPolicy& policy() {
    keys_dirty_ = true;
    return *policy_;
  }
  std::unique_lock<IndexMutex> lock() const { return std::unique_lock(mu_); }
  // Bytes and budget of the hot tier; of any tier.
  size_t bytes() const { return tiers_.bytes(Tier::Hot); }
  size_t budget() const { return tiers_.budget(Tier::Hot); }
  size_t bytes(Tier t) const { return tiers_.bytes(t); }
  size_t budget(Tier t) const { return tiers_.budget(t); }
  size_t n_nodes() const { return n_live_; }
  size_t n_pinned() const;  // nodes with at least one pin
  size_t n_nodes(Tier t) const;
  int64_t n_evicted() const { return n_evicted_; }  // nodes that left the index
  const Stats& stats() const;
  // Moves hot nodes down (or out) until the hot tier holds <= target bytes.
  void evict_to(size_t target);
  // Walks every live node; checks the tree's and the tiers' invariants,
  // including that the disk tier's nodes and the store's files agree (for
  // tests).
  void check_invariants() const;

 private:
  // Where a node ranks among its tier's eviction candidates: the policy's
  // priority, then least recently used, then id.
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
    bool keyed = false;  // in candidates_[tier] under `key`
    // Dropped while other requests pinned it: out of the tree, its id kept
    // until the last unpin.
    bool detached = false;
    // Brought to the hot tier from this tier by a prefetch: the next counted
    // match reports it as found there (Hot: nothing pending).
    Tier fetched_from = Tier::Hot;
    EvictKey key;
  };

  NodeId root(uint64_t ns);
  // Re-ranks a node after anything that may change its priority or whether
  // it is a candidate (live, not a root, unpinned, no child in its tier).
  void touch(NodeId id);
  void untouch(NodeId id);  // out of the candidates (before it is removed)
  void rekey_all();         // after the policy was fed from outside
  NodeId new_node();
  // as_fetched: a hot node a prefetch brought in counts in the tier it came from.
  Match peek_locked(uint64_t ns, std::span<const int32_t> tokens, bool as_fetched = false) const;
  Tier found_tier(NodeId node, bool as_fetched) const {
    const Node& n = nodes_[node];
    return as_fetched && n.slot.tier == Tier::Hot ? n.fetched_from : n.slot.tier;
  }
  std::vector<int32_t> path_tokens(NodeId node) const;  // the sequence up to the node's end
  Tier tier(NodeId node) const { return nodes_[node].slot.tier; }
  // Moves a node's slot between tiers with `move` (false: it stayed), then
  // tells the policy and re-ranks the node and its parent.
  bool retier(NodeId node, const std::function<bool(SpanSlot&)>& move);
  // Moves a node to tier t (SpanTiers::set_tier).
  void set_tier(NodeId node, Tier t, const std::function<void(SpanSlot&)>& change = {});
  bool promote(NodeId node);  // to the hot tier; false when its disk file is bad
  // Promotes the pieces of a pinned match in order; where a promotion
  // fails, unpins and drops the rest and truncates m and its tier counts
  // (`found`: the tier each piece was counted in). fresh >= 0: layered, for
  // a request computing that many tokens; the request's runs (request_tick >
  // 0) share the loader of a node. !disk: stops before a piece on disk and
  // returns false. Reads disk files with the lock released when the index holds it
  // alone (*unlocked is then set, as by fetch_remote).
  bool promote_match(Match& m, const std::vector<Tier>& found, int64_t fresh, uint64_t request_tick,
                     bool disk, bool* unlocked);
  // Unpins pieces [i, end) of m and truncates m there.
  void cut(Match& m, const std::vector<Tier>& found, size_t i);
  // The same, and drops the subtree of piece i (its record was bad).
  void drop_rest(Match& m, const std::vector<Tier>& found, size_t i);
  // match (fresh >= 0) and prefetch (fresh < 0): the match, brought to the
  // hot tier (and extended from the remote store unless `remote` is false),
  // with the tiers it came from; pieces on disk are read layer by layer when
  // fresh >= 0. A prefetch marks what it moved with the tier it came from.
  // disk: false stops before a piece on disk (and leaves the remote store
  // alone then).
  Match load(uint64_t ns, std::span<const int32_t> tokens, int64_t fresh, uint64_t request_tick, bool remote,
             bool disk);
  // Extends a match of `length` tokens from the remote store block by block,
  // inserting what is found; returns the new length. Reads with the lock
  // released when the index holds it alone (*unlocked is then set: the
  // caller's pieces may have been split meanwhile and are to be re-peeked).
  // mark: the new nodes are marked as fetched from the remote tier.
  int64_t fetch_remote(uint64_t ns, std::span<const int32_t> tokens, int64_t length, bool* unlocked,
                       bool mark);
  void unpin_locked(const Match& m, bool evict);
  void make_room(Tier t);
  void demote(NodeId node);
  void swap_out(NodeId node);  // hot to host
  // Frees host copies of hot nodes, lowest priority first, until the host
  // tier is within budget (or none is left).
  void drop_host_copies();
  void drop_subtree(NodeId node);
  NodeId split(NodeId node, int64_t at);  // node keeps [at, end); returns the new parent with [0, at)
  int64_t insert_impl(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                      size_t virtual_bytes_per_token, double cost_per_token, Match* path, bool publish);
  // Returns the tokens added; *new_from: where they start.
  int64_t insert_path(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                      size_t virtual_bytes_per_token, double cost_per_token, int64_t* new_from);
  void remove_leaf(NodeId node);
  bool is_live(NodeId node) const {
    return node >= 0 && node < static_cast<NodeId>(nodes_.size()) && nodes_[node].live;
  }

  mutable IndexMutex mu_;
  // The depth of a match's layered loads: disk_bytes of its pieces on disk.
  int preload_layers(int n_layer, size_t disk_bytes, int64_t cached, int64_t fresh) const;
  LayerPreload layer_preload_;
  // The last layered load of each node and the request that started it:
  // another run of that request reuses it instead of reading the file again.
  struct InFlight {
    uint64_t request_tick = 0;
    std::weak_ptr<LayerLoader> loader;
  };
  std::unordered_map<NodeId, InFlight> in_flight_;
  double read_bytes_per_ms_ = 0;     // the disk's, from finished layered loads (0: unknown)
  double prefill_ms_per_token_ = 0;  // from finished passes (0: unknown)
  SpanTiers tiers_;
  // Shared with a fetch running without the lock, which a detach must not pull away.
  std::shared_ptr<RemoteBlocks> remote_;
  std::shared_ptr<IndexObserver> observer_;
  std::optional<SpanShape> shape_;
  int64_t disk_layer_rejects_ = 0;   // layered loads that found a layer's tag wrong
  int64_t disk_write_failures_ = 0;  // spans the disk store refused at once (writes behind: its count)
  std::function<double(int64_t, int64_t)> cost_model_;
  mutable Stats stats_;  // stats() folds the disk store's counts in
  std::unique_ptr<ReplacementPolicy> policy_;
  size_t n_live_ = 0;
  int64_t n_evicted_ = 0;
  uint64_t clock_ = 0;
  std::vector<Node> nodes_;
  std::vector<NodeId> free_;
  std::unordered_map<uint64_t, NodeId> roots_;
  std::set<EvictKey> candidates_[kTiers];
  bool keys_dirty_ = false;
  std::vector<NodeId> lookahead_nodes_;  // weighted by the last set_lookahead
};

}  // namespace depcache

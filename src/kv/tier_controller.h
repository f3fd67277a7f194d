#pragma once
// The KV index's tier controller: where each node of the tree
// (kv/radix_tree.h) has its span, and every move between tiers with its I/O.
// It brings what a match or prefetch uses to the hot tier (a host copy, a
// disk file read whole with the lock released or layer by layer while the
// pass computes, blocks of the remote store), inserts new spans (and
// publishes them to the remote tier), demotes to each tier's budget in the
// order the tree keeps (hot to host to disk to out), and learns the costs
// that pace a layer-wise preload. It follows the index's lock rules
// (kv/index_lock.h): the index's public methods hold the lock around every
// call; the controller releases it only for I/O, only when the index holds
// it alone.
//
// A disk or remote record that turns out bad (tag, shape, a missing file)
// is dropped with the subtree below it and counted; its tokens are
// recomputed, never served from a bad record.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/disk_store.h"
#include "kv/index_lock.h"
#include "kv/radix_tree.h"
#include "kv/remote_blocks.h"
#include "kv/remote_store.h"
#include "kv/span_record.h"
#include "kv/span_tiers.h"

namespace depcache {

struct IndexStats {
  static constexpr int kTiers = RadixTree::kTiers;
  static constexpr int kRejectDisk = 0, kRejectRemote = 1;
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

// Layer-wise preload in match (Cache-Craft; not in prefetch, which has
// time): a piece on disk is read layer by layer, its first layers before
// match returns (see RadixTree::Match::loading), the rest while the caller
// computes. Auto: as many first layers as keep the pass from waiting
// (preload_depth) given the disk's read rate, learned from finished layered
// loads, and the pass's compute time per layer (the cost model's T(cached,
// fresh), else fresh tokens times the per-token time note_prefill learned);
// all layers while either is unknown.
struct LayerPreload {
  enum class Mode { Off, Fixed, Auto } mode = Mode::Off;
  int depth = 0;  // Fixed: layers read before match returns
};

class TierController {
 public:
  using NodeId = RadixTree::NodeId;
  using Match = RadixTree::Match;
  using Piece = RadixTree::Piece;

  TierController(RadixTree& tree, IndexMutex& mu, size_t hot_budget)
      : tree_(tree), mu_(mu), tiers_(hot_budget) {}

  // --- Tiers and settings (see RadixIndex for what each means).
  const SpanTiers& tiers() const { return tiers_; }
  void attach_host(size_t byte_budget, bool swap_out_once) { tiers_.attach_host(byte_budget, swap_out_once); }
  void attach_disk(DiskSpanStore& store);  // adopts what the store holds
  void attach_remote(std::shared_ptr<RemoteBlocks> remote) { remote_ = std::move(remote); }
  std::shared_ptr<RemoteBlocks> remote() const { return remote_; }
  std::shared_ptr<RemoteBlocks> detach_remote() { return std::move(remote_); }
  void expect_span_shape(const SpanShape& shape);
  const std::optional<SpanShape>& span_shape() const { return shape_; }
  void set_cost_model(std::function<double(int64_t, int64_t)> cost) { cost_model_ = std::move(cost); }
  double cost_per_token(int64_t cached, int64_t fresh, double measured) const;
  void set_layer_preload(LayerPreload preload) { layer_preload_ = preload; }
  LayerPreload layer_preload() const { return layer_preload_; }
  void note_prefill(double ms_per_token);
  IndexStats& stats() { return stats_; }
  // The counts with the disk store's folded in.
  const IndexStats& folded_stats() const;

  // --- Moves.
  // match (fresh >= 0) and prefetch (fresh < 0): the match, brought to the
  // hot tier (and extended from the remote store unless `remote` is false),
  // with the tiers it came from; pieces on disk are read layer by layer when
  // fresh >= 0 and a preload is set. A prefetch marks what it moved with the
  // tier it came from. disk: false stops before a piece on disk (and leaves
  // the remote store alone then).
  Match load(uint64_t ns, std::span<const int32_t> tokens, int64_t fresh, uint64_t request_tick, bool remote,
             bool disk);
  // Adds what is missing of `tokens` below hot nodes, then evicts to the
  // budget; returns the tokens that were new. make_span null: virtual nodes
  // of virtual_bytes_per_token. publish: offer new real spans to the remote
  // tier. path: receives the nodes now holding the sequence.
  int64_t insert(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                 size_t virtual_bytes_per_token, double cost_per_token, Match* path, bool publish);
  bool adopt_loaded(NodeId node, KvSpan span, const LayerLoader& loader);
  bool drop_bad_load(NodeId node, uint64_t disk_key);
  // Unpins a match; evict: then back to the hot tier's budget.
  void unpin(const Match& m, bool evict);
  // Moves nodes of tier t down (or out) until it is within its budget.
  void make_room(Tier t);
  void evict_to(size_t target);
  void persist();

  // The tiers' bytes, the tier order along every path, the spans' sizes and
  // the disk files agree with the tree.
  void check_invariants() const;

 private:
  Tier tier(NodeId id) const { return tree_.tier(id); }
  // Moves a node's slot between tiers with `move` (false: it stayed), then
  // tells the policy and re-ranks the node and its parent.
  bool retier(NodeId node, const std::function<bool(SpanSlot&)>& move);
  void set_tier(NodeId node, Tier t);
  bool promote(NodeId node);  // to the hot tier; false when its disk file is bad
  // Promotes the pieces of a pinned match in order; where a promotion
  // fails, unpins and drops the rest and truncates m and its tier counts
  // (`found`: the tier each piece was counted in). fresh >= 0: layered, for
  // a request computing that many tokens; the request's runs (request_tick >
  // 0) share the loader of a node. !disk: stops before a piece on disk and
  // returns false. Reads disk files with the lock released when the index
  // holds it alone (*unlocked is then set, as by fetch_remote).
  bool promote_match(Match& m, const std::vector<Tier>& found, int64_t fresh, uint64_t request_tick,
                     bool disk, bool* unlocked);
  // promote_match's layered start of piece i; false when its file is bad.
  bool start_layered_piece(Match& m, const std::vector<Tier>& found, size_t i, uint64_t request_tick,
                           const std::function<int(int)>& depth);
  // After the lock was released or remote blocks were inserted: the match
  // taken again up to `total` tokens, keeping the loaders of pieces still
  // on disk, ending before a piece neither in memory nor loading, with its
  // tier counts (`local`: what was matched before the remote tier).
  Match rematch(uint64_t ns, std::span<const int32_t> tokens, const Match& before, int64_t local,
                int64_t total) const;
  // Unpins pieces [i, end) of m and truncates m there.
  void cut(Match& m, const std::vector<Tier>& found, size_t i);
  // The same, and drops the subtree of piece i (its record was bad).
  void drop_rest(Match& m, const std::vector<Tier>& found, size_t i);
  // Extends a match of `length` tokens from the remote store block by block,
  // inserting what is found; returns the new length. Reads with the lock
  // released when the index holds it alone (*unlocked is then set: the
  // caller's pieces may have been split meanwhile and are to be re-peeked).
  // mark: the new nodes are marked as fetched from the remote tier.
  int64_t fetch_remote(uint64_t ns, std::span<const int32_t> tokens, int64_t length, bool* unlocked,
                       bool mark);
  // Returns the tokens added; *new_from: where they start.
  int64_t insert_path(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                      size_t virtual_bytes_per_token, double cost_per_token, int64_t* new_from);
  void demote(NodeId node);
  void demote_to_disk(NodeId node);
  void swap_out(NodeId node);  // hot to host
  // Frees host copies of hot nodes, lowest priority first, until the host
  // tier is within budget (or none is left).
  void drop_host_copies();
  // Takes a node and what hangs below it out of the tree and the tiers.
  void drop_subtree(NodeId node);
  // The depth of a match's layered loads: disk_bytes of its pieces on disk.
  int preload_layers(int n_layer, size_t disk_bytes, int64_t cached, int64_t fresh) const;

  RadixTree& tree_;
  IndexMutex& mu_;
  SpanTiers tiers_;
  // Shared with a fetch running without the lock, which a detach must not pull away.
  std::shared_ptr<RemoteBlocks> remote_;
  std::optional<SpanShape> shape_;
  std::function<double(int64_t, int64_t)> cost_model_;
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
  int64_t disk_layer_rejects_ = 0;   // layered loads that found a layer's tag wrong
  int64_t disk_write_failures_ = 0;  // spans the disk store refused at once (writes behind: its count)
  mutable IndexStats stats_;         // folded_stats() folds the disk store's counts in
};

}  // namespace depcache

#include "kv/tier_controller.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace depcache {
namespace {
constexpr int kHot = static_cast<int>(Tier::Hot);
constexpr int kRemote = static_cast<int>(Tier::Remote);
constexpr int kTiers = RadixTree::kTiers;
}  // namespace

void TierController::expect_span_shape(const SpanShape& shape) {
  shape_ = shape;
  if (tiers_.disk()) tiers_.disk()->set_shape(shape);
}

const IndexStats& TierController::folded_stats() const {
  if (const DiskSpanStore* disk = tiers_.disk())
    for (int r = 0; r < kRejectReasons; ++r)
      stats_.rejected[IndexStats::kRejectDisk][r] = disk->n_rejected(r);
  stats_.rejected[IndexStats::kRejectDisk][reject_index(RecordStatus::Mac)] += disk_layer_rejects_;
  stats_.disk_write_failures = disk_write_failures_ + (tiers_.disk() ? tiers_.disk()->n_write_failures() : 0);
  return stats_;
}

double TierController::cost_per_token(int64_t cached, int64_t fresh, double measured) const {
  if (!cost_model_ || fresh <= 0) return measured;
  return cost_model_(cached, fresh) / static_cast<double>(fresh);
}

void TierController::note_prefill(double ms_per_token) {
  if (!(ms_per_token > 0) || !std::isfinite(ms_per_token)) return;
  prefill_ms_per_token_ =
      prefill_ms_per_token_ > 0 ? 0.75 * prefill_ms_per_token_ + 0.25 * ms_per_token : ms_per_token;
}

void TierController::attach_disk(DiskSpanStore& store) {
  if (shape_) store.set_shape(*shape_);  // before the scan refuses what does not fit
  tiers_.attach_disk(store);
  // Adopt what an earlier process left: shortest sequences first, so every
  // span's context is in place before it. A span whose context is missing,
  // or whose key does not match its contents, is deleted.
  std::vector<DiskSpanStore::StoredSpan> found = store.scan();
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.tokens.size() < b.tokens.size(); });
  for (const DiskSpanStore::StoredSpan& f : found) {
    const auto n = static_cast<int64_t>(f.tokens.size());
    const std::span<const int32_t> all(f.tokens);
    bool adopted = false;
    if (f.prefix < n && span_content_key(f.ns, all) == f.key) {
      const Match m = tree_.peek(f.ns, all.first(static_cast<size_t>(f.prefix)));
      // The context must end exactly at a node's end, and the slot must be free.
      const bool at_node_end =
          m.length == f.prefix &&
          (m.pieces.empty() ||
           m.pieces.back().length == static_cast<int64_t>(tree_.node(m.pieces.back().node).tokens.size()));
      const NodeId parent = !at_node_end ? -1 : m.pieces.empty() ? tree_.root(f.ns) : m.pieces.back().node;
      if (parent >= 0 && !tree_.node(parent).children.count(f.tokens[f.prefix])) {
        SpanSlot slot;
        slot.n_tokens = n - f.prefix;
        slot.tier = Tier::Disk;
        slot.disk_key = f.key;
        slot.disk_bytes = store.file_bytes_of(f.key);
        tiers_.add(slot);
        tree_.add_leaf(parent, all, f.prefix, std::move(slot), 1.0, f.key);
        adopted = true;
      }
    }
    if (!adopted) store.remove(f.key);
  }
  make_room(Tier::Disk);
}

bool TierController::retier(NodeId id, const std::function<bool(SpanSlot&)>& move) {
  tree_.untouch(id);
  RadixTree::Node& n = tree_.node(id);
  const bool moved = move(n.slot);
  if (moved) tree_.policy().on_tier_change(id, n.slot.tier);
  if (n.slot.tier != Tier::Hot) n.fetched_from = Tier::Hot;  // moved down before a match used it
  tree_.touch(id);
  tree_.touch(n.parent);  // it may have lost or gained a child in its tier
  return moved;
}

void TierController::set_tier(NodeId id, Tier t) {
  retier(id, [&](SpanSlot& slot) {
    tiers_.set_tier(slot, t);
    return true;
  });
}

bool TierController::promote(NodeId id) {
  if (tier(id) == Tier::Hot) return true;
  const RadixTree::Node& n = tree_.node(id);
  const std::vector<int32_t> path = tree_.path_tokens(id);
  return retier(
      id, [&](SpanSlot& slot) { return tiers_.promote(slot, n.ns, path, n.start, &stats_.promoted_bytes); });
}

int TierController::preload_layers(int n_layer, size_t disk_bytes, int64_t cached, int64_t fresh) const {
  if (layer_preload_.mode == LayerPreload::Mode::Fixed) return layer_preload_.depth;
  const double compute_ms = cost_model_ && fresh > 0 ? cost_model_(cached, fresh)
                                                     : static_cast<double>(fresh) * prefill_ms_per_token_;
  if (!(read_bytes_per_ms_ > 0) || !(compute_ms > 0)) return n_layer;  // unknown (or NaN)
  const double load_ms = static_cast<double>(disk_bytes) / read_bytes_per_ms_;
  return preload_depth(n_layer, load_ms / n_layer, compute_ms / n_layer);
}

void TierController::cut(Match& m, const std::vector<Tier>& found, size_t i) {
  for (size_t j = i; j < m.pieces.size(); ++j) {
    const Piece& p = m.pieces[j];
    tree_.unpin(p.node);
    m.tokens_from[static_cast<int>(found[j])] -= p.length;
    m.length -= p.length;
  }
  m.pieces.resize(i);
  if (m.loading.size() > i) m.loading.resize(i);
}

void TierController::drop_rest(Match& m, const std::vector<Tier>& found, size_t i) {
  const NodeId bad = m.pieces[i].node;
  ++stats_.dropped_bad;
  cut(m, found, i);  // the rest of the match hangs below it
  drop_subtree(bad);
}

bool TierController::start_layered_piece(Match& m, const std::vector<Tier>& found, size_t i,
                                         uint64_t request_tick, const std::function<int(int)>& depth) {
  const NodeId id = m.pieces[i].node;
  const RadixTree::Node& n = tree_.node(id);
  m.loading.resize(m.pieces.size());
  if (const auto f = in_flight_.find(id);
      f != in_flight_.end() && request_tick > 0 && f->second.request_tick == request_tick) {
    if (auto loader = f->second.loader.lock(); loader && loader->key() == n.slot.disk_key) {
      // Read already for an earlier run of this request: as a whole load
      // would have left it, it counts as found in memory.
      m.loading[i] = std::move(loader);
      m.tokens_from[static_cast<int>(found[i])] -= m.pieces[i].length;
      m.tokens_from[kHot] += m.pieces[i].length;
      return true;
    }
  }
  auto loader = tiers_.start_layered(n.slot, n.ns, tree_.path_tokens(id), n.start, depth);
  if (!loader) return false;
  in_flight_[id] = {request_tick, loader};
  m.loading[i] = std::move(loader);
  return true;
}

bool TierController::promote_match(Match& m, const std::vector<Tier>& found, int64_t fresh,
                                   uint64_t request_tick, bool disk, bool* unlocked) {
  const bool layered = layer_preload_.mode != LayerPreload::Mode::Off && fresh >= 0;
  size_t disk_bytes = 0;  // what the layered loads of this match read in all
  for (const Piece& p : m.pieces)
    if (tier(p.node) == Tier::Disk) disk_bytes += tree_.node(p.node).slot.disk_bytes;
  const auto depth = [&](int n_layer) { return preload_layers(n_layer, disk_bytes, m.length, fresh); };
  // Whole reads of disk files, done below with the lock released when this
  // call holds it alone (under a caller's lock they are done at once).
  struct Read {
    size_t piece;
    DiskSpanStore::LayerReader reader;
    bool ok = false;
  };
  std::vector<Read> reads;
  const bool unlock = mu_.held_alone();
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const NodeId id = m.pieces[i].node;
    if (tier(id) == Tier::Hot) continue;
    const RadixTree::Node& n = tree_.node(id);
    const bool real_disk = tier(id) == Tier::Disk && !n.slot.is_virtual();
    if (!disk && real_disk) {
      cut(m, found, i);
      return false;
    }
    if (layered && real_disk) {
      if (start_layered_piece(m, found, i, request_tick, depth)) continue;
    } else if (unlock && real_disk) {
      if (auto reader = tiers_.open_disk(n.slot, n.ns, tree_.path_tokens(id), n.start)) {
        reads.push_back({i, std::move(*reader)});
        continue;
      }
    } else if (promote(id)) {
      continue;
    }
    drop_rest(m, found, i);
    break;
  }
  if (reads.empty()) return true;
  // The pieces stay pinned while their layers are read.
  *unlocked = true;
  {
    const IndexMutex::Released released(mu_);
    for (Read& r : reads) {
      r.ok = true;
      for (int il = 0; il < r.reader.n_layer() && r.ok; ++il) r.ok = r.reader.read_layer(il);
      if (!r.ok) break;  // what hangs below it is dropped with it
    }
  }
  for (Read& r : reads) {
    if (r.piece >= m.pieces.size()) break;
    const NodeId id = m.pieces[r.piece].node;
    const SpanSlot& slot = tree_.node(id).slot;
    // Another thread may have moved or dropped the node meanwhile: then
    // nothing is adopted, and load() takes the match again.
    const bool same = tree_.is_live(id) && slot.tier == Tier::Disk && slot.disk_key == r.reader.key();
    if (!r.ok) {
      if (same) {
        ++disk_layer_rejects_;  // a layer failed its tag (or could not be read)
        drop_rest(m, found, r.piece);
      }
      break;
    }
    if (same && retier(id, [&](SpanSlot& s) {
          return tiers_.adopt(s, r.reader.key(), std::move(r.reader.span()), &stats_.promoted_bytes);
        }))
      ++stats_.unlocked_disk_reads;
  }
  return true;
}

TierController::Match TierController::rematch(uint64_t ns, std::span<const int32_t> tokens,
                                              const Match& before, int64_t local, int64_t total) const {
  // Inserting the remote blocks walked the match and so read any piece
  // still loading whole (insert hangs new nodes below hot ones only); with
  // the lock released, other threads may have split its nodes. So the
  // match is taken again; a loader carries over to a piece that is still
  // the node it was reading, still on disk.
  std::vector<std::pair<NodeId, std::shared_ptr<LayerLoader>>> loaders;
  for (size_t i = 0; i < before.loading.size(); ++i)
    if (before.loading[i]) loaders.emplace_back(before.pieces[i].node, before.loading[i]);
  Match m = tree_.peek(ns, tokens.first(static_cast<size_t>(total)));
  for (size_t i = 0; i < m.pieces.size() && !loaders.empty(); ++i)
    for (const auto& [node, loader] : loaders)
      if (node == m.pieces[i].node && tier(node) == Tier::Disk &&
          tree_.node(node).slot.disk_key == loader->key()) {
        m.loading.resize(m.pieces.size());
        m.loading[i] = loader;
      }
  // A piece neither in memory nor loading cannot be served: the match ends
  // before it (a node another thread moved down meanwhile).
  for (size_t i = 0; i < m.pieces.size(); ++i)
    if (tier(m.pieces[i].node) != Tier::Hot && (m.loading.size() <= i || !m.loading[i])) {
      for (size_t j = i; j < m.pieces.size(); ++j) m.length -= m.pieces[j].length;
      m.pieces.resize(i);
      if (m.loading.size() > i) m.loading.resize(i);
      break;
    }
  std::copy(std::begin(before.tokens_from), std::end(before.tokens_from), m.tokens_from);
  m.tokens_from[kRemote] += std::max<int64_t>(0, m.length - local);
  // Shorter than found: the tokens lost come off the slowest tiers first
  // (the last pieces of a match are the ones in the slowest tiers).
  for (int64_t lost = std::max<int64_t>(0, local - m.length), t = kTiers - 1; lost > 0 && t >= 0; --t) {
    const int64_t take = std::min(lost, m.tokens_from[t]);
    m.tokens_from[t] -= take;
    lost -= take;
  }
  return m;
}

TierController::Match TierController::load(uint64_t ns, std::span<const int32_t> tokens, int64_t fresh,
                                           uint64_t request_tick, bool remote, bool disk) {
  const bool counted = fresh >= 0;            // a match; else a prefetch
  Match m = tree_.peek(ns, tokens, counted);  // tokens_from: the tiers as found
  std::vector<Tier> found;
  for (const Piece& p : m.pieces) found.push_back(tree_.found_tier(p.node, counted));
  // Hold what is matched while lower tiers and the remote store are read:
  // bringing one node in must not push another out.
  tree_.pin(m);
  bool unlocked = false;
  const bool whole = promote_match(m, found, fresh, request_tick, disk, &unlocked);
  if (!counted)  // a prefetch: what it moved is reported by the tier it came from
    for (size_t i = 0; i < m.pieces.size(); ++i)
      if (found[i] != Tier::Hot && tier(m.pieces[i].node) == Tier::Hot)
        tree_.node(m.pieces[i].node).fetched_from = found[i];
  const Match held = m;
  const int64_t local = m.length;
  int64_t total = local;
  if (whole && remote && remote_ && m.length < static_cast<int64_t>(tokens.size()))
    total = fetch_remote(ns, tokens, local, &unlocked, !counted);
  if (total > local || unlocked) m = rematch(ns, tokens, m, local, total);
  // Back to the budget, keeping what this match brought in.
  tree_.pin(m);
  unpin(held, false);  // splits keep pins on the same node ids
  make_room(Tier::Hot);
  unpin(m, false);
  return m;
}

bool TierController::adopt_loaded(NodeId id, KvSpan span, const LayerLoader& loader) {
  if (span.n_tokens() == 0) return false;
  ++stats_.layered_loads;
  stats_.layer_wait_ms += loader.waited_ms();
  if (loader.read_ms() > 0 && loader.bytes() > 0) {
    // A running rate, so one slow read (a cold page cache) does not set it.
    const double rate = static_cast<double>(loader.bytes()) / loader.read_ms();
    read_bytes_per_ms_ = read_bytes_per_ms_ > 0 ? 0.75 * read_bytes_per_ms_ + 0.25 * rate : rate;
  }
  if (!tree_.is_live(id)) return false;
  in_flight_.erase(id);
  return retier(id, [&](SpanSlot& slot) {
    return tiers_.adopt(slot, loader.key(), std::move(span), &stats_.promoted_bytes);
  });
}

bool TierController::drop_bad_load(NodeId id, uint64_t disk_key) {
  if (!tree_.is_live(id)) return false;
  const SpanSlot& slot = tree_.node(id).slot;
  if (slot.tier != Tier::Disk || slot.disk_key != disk_key) return false;
  ++stats_.dropped_bad;
  ++disk_layer_rejects_;  // a layer failed its tag (or could not be read)
  drop_subtree(id);
  return true;
}

int64_t TierController::fetch_remote(uint64_t ns, std::span<const int32_t> tokens, int64_t length,
                                     bool* unlocked, bool mark) {
  const std::shared_ptr<RemoteBlocks> remote = remote_;
  const std::optional<SpanShape> shape = shape_;
  RemoteBlocks::Fetched got;
  const bool unlock = mu_.held_alone();
  if (unlock) {
    // Only this call holds the lock: release it for the reads (the match so
    // far is pinned), take it back to adopt what came.
    *unlocked = true;
    const IndexMutex::Released released(mu_);
    got = remote->fetch(ns, tokens, length, shape);
  } else {
    got = remote->fetch(ns, tokens, length, shape);  // under the caller's lock: it expects nothing to move
  }
  for (int r = 0; r < kRejectReasons; ++r) {
    stats_.rejected[IndexStats::kRejectRemote][r] += got.rejected[r];
    stats_.dropped_bad += got.rejected[r];
  }
  std::vector<Match> held;  // each block stays pinned until all are in
  for (const RemoteBlocks::Block& block : got.blocks) {
    // The block hangs below its context, which must be in the tree and hot
    // (the tree may have changed while the lock was released).
    const Match context = tree_.peek(ns, tokens.first(static_cast<size_t>(block.b0)));
    if (context.length < block.b0) break;
    const auto bad = std::find_if(context.pieces.begin(), context.pieces.end(), [&](const Piece& p) {
      return tier(p.node) != Tier::Hot && !promote(p.node);
    });
    if (bad != context.pieces.end()) {
      ++stats_.dropped_bad;
      drop_subtree(bad->node);
      break;
    }
    const SpanMaker from_block = [&](int64_t begin, int64_t end) {
      if (begin < block.b0 || end > block.b1)
        fail(ErrorKind::Internal, "remote block [{}, {}) asked for [{}, {})", block.b0, block.b1, begin, end);
      return block.span.slice(begin - block.b0, end - block.b0);
    };
    Match path;
    insert(ns, tokens.first(static_cast<size_t>(block.b1)), &from_block, 0, 1.0, &path, /*publish=*/false);
    if (path.length < block.b1) break;  // larger than the hot tier
    if (mark)
      for (const Piece& p : path.pieces)
        if (tree_.node(p.node).start >= length) tree_.node(p.node).fetched_from = Tier::Remote;
    tree_.pin(path);
    held.push_back(std::move(path));
    length = block.b1;
    stats_.unlocked_remote_blocks += unlock;
  }
  for (const Match& m : held) unpin(m, false);
  return length;
}

int64_t TierController::insert(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                               size_t virtual_bytes_per_token, double cost_per_token, Match* path,
                               bool publish) {
  int64_t from = 0;
  const int64_t added = insert_path(ns, tokens, make_span, virtual_bytes_per_token, cost_per_token, &from);
  if (publish && remote_ && make_span && added > 0)
    stats_.remote_published += remote_->publish(ns, tokens, from, *make_span);
  if (path) *path = tree_.peek(ns, tokens);
  return added;
}

int64_t TierController::insert_path(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                                    size_t virtual_bytes_per_token, double cost_per_token,
                                    int64_t* new_from) {
  const auto n = static_cast<int64_t>(tokens.size());
  *new_from = n;
  // The span of the new tokens [tail_from, n), made and sized before the
  // tree changes: a refused insert leaves it as it was (a split made first
  // would leave a match its caller holds naming the split's tail).
  SpanSlot tail;
  tail.bytes_per_token = virtual_bytes_per_token;
  int64_t tail_from = -1;  // where the tail starts (-1: not made)
  const auto make_tail = [&](int64_t from) {
    tail_from = from;
    tail.n_tokens = n - from;
    if (make_span) {
      tail.span = (*make_span)(from, n);
      if (tail.span.n_tokens() != tail.n_tokens)
        fail(ErrorKind::Internal, "radix insert: span of {} tokens for {} new ones", tail.span.n_tokens(),
             tail.n_tokens);
      tail.bytes_per_token = tail.span.bytes() / static_cast<size_t>(tail.n_tokens);
    }
    if (tail.memory_bytes() <= tiers_.budget(Tier::Hot)) return true;
    ++stats_.oversized[kHot];  // could never fit
    return false;
  };
  if (const int64_t found = tree_.peek(ns, tokens).length; found < n && !make_tail(found)) return 0;
  const uint64_t tick = tree_.next_tick();
  NodeId at = tree_.root(ns);
  tree_.node(at).last_used = tick;
  int64_t pos = 0;
  while (pos < n) {
    auto& children = tree_.node(at).children;
    auto c = children.find(tokens[pos]);
    // A new leaf hangs below hot nodes only; a walked node whose disk file
    // is bad goes (with what hangs below it) and the tokens count as new.
    if (c != children.end() && tier(c->second) != Tier::Hot && !promote(c->second)) {
      ++stats_.dropped_bad;
      drop_subtree(c->second);
      c = children.end();
    }
    if (c == children.end()) {
      // Starting earlier than found: a bad file was dropped on the way.
      if (tail_from != pos && !make_tail(pos)) break;
      tiers_.add(tail);
      const NodeId leaf =
          tree_.add_leaf(at, tokens, pos, std::move(tail), cost_per_token, span_content_key(ns, tokens));
      *new_from = pos;
      // Keep the new leaf through this eviction: it is what the caller wants cached.
      tree_.pin(leaf);
      make_room(Tier::Hot);
      tree_.unpin(leaf);
      return n - pos;
    }
    NodeId child = c->second;
    const auto edge = static_cast<int64_t>(tree_.node(child).tokens.size());
    int64_t k = 0;
    while (k < edge && pos + k < n && tree_.node(child).tokens[k] == tokens[pos + k]) ++k;
    if (k < edge) child = tree_.split(child, k);
    tree_.node(child).last_used = tick;
    tree_.touch(child);
    pos += k;
    at = child;
  }
  make_room(Tier::Hot);
  return 0;
}

void TierController::unpin(const Match& m, bool evict) {
  tree_.unpin(m);
  if (evict) make_room(Tier::Hot);  // what pins held above the budget can go now
}

void TierController::drop_subtree(NodeId id) {
  for (NodeId node : tree_.subtree_children_first(id)) {
    in_flight_.erase(node);
    tiers_.remove(tree_.node(node).slot);
    tree_.remove_leaf(node);
  }
}

void TierController::evict_to(size_t target) {
  const size_t budget = tiers_.budget(Tier::Hot);
  tiers_.set_budget(Tier::Hot, std::min(budget, target));
  make_room(Tier::Hot);
  tiers_.set_budget(Tier::Hot, budget);
}

void TierController::make_room(Tier t) {
  // Host copies of hot nodes go first: dropping one loses nothing cached.
  if (t == Tier::Host) drop_host_copies();
  while (tiers_.over_budget(t)) {
    const RadixTree::EvictKey* candidate = tree_.lowest(t);
    if (!candidate) return;  // everything left is pinned
    const RadixTree::EvictKey lowest = *candidate;
    tree_.policy().on_evict(lowest.id, lowest.priority, t);
    ++stats_.demoted[static_cast<int>(t)];
    demote(lowest.id);
  }
}

void TierController::demote(NodeId id) {
  const std::optional<Tier> to = tiers_.below(tier(id));
  if (!to) {
    drop_subtree(id);  // the last tier: a leaf (its children were in this tier or gone)
    return;
  }
  if (*to == Tier::Host) {
    swap_out(id);
  } else if (tree_.node(id).slot.span.n_tokens() == 0) {  // virtual nodes only change tier
    set_tier(id, *to);
  } else {
    demote_to_disk(id);
    return;
  }
  make_room(*to);
}

void TierController::demote_to_disk(NodeId id) {
  const std::vector<int32_t> path = tree_.path_tokens(id);
  const size_t need = tiers_.disk_file_bytes(tree_.node(id).slot, static_cast<int64_t>(path.size()));
  // Room on disk first, by the policy (the store's own order would not know
  // which files the index still needs).
  const size_t budget = tiers_.budget(Tier::Disk);
  if (need <= budget) {
    tiers_.set_budget(Tier::Disk, budget - need);
    tree_.pin(id);
    make_room(Tier::Disk);
    tree_.unpin(id);
    tiers_.set_budget(Tier::Disk, budget);
  }
  const RadixTree::Node& n = tree_.node(id);
  const bool written = need <= budget && retier(id, [&](SpanSlot& slot) {
                         return tiers_.write_to_disk(slot, n.ns, path, n.start);
                       });
  if (!written) {
    ++(need <= budget ? disk_write_failures_ : stats_.oversized[static_cast<int>(Tier::Disk)]);
    drop_subtree(id);  // cannot go lower: out, with whatever hangs below
  }
}

void TierController::swap_out(NodeId id) {
  const bool saved = tree_.node(id).slot.has_host_copy;
  size_t copied = 0;
  retier(id, [&](SpanSlot& slot) {
    copied = tiers_.swap_out(slot);
    return true;
  });
  stats_.swapped_out_bytes += static_cast<int64_t>(copied);
  stats_.swap_outs_saved += saved;
}

void TierController::drop_host_copies() {
  if (!tiers_.over_budget(Tier::Host)) return;
  // Lowest priority first (ties: the older node), ranked once: dropping a
  // copy changes no node's priority.
  std::vector<std::pair<double, NodeId>> copies;
  for (NodeId id = 0; id < tree_.end_id(); ++id)
    if (tree_.node(id).live && tree_.node(id).slot.has_host_copy) copies.emplace_back(tree_.priority(id), id);
  std::sort(copies.begin(), copies.end());
  for (const auto& [priority, id] : copies) {
    if (!tiers_.over_budget(Tier::Host)) return;
    tiers_.drop_host_copy(tree_.node(id).slot);
  }
}

void TierController::persist() {
  if (!tiers_.disk()) return;
  // Deepest first, so children are on disk before their parents move.
  std::vector<std::pair<int64_t, NodeId>> order;
  for (NodeId id = 0; id < tree_.end_id(); ++id) {
    const RadixTree::Node& n = tree_.node(id);
    if (n.live && n.parent >= 0 && n.slot.tier != Tier::Disk && n.slot.span.n_tokens() > 0)
      order.emplace_back(n.start, id);
  }
  std::sort(order.begin(), order.end(), std::greater<>());
  for (const auto& [start, id] : order) {
    if (!tree_.node(id).live || tier(id) == Tier::Disk) continue;
    tree_.node(id).pins = 0;  // shutting down: nothing is in use
    if (tier(id) == Tier::Hot && tiers_.below(Tier::Hot) == Tier::Host) swap_out(id);
    demote(id);
  }
  tiers_.disk()->flush();  // written behind: on disk before the process goes
}

void TierController::check_invariants() const {
  size_t bytes[kTiers] = {}, on_disk = 0;
  for (NodeId id = 0; id < tree_.end_id(); ++id) {
    const RadixTree::Node& n = tree_.node(id);
    if (!n.live) continue;
    const SpanSlot& slot = n.slot;
    bytes[static_cast<int>(slot.tier)] += slot.tier_bytes();
    if (slot.has_host_copy) {
      if (slot.tier != Tier::Hot)
        fail(ErrorKind::Internal, "radix node {} outside the hot tier has a host copy", id);
      bytes[static_cast<int>(Tier::Host)] += slot.memory_bytes();
    }
    if (n.parent < 0) continue;
    const RadixTree::Node& parent = tree_.node(n.parent);
    if (parent.parent >= 0 && static_cast<int>(parent.slot.tier) > static_cast<int>(slot.tier))
      fail(ErrorKind::Internal, "radix node {} in tier {} under a parent in tier {}", id,
           tier_name(slot.tier), tier_name(parent.slot.tier));
    if (slot.span.n_tokens() != 0 && slot.span.n_tokens() != slot.n_tokens)
      fail(ErrorKind::Internal, "radix node {}: {} tokens but a span of {}", id, n.tokens.size(),
           slot.span.n_tokens());
    if (slot.span.n_tokens() != 0 && slot.span.bytes() != slot.memory_bytes())
      fail(ErrorKind::Internal, "radix node {}: span of {} bytes counted as {}", id, slot.span.bytes(),
           slot.memory_bytes());
    if (slot.tier == Tier::Disk && slot.disk_bytes > 0) {
      ++on_disk;
      if (slot.span.n_tokens() != 0)
        fail(ErrorKind::Internal, "radix node {} on disk still holds its span", id);
      if (!tiers_.disk() || !tiers_.disk()->contains(slot.disk_key))
        fail(ErrorKind::Internal, "radix node {} is on disk, but its file is not", id);
    }
  }
  for (int t = 0; t < kRemote; ++t)
    if (bytes[t] != tiers_.bytes(static_cast<Tier>(t)))
      fail(ErrorKind::Internal, "radix index counts {} bytes in the {} tier, nodes hold {}",
           tiers_.bytes(static_cast<Tier>(t)), tier_name(static_cast<Tier>(t)), bytes[t]);
  if (tiers_.disk() && tiers_.disk()->n_files() != on_disk)
    fail(ErrorKind::Internal, "the disk tier holds {} files, the index {} nodes on disk",
         tiers_.disk()->n_files(), on_disk);
}

}  // namespace depcache

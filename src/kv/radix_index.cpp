#include "kv/radix_index.h"

#include <algorithm>
#include <cmath>

#include "kv/span_record.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache {
namespace {
constexpr int kHot = static_cast<int>(Tier::Hot);
constexpr int kRemote = static_cast<int>(Tier::Remote);
}  // namespace

RadixIndex::RadixIndex(size_t byte_budget, std::unique_ptr<ReplacementPolicy> policy)
    : tiers_(byte_budget), policy_(policy ? std::move(policy) : make_policy("lru")) {}

RadixIndex::~RadixIndex() = default;

void RadixIndex::attach_host(size_t byte_budget, bool swap_out_once) {
  auto lk = lock();
  tiers_.attach_host(byte_budget, swap_out_once);
}

void RadixIndex::attach_remote(RemoteStore& store, int64_t block_tokens, std::shared_ptr<const MacKey> key) {
  attach_remote(std::shared_ptr<RemoteStore>(&store, [](RemoteStore*) {}), block_tokens, std::move(key));
}

void RadixIndex::attach_remote(std::shared_ptr<RemoteStore> store, int64_t block_tokens,
                               std::shared_ptr<const MacKey> key) {
  auto lk = lock();
  remote_ = std::make_shared<RemoteBlocks>(std::move(store), block_tokens, std::move(key));
}

void RadixIndex::set_observer(std::shared_ptr<IndexObserver> observer) {
  auto lk = lock();
  observer_ = std::move(observer);
  // What the index already holds (adopted from disk, say) is news to it.
  if (observer_)
    for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id)
      if (nodes_[id].live && nodes_[id].parent >= 0 && !nodes_[id].detached)
        observer_->stored(nodes_[id].ns, path_tokens(id), nodes_[id].start);
}

void RadixIndex::detach_remote() {
  std::shared_ptr<RemoteBlocks> remote;
  {
    auto lk = lock();
    remote = std::move(remote_);
  }
  // Draining the queue waits on the store: without the lock. A fetch still
  // running holds its own reference and finishes first.
  if (remote) remote->flush();
}

void RadixIndex::flush_remote() {
  std::shared_ptr<RemoteBlocks> remote;
  {
    auto lk = lock();
    remote = remote_;
  }
  if (remote) remote->flush();
}

void RadixIndex::expect_span_shape(const SpanShape& shape) {
  auto lk = lock();
  shape_ = shape;
  if (tiers_.disk()) tiers_.disk()->set_shape(shape);
}

const RadixIndex::Stats& RadixIndex::stats() const {
  auto lk = lock();
  if (const DiskSpanStore* disk = tiers_.disk())
    for (int r = 0; r < kRejectReasons; ++r) stats_.rejected[kRejectDisk][r] = disk->n_rejected(r);
  stats_.rejected[kRejectDisk][reject_index(RecordStatus::Mac)] += disk_layer_rejects_;
  stats_.disk_write_failures = disk_write_failures_ + (tiers_.disk() ? tiers_.disk()->n_write_failures() : 0);
  return stats_;
}

void RadixIndex::set_cost_model(std::function<double(int64_t, int64_t)> cost) {
  auto lk = lock();
  cost_model_ = std::move(cost);
}

double RadixIndex::cost_per_token(int64_t cached, int64_t fresh, double measured) const {
  auto lk = lock();
  if (!cost_model_ || fresh <= 0) return measured;
  return cost_model_(cached, fresh) / static_cast<double>(fresh);
}

void RadixIndex::attach_disk(DiskSpanStore& store) {
  auto lk = lock();
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
      const Match m = peek_locked(f.ns, all.first(static_cast<size_t>(f.prefix)));
      // The context must end exactly at a node's end, and the slot must be free.
      const bool at_node_end =
          m.length == f.prefix &&
          (m.pieces.empty() ||
           m.pieces.back().length == static_cast<int64_t>(nodes_[m.pieces.back().node].tokens.size()));
      if (at_node_end) {
        const NodeId parent = m.pieces.empty() ? root(f.ns) : m.pieces.back().node;
        if (!nodes_[parent].children.count(f.tokens[f.prefix])) {
          const NodeId id = new_node();
          Node& node = nodes_[id];
          node.tokens.assign(f.tokens.begin() + f.prefix, f.tokens.end());
          node.ns = f.ns;
          node.start = f.prefix;
          node.parent = parent;
          node.slot.n_tokens = static_cast<int64_t>(node.tokens.size());
          node.slot.tier = Tier::Disk;
          node.slot.disk_key = f.key;
          node.slot.disk_bytes = store.file_bytes_of(f.key);
          node.hits = 1;
          node.last_used = clock_;
          nodes_[parent].children.emplace(node.tokens.front(), id);
          tiers_.add(node.slot);
          policy_->on_insert(id, 1.0, f.key);
          policy_->on_tier_change(id, Tier::Disk);
          if (observer_) observer_->stored(f.ns, all, f.prefix);
          touch(id);
          touch(parent);
          adopted = true;
        }
      }
    }
    if (!adopted) store.remove(f.key);
  }
  make_room(Tier::Disk);
}

RadixIndex::NodeId RadixIndex::new_node() {
  NodeId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
    nodes_[id] = Node{};
  } else {
    id = static_cast<NodeId>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[id].live = true;
  ++n_live_;
  return id;
}

RadixIndex::NodeId RadixIndex::root(uint64_t ns) {
  const auto it = roots_.find(ns);
  if (it != roots_.end()) return it->second;
  const NodeId id = new_node();
  nodes_[id].ns = ns;
  roots_.emplace(ns, id);
  return id;
}

void RadixIndex::untouch(NodeId id) {
  Node& n = nodes_[id];
  if (n.keyed) candidates_[static_cast<int>(n.slot.tier)].erase(n.key);
  n.keyed = false;
}

void RadixIndex::touch(NodeId id) {
  untouch(id);
  Node& n = nodes_[id];
  if (!n.live || n.parent < 0 || n.pins > 0) return;
  for (const auto& [tok, child] : n.children)
    if (tier(child) == n.slot.tier) return;
  n.key = {policy_->priority({id, static_cast<int64_t>(n.tokens.size()), n.hits, n.last_used, n.slot.tier}),
           n.last_used, id};
  n.keyed = candidates_[static_cast<int>(n.slot.tier)].insert(n.key).second;
}

void RadixIndex::set_lookahead(std::unordered_map<int32_t, double> weights) {
  auto lk = lock();
  std::vector<NodeId> nodes;
  for (const auto& [id, w] : weights) nodes.push_back(id);
  policy_->set_lookahead(std::move(weights));
  for (NodeId id : lookahead_nodes_)
    if (id < static_cast<NodeId>(nodes_.size())) touch(id);
  for (NodeId id : nodes)
    if (id < static_cast<NodeId>(nodes_.size())) touch(id);
  lookahead_nodes_ = std::move(nodes);
}

void RadixIndex::set_fix_overhead(const Match& m, double cfo) {
  auto lk = lock();
  for (const Piece& p : m.pieces) {
    policy_->set_fix_overhead(p.node, cfo);
    touch(p.node);
  }
}

void RadixIndex::rekey_all() {
  for (auto& c : candidates_) c.clear();
  for (Node& n : nodes_) n.keyed = false;
  for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id) touch(id);
  keys_dirty_ = false;
}

size_t RadixIndex::n_pinned() const {
  auto lk = lock();
  size_t n = 0;
  for (const Node& node : nodes_) n += node.live && node.pins > 0;
  return n;
}

size_t RadixIndex::n_nodes(Tier t) const {
  auto lk = lock();
  size_t n = 0;
  for (const Node& node : nodes_) n += node.live && node.parent >= 0 && node.slot.tier == t;
  return n;
}

std::vector<int32_t> RadixIndex::path_tokens(NodeId id) const {
  std::vector<NodeId> chain;
  for (NodeId at = id; nodes_[at].parent >= 0; at = nodes_[at].parent) chain.push_back(at);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(nodes_[id].start) + nodes_[id].tokens.size());
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    out.insert(out.end(), nodes_[*it].tokens.begin(), nodes_[*it].tokens.end());
  return out;
}

RadixIndex::Match RadixIndex::peek(uint64_t ns, std::span<const int32_t> tokens) const {
  auto lk = lock();
  return peek_locked(ns, tokens);
}

RadixIndex::Match RadixIndex::peek_locked(uint64_t ns, std::span<const int32_t> tokens,
                                          bool as_fetched) const {
  Match m;
  const auto r = roots_.find(ns);
  if (r == roots_.end()) return m;
  NodeId at = r->second;
  while (m.length < static_cast<int64_t>(tokens.size())) {
    const auto c = nodes_[at].children.find(tokens[m.length]);
    if (c == nodes_[at].children.end()) break;
    const Node& child = nodes_[c->second];
    int64_t k = 0;
    const auto rest = static_cast<int64_t>(tokens.size()) - m.length;
    const auto edge = static_cast<int64_t>(child.tokens.size());
    while (k < edge && k < rest && child.tokens[k] == tokens[m.length + k]) ++k;
    m.pieces.push_back({c->second, 0, k});
    m.tokens_from[static_cast<int>(found_tier(c->second, as_fetched))] += k;
    m.length += k;
    if (k < edge) break;
    at = c->second;
  }
  return m;
}

bool RadixIndex::retier(NodeId id, const std::function<bool(SpanSlot&)>& move) {
  untouch(id);
  const bool moved = move(nodes_[id].slot);
  if (moved) policy_->on_tier_change(id, tier(id));
  if (tier(id) != Tier::Hot) nodes_[id].fetched_from = Tier::Hot;  // moved down before a match used it
  touch(id);
  touch(nodes_[id].parent);  // it may have lost or gained a child in its tier
  return moved;
}

void RadixIndex::set_tier(NodeId id, Tier t, const std::function<void(SpanSlot&)>& change) {
  retier(id, [&](SpanSlot& slot) {
    tiers_.set_tier(slot, t, change);
    return true;
  });
}

bool RadixIndex::promote(NodeId id) {
  if (tier(id) == Tier::Hot) return true;
  const Node& n = nodes_[id];
  const std::vector<int32_t> path = path_tokens(id);
  return retier(
      id, [&](SpanSlot& slot) { return tiers_.promote(slot, n.ns, path, n.start, &stats_.promoted_bytes); });
}

int RadixIndex::preload_layers(int n_layer, size_t disk_bytes, int64_t cached, int64_t fresh) const {
  if (layer_preload_.mode == LayerPreload::Mode::Fixed) return layer_preload_.depth;
  const double compute_ms = cost_model_ && fresh > 0 ? cost_model_(cached, fresh)
                                                     : static_cast<double>(fresh) * prefill_ms_per_token_;
  if (!(read_bytes_per_ms_ > 0) || !(compute_ms > 0)) return n_layer;  // unknown (or NaN)
  const double load_ms = static_cast<double>(disk_bytes) / read_bytes_per_ms_;
  return preload_depth(n_layer, load_ms / n_layer, compute_ms / n_layer);
}

void RadixIndex::cut(Match& m, const std::vector<Tier>& found, size_t i) {
  for (size_t j = i; j < m.pieces.size(); ++j) {
    const Piece& p = m.pieces[j];
    --nodes_[p.node].pins;
    touch(p.node);
    m.tokens_from[static_cast<int>(found[j])] -= p.length;
    m.length -= p.length;
  }
  m.pieces.resize(i);
  if (m.loading.size() > i) m.loading.resize(i);
}

void RadixIndex::drop_rest(Match& m, const std::vector<Tier>& found, size_t i) {
  const NodeId bad = m.pieces[i].node;
  ++stats_.dropped_bad;
  cut(m, found, i);  // the rest of the match hangs below it
  drop_subtree(bad);
}

bool RadixIndex::promote_match(Match& m, const std::vector<Tier>& found, int64_t fresh, uint64_t request_tick,
                               bool disk, bool* unlocked) {
  const bool layered = layer_preload_.mode != LayerPreload::Mode::Off;
  size_t disk_bytes = 0;  // what the layered loads of this match read in all
  for (const Piece& p : m.pieces)
    if (tier(p.node) == Tier::Disk) disk_bytes += nodes_[p.node].slot.disk_bytes;
  const auto depth = [&](int n_layer) { return preload_layers(n_layer, disk_bytes, m.length, fresh); };
  // Whole reads of disk files, done below with the lock released when this
  // call holds it alone (under a caller's lock they are done at once).
  struct Read {
    size_t piece;
    DiskSpanStore::LayerReader reader;
    bool ok = false;
  };
  std::vector<Read> reads;
  const bool unlock = mu_.depth() == 1;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const NodeId id = m.pieces[i].node;
    if (tier(id) == Tier::Hot) continue;
    const Node& n = nodes_[id];
    if (!disk && tier(id) == Tier::Disk && !n.slot.is_virtual()) {
      cut(m, found, i);
      return false;
    }
    if (layered && fresh >= 0 && tier(id) == Tier::Disk && !n.slot.is_virtual()) {
      m.loading.resize(m.pieces.size());
      if (const auto f = in_flight_.find(id);
          f != in_flight_.end() && request_tick > 0 && f->second.request_tick == request_tick) {
        if (auto loader = f->second.loader.lock(); loader && loader->key() == n.slot.disk_key) {
          // Read already for an earlier run of this request: as a whole load
          // would have left it, it counts as found in memory.
          m.loading[i] = std::move(loader);
          m.tokens_from[static_cast<int>(found[i])] -= m.pieces[i].length;
          m.tokens_from[kHot] += m.pieces[i].length;
          continue;
        }
      }
      if (auto loader = tiers_.start_layered(n.slot, n.ns, path_tokens(id), n.start, depth)) {
        in_flight_[id] = {request_tick, loader};
        m.loading[i] = std::move(loader);
        continue;
      }
    } else if (unlock && tier(id) == Tier::Disk && !n.slot.is_virtual()) {
      if (auto reader = tiers_.open_disk(n.slot, n.ns, path_tokens(id), n.start)) {
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
    const SpanSlot& slot = nodes_[id].slot;
    // Another thread may have moved or dropped the node meanwhile: then
    // nothing is adopted, and load() takes the match again.
    const bool same = is_live(id) && slot.tier == Tier::Disk && slot.disk_key == r.reader.key();
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

RadixIndex::Match RadixIndex::load(uint64_t ns, std::span<const int32_t> tokens, int64_t fresh,
                                   uint64_t request_tick, bool remote, bool disk) {
  const bool counted = fresh >= 0;             // a match; else a prefetch
  Match m = peek_locked(ns, tokens, counted);  // tokens_from: the tiers as found
  std::vector<Tier> found;
  for (const Piece& p : m.pieces) found.push_back(found_tier(p.node, counted));
  // Hold what is matched while lower tiers and the remote store are read:
  // bringing one node in must not push another out.
  pin(m);
  bool unlocked = false;
  const bool whole = promote_match(m, found, fresh, request_tick, disk, &unlocked);
  if (!counted)  // a prefetch: what it moved is reported by the tier it came from
    for (size_t i = 0; i < m.pieces.size(); ++i)
      if (found[i] != Tier::Hot && tier(m.pieces[i].node) == Tier::Hot)
        nodes_[m.pieces[i].node].fetched_from = found[i];
  const Match held = m;
  const int64_t local = m.length;
  int64_t total = local;
  if (whole && remote && remote_ && m.length < static_cast<int64_t>(tokens.size()))
    total = fetch_remote(ns, tokens, local, &unlocked, !counted);
  if (total > local || unlocked) {
    int64_t from[kTiers];
    std::copy(std::begin(m.tokens_from), std::end(m.tokens_from), from);
    // Inserting the remote blocks walked the match and so read any piece
    // still loading whole (insert hangs new nodes below hot ones only);
    // with the lock released, other threads may have split its nodes. So
    // the match is taken again; a loader carries over to a piece that is
    // still the node it was reading, still on disk.
    std::vector<std::pair<NodeId, std::shared_ptr<LayerLoader>>> loaders;
    for (size_t i = 0; i < m.loading.size(); ++i)
      if (m.loading[i]) loaders.emplace_back(m.pieces[i].node, m.loading[i]);
    m = peek_locked(ns, tokens.first(static_cast<size_t>(total)));
    for (size_t i = 0; i < m.pieces.size() && !loaders.empty(); ++i)
      for (const auto& [node, loader] : loaders)
        if (node == m.pieces[i].node && tier(node) == Tier::Disk &&
            nodes_[node].slot.disk_key == loader->key()) {
          m.loading.resize(m.pieces.size());
          m.loading[i] = loader;
        }
    // A piece neither in memory nor loading cannot be served: the match
    // ends before it (a node another thread moved down meanwhile).
    for (size_t i = 0; i < m.pieces.size(); ++i)
      if (tier(m.pieces[i].node) != Tier::Hot && (m.loading.size() <= i || !m.loading[i])) {
        for (size_t j = i; j < m.pieces.size(); ++j) m.length -= m.pieces[j].length;
        m.pieces.resize(i);
        if (m.loading.size() > i) m.loading.resize(i);
        break;
      }
    std::copy(std::begin(from), std::end(from), m.tokens_from);
    m.tokens_from[kRemote] += std::max<int64_t>(0, m.length - local);
    // Shorter than found: the tokens lost come off the slowest tiers first
    // (the last pieces of a match are the ones in the slowest tiers).
    for (int64_t lost = std::max<int64_t>(0, local - m.length), t = kTiers - 1; lost > 0 && t >= 0; --t) {
      const int64_t take = std::min(lost, m.tokens_from[t]);
      m.tokens_from[t] -= take;
      lost -= take;
    }
  }
  // Back to the budget, keeping what this match brought in.
  pin(m);
  unpin_locked(held, false);  // splits keep pins on the same node ids
  make_room(Tier::Hot);
  unpin_locked(m, false);
  return m;
}

bool RadixIndex::adopt_loaded(NodeId id, LayerLoader& loader) {
  KvSpan span = loader.take();  // waits for the last layers: outside the lock
  auto lk = lock();
  if (span.n_tokens() == 0) return false;
  ++stats_.layered_loads;
  stats_.layer_wait_ms += loader.waited_ms();
  if (loader.read_ms() > 0 && loader.bytes() > 0) {
    // A running rate, so one slow read (a cold page cache) does not set it.
    const double rate = static_cast<double>(loader.bytes()) / loader.read_ms();
    read_bytes_per_ms_ = read_bytes_per_ms_ > 0 ? 0.75 * read_bytes_per_ms_ + 0.25 * rate : rate;
  }
  if (!is_live(id)) return false;
  in_flight_.erase(id);
  return retier(id, [&](SpanSlot& slot) {
    return tiers_.adopt(slot, loader.key(), std::move(span), &stats_.promoted_bytes);
  });
}

bool RadixIndex::drop_bad_load(NodeId id, uint64_t disk_key) {
  auto lk = lock();
  if (!is_live(id)) return false;
  const SpanSlot& slot = nodes_[id].slot;
  if (slot.tier != Tier::Disk || slot.disk_key != disk_key) return false;
  ++stats_.dropped_bad;
  ++disk_layer_rejects_;  // a layer failed its tag (or could not be read)
  drop_subtree(id);
  return true;
}

void RadixIndex::note_prefill(double ms_per_token) {
  if (!(ms_per_token > 0) || !std::isfinite(ms_per_token)) return;
  auto lk = lock();
  prefill_ms_per_token_ =
      prefill_ms_per_token_ > 0 ? 0.75 * prefill_ms_per_token_ + 0.25 * ms_per_token : ms_per_token;
}

uint64_t RadixIndex::begin_request() {
  auto lk = lock();
  return ++clock_;
}

RadixIndex::Match RadixIndex::match(uint64_t ns, std::span<const int32_t> tokens, uint64_t request_tick,
                                    int64_t fresh_tokens, bool remote) {
  auto lk = lock();
  const auto t0 = Clock::now();
  Match m = load(ns, tokens, std::max<int64_t>(fresh_tokens, 0), request_tick, remote, true);
  const uint64_t tick = request_tick > 0 ? request_tick : ++clock_;
  for (const Piece& p : m.pieces) {
    Node& n = nodes_[p.node];
    n.fetched_from = Tier::Hot;                             // reported now
    if (n.last_used == tick && request_tick > 0) continue;  // this request counted it already
    n.last_used = tick;
    ++n.hits;
    policy_->on_access(p.node);
    touch(p.node);
  }
  for (int t = 0; t < kTiers; ++t) stats_.hit_tokens[t] += m.tokens_from[t];
  m.load_ms = ms_since(t0);
  stats_.load_ms += m.load_ms;
  return m;
}

int64_t RadixIndex::prefetch(uint64_t ns, std::span<const int32_t> tokens, bool disk) {
  auto lk = lock();
  const auto t0 = Clock::now();
  const Match m = load(ns, tokens, -1, 0, true, disk);
  stats_.load_ms += ms_since(t0);
  return m.length - m.tokens_from[kHot];
}

bool RadixIndex::all_hot(uint64_t ns, std::span<const int32_t> tokens) const {
  auto lk = lock();
  const Match m = peek_locked(ns, tokens);
  return std::all_of(m.pieces.begin(), m.pieces.end(),
                     [&](const Piece& p) { return tier(p.node) == Tier::Hot; });
}

bool RadixIndex::has_io_tiers() const {
  auto lk = lock();
  return tiers_.disk() || remote_;
}

int64_t RadixIndex::fetch_remote(uint64_t ns, std::span<const int32_t> tokens, int64_t length, bool* unlocked,
                                 bool mark) {
  const std::shared_ptr<RemoteBlocks> remote = remote_;
  const std::optional<SpanShape> shape = shape_;
  RemoteBlocks::Fetched got;
  const bool unlock = mu_.depth() == 1;
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
    stats_.rejected[kRejectRemote][r] += got.rejected[r];
    stats_.dropped_bad += got.rejected[r];
  }
  std::vector<Match> held;  // each block stays pinned until all are in
  for (const RemoteBlocks::Block& block : got.blocks) {
    // The block hangs below its context, which must be in the tree and hot
    // (the tree may have changed while the lock was released).
    const Match context = peek_locked(ns, tokens.first(static_cast<size_t>(block.b0)));
    if (context.length < block.b0) break;
    bool context_ok = true;
    for (const Piece& p : context.pieces)
      if (tier(p.node) != Tier::Hot && !promote(p.node)) {
        ++stats_.dropped_bad;
        drop_subtree(p.node);
        context_ok = false;
        break;
      }
    if (!context_ok) break;
    const SpanMaker from_block = [&](int64_t begin, int64_t end) {
      if (begin < block.b0 || end > block.b1)
        fail(ErrorKind::Internal, "remote block [{}, {}) asked for [{}, {})", block.b0, block.b1, begin, end);
      return block.span.slice(begin - block.b0, end - block.b0);
    };
    Match path;
    insert_impl(ns, tokens.first(static_cast<size_t>(block.b1)), &from_block, 0, 1.0, &path,
                /*publish=*/false);
    if (path.length < block.b1) break;  // larger than the hot tier
    if (mark)
      for (const Piece& p : path.pieces)
        if (nodes_[p.node].start >= length) nodes_[p.node].fetched_from = Tier::Remote;
    pin(path);
    held.push_back(std::move(path));
    length = block.b1;
    stats_.unlocked_remote_blocks += unlock;
  }
  for (const Match& m : held) unpin_locked(m, false);
  return length;
}

RadixIndex::NodeId RadixIndex::split(NodeId node, int64_t at) {
  const NodeId head = new_node();  // may reallocate nodes_: index, do not hold references
  Node& n = nodes_[node];
  Node& h = nodes_[head];
  h.tokens.assign(n.tokens.begin(), n.tokens.begin() + at);
  h.slot = n.slot.take_front(at);
  h.ns = n.ns;
  h.start = n.start;
  h.parent = n.parent;
  h.last_used = n.last_used;
  h.hits = n.hits;
  h.fetched_from = n.fetched_from;
  // Pins stay on the tail: the head is its ancestor, and no ancestor of a
  // live node is ever a leaf, so the head cannot be evicted before the tail.
  nodes_[n.parent].children[h.tokens.front()] = head;
  n.tokens.erase(n.tokens.begin(), n.tokens.begin() + at);
  n.start += at;
  n.parent = head;
  h.children.emplace(n.tokens.front(), node);
  const std::vector<int32_t> head_path = path_tokens(head);
  policy_->on_split(head, node, span_content_key(h.ns, head_path));
  if (observer_) observer_->split(h.ns, head_path);
  lookahead_nodes_.push_back(head);  // it may have inherited a lookahead weight
  touch(node);                       // fewer tokens
  touch(head);                       // a child in its tier: not a candidate
  return head;                       // bytes are unchanged: the tokens moved, none were added
}

int64_t RadixIndex::insert(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker& make_span,
                           double cost_per_token, Match* path) {
  auto lk = lock();
  // Unset, the shape is what this process computes: learned from its first span.
  const SpanMaker learning = [&](int64_t begin, int64_t end) {
    KvSpan span = make_span(begin, end);
    if (!shape_ && span.n_layer() > 0) expect_span_shape({span.n_layer(), span.row_elems(), span.type()});
    return span;
  };
  return insert_impl(ns, tokens, shape_ ? &make_span : &learning, 0, cost_per_token, path, true);
}

int64_t RadixIndex::insert_virtual(uint64_t ns, std::span<const int32_t> tokens, size_t bytes_per_token,
                                   double cost_per_token, Match* path) {
  auto lk = lock();
  return insert_impl(ns, tokens, nullptr, bytes_per_token, cost_per_token, path, false);
}

int64_t RadixIndex::insert_impl(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                                size_t virtual_bytes_per_token, double cost_per_token, Match* path,
                                bool publish) {
  int64_t from = 0;
  const int64_t added = insert_path(ns, tokens, make_span, virtual_bytes_per_token, cost_per_token, &from);
  if (publish && remote_ && make_span && added > 0)
    stats_.remote_published += remote_->publish(ns, tokens, from, *make_span);
  if (path) *path = peek_locked(ns, tokens);
  return added;
}

int64_t RadixIndex::insert_path(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                                size_t virtual_bytes_per_token, double cost_per_token, int64_t* new_from) {
  const auto n = static_cast<int64_t>(tokens.size());
  *new_from = n;
  // The span of the new tokens [tail_from, n), made and sized before the
  // tree changes: a refused insert leaves it as it was (a split made first
  // would leave a match its caller holds naming the split's tail).
  KvSpan span;
  size_t bytes_per_token = virtual_bytes_per_token;
  int64_t tail_from = -1;  // where `span` starts (-1: not made)
  const auto make_tail = [&](int64_t from) {
    tail_from = from;
    const int64_t added = n - from;
    if (make_span) {
      span = (*make_span)(from, n);
      if (span.n_tokens() != added)
        fail(ErrorKind::Internal, "radix insert: span of {} tokens for {} new ones", span.n_tokens(), added);
      bytes_per_token = span.bytes() / static_cast<size_t>(added);
    }
    if (bytes_per_token * static_cast<size_t>(added) <= tiers_.budget(Tier::Hot)) return true;
    ++stats_.oversized[kHot];  // could never fit
    return false;
  };
  if (const int64_t found = peek_locked(ns, tokens).length; found < n && !make_tail(found)) return 0;
  ++clock_;
  NodeId at = root(ns);
  nodes_[at].last_used = clock_;
  int64_t pos = 0;
  while (pos < n) {
    auto c = nodes_[at].children.find(tokens[pos]);
    // A new leaf hangs below hot nodes only; a walked node whose disk file
    // is bad goes (with what hangs below it) and the tokens count as new.
    if (c != nodes_[at].children.end() && tier(c->second) != Tier::Hot && !promote(c->second)) {
      ++stats_.dropped_bad;
      drop_subtree(c->second);
      c = nodes_[at].children.end();
    }
    if (c == nodes_[at].children.end()) {
      // Starting earlier than found: a bad file was dropped on the way.
      if (tail_from != pos && !make_tail(pos)) break;
      const int64_t added = n - pos;
      const NodeId leaf = new_node();
      Node& l = nodes_[leaf];
      l.tokens.assign(tokens.begin() + pos, tokens.end());
      l.slot.span = std::move(span);
      l.slot.n_tokens = added;
      l.slot.bytes_per_token = bytes_per_token;
      l.ns = ns;
      l.start = pos;
      l.parent = at;
      l.last_used = clock_;
      l.hits = 1;
      tiers_.add(l.slot);
      nodes_[at].children.emplace(tokens[pos], leaf);
      policy_->on_insert(leaf, cost_per_token, span_content_key(ns, tokens));
      if (observer_) observer_->stored(ns, tokens, pos);
      touch(leaf);
      touch(at);  // no longer a leaf of its tier
      *new_from = pos;
      // Keep the new leaf through this eviction: it is what the caller wants cached.
      ++nodes_[leaf].pins;
      untouch(leaf);
      make_room(Tier::Hot);
      --nodes_[leaf].pins;
      touch(leaf);
      return added;
    }
    NodeId child = c->second;
    const auto edge = static_cast<int64_t>(nodes_[child].tokens.size());
    int64_t k = 0;
    while (k < edge && pos + k < n && nodes_[child].tokens[k] == tokens[pos + k]) ++k;
    if (k < edge) child = split(child, k);
    nodes_[child].last_used = clock_;
    touch(child);
    pos += k;
    at = child;
  }
  make_room(Tier::Hot);
  return 0;
}

void RadixIndex::pin(const Match& m) {
  auto lk = lock();
  for (const Piece& p : m.pieces) {
    ++nodes_[p.node].pins;
    untouch(p.node);
  }
}

void RadixIndex::unpin(const Match& m) {
  auto lk = lock();
  unpin_locked(m, true);
}

void RadixIndex::unpin_locked(const Match& m, bool evict) {
  for (const Piece& p : m.pieces) {
    if (nodes_[p.node].pins <= 0) fail(ErrorKind::Internal, "radix index: unpin of an unpinned node");
    if (--nodes_[p.node].pins > 0) continue;
    if (nodes_[p.node].detached) {
      nodes_[p.node] = Node{};
      free_.push_back(p.node);
    } else {
      touch(p.node);
    }
  }
  if (evict) make_room(Tier::Hot);  // what pins held above the budget can go now
}

void RadixIndex::remove_leaf(NodeId id) {
  if (observer_) observer_->removed(nodes_[id].ns, path_tokens(id), nodes_[id].start);
  untouch(id);
  in_flight_.erase(id);
  policy_->on_remove(id);
  Node& n = nodes_[id];
  const NodeId parent = n.parent;
  nodes_[parent].children.erase(n.tokens.front());
  tiers_.remove(n.slot);
  if (n.pins > 0) {
    // Another request's match still names it: its id stays taken (and out
    // of the tree) until that match is unpinned.
    const int32_t pins = n.pins;
    n = Node{};
    n.pins = pins;
    n.detached = true;
  } else {
    n = Node{};
    free_.push_back(id);
  }
  --n_live_;
  ++n_evicted_;
  touch(parent);  // it may be a leaf of its tier now
}

void RadixIndex::drop_subtree(NodeId id) {
  std::vector<NodeId> order = {id};
  for (size_t i = 0; i < order.size(); ++i)
    for (const auto& [tok, child] : nodes_[order[i]].children) order.push_back(child);
  for (auto it = order.rbegin(); it != order.rend(); ++it) remove_leaf(*it);  // children first
}

void RadixIndex::evict_to(size_t target) {
  auto lk = lock();
  const size_t budget = tiers_.budget(Tier::Hot);
  tiers_.set_budget(Tier::Hot, std::min(budget, target));
  make_room(Tier::Hot);
  tiers_.set_budget(Tier::Hot, budget);
}

void RadixIndex::make_room(Tier t) {
  if (keys_dirty_) rekey_all();
  // Host copies of hot nodes go first: dropping one loses nothing cached.
  if (t == Tier::Host) drop_host_copies();
  auto& candidates = candidates_[static_cast<int>(t)];
  while (tiers_.over_budget(t)) {
    if (candidates.empty()) return;  // everything left is pinned
    const EvictKey lowest = *candidates.begin();
    policy_->on_evict(lowest.id, lowest.priority, t);
    ++stats_.demoted[static_cast<int>(t)];
    demote(lowest.id);
  }
}

void RadixIndex::demote(NodeId id) {
  const std::optional<Tier> to = tiers_.below(tier(id));
  if (!to) {
    drop_subtree(id);  // the last tier: a leaf (its children were in this tier or gone)
    return;
  }
  if (*to == Tier::Host) {
    swap_out(id);
    make_room(*to);
    return;
  }
  if (nodes_[id].slot.span.n_tokens() == 0) {  // virtual nodes only change tier
    set_tier(id, *to);
    make_room(*to);
    return;
  }
  // To disk.
  const std::vector<int32_t> path = path_tokens(id);
  const size_t need = tiers_.disk_file_bytes(nodes_[id].slot, static_cast<int64_t>(path.size()));
  // Room on disk first, by the policy (the store's own order would not know
  // which files the index still needs).
  const size_t budget = tiers_.budget(Tier::Disk);
  if (need <= budget) {
    tiers_.set_budget(Tier::Disk, budget - need);
    ++nodes_[id].pins;
    untouch(id);
    make_room(Tier::Disk);
    --nodes_[id].pins;
    touch(id);
    tiers_.set_budget(Tier::Disk, budget);
  }
  const Node& n = nodes_[id];
  const bool written = need <= budget && retier(id, [&](SpanSlot& slot) {
                         return tiers_.write_to_disk(slot, n.ns, path, n.start);
                       });
  if (!written) {
    ++(need <= budget ? disk_write_failures_ : stats_.oversized[static_cast<int>(Tier::Disk)]);
    drop_subtree(id);  // cannot go lower: out, with whatever hangs below
  }
}

void RadixIndex::swap_out(NodeId id) {
  const bool saved = nodes_[id].slot.has_host_copy;
  size_t copied = 0;
  retier(id, [&](SpanSlot& slot) {
    copied = tiers_.swap_out(slot);
    return true;
  });
  stats_.swapped_out_bytes += static_cast<int64_t>(copied);
  stats_.swap_outs_saved += saved;
}

void RadixIndex::drop_host_copies() {
  if (!tiers_.over_budget(Tier::Host)) return;
  // Lowest priority first (ties: the older node), ranked once: dropping a
  // copy changes no node's priority.
  std::vector<std::pair<double, NodeId>> copies;
  for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    if (!n.live || !n.slot.has_host_copy) continue;
    copies.emplace_back(
        policy_->priority({id, static_cast<int64_t>(n.tokens.size()), n.hits, n.last_used, n.slot.tier}), id);
  }
  std::sort(copies.begin(), copies.end());
  for (const auto& [priority, id] : copies) {
    if (!tiers_.over_budget(Tier::Host)) return;
    tiers_.drop_host_copy(nodes_[id].slot);
  }
}

void RadixIndex::persist() {
  auto lk = lock();
  if (!tiers_.disk()) return;
  // Deepest first, so children are on disk before their parents move.
  std::vector<std::pair<int64_t, NodeId>> order;
  for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    if (n.live && n.parent >= 0 && n.slot.tier != Tier::Disk && n.slot.span.n_tokens() > 0)
      order.emplace_back(n.start, id);
  }
  std::sort(order.begin(), order.end(), std::greater<>());
  for (const auto& [start, id] : order) {
    if (!nodes_[id].live || tier(id) == Tier::Disk) continue;
    nodes_[id].pins = 0;  // shutting down: nothing is in use
    if (tier(id) == Tier::Hot && tiers_.below(Tier::Hot) == Tier::Host) swap_out(id);
    demote(id);
  }
  tiers_.disk()->flush();  // written behind: on disk before the process goes
}

void RadixIndex::check_invariants() const {
  auto lk = lock();
  size_t bytes[kTiers] = {}, live = 0, on_disk = 0;
  for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    if (!n.live) continue;
    ++live;
    bytes[static_cast<int>(n.slot.tier)] += n.slot.tier_bytes();
    if (n.slot.has_host_copy) {
      if (n.slot.tier != Tier::Hot)
        fail(ErrorKind::Internal, "radix node {} outside the hot tier has a host copy", id);
      bytes[static_cast<int>(Tier::Host)] += n.slot.memory_bytes();
    }
    if (n.parent < 0) {
      if (!n.tokens.empty()) fail(ErrorKind::Internal, "radix root {} has tokens", id);
    } else {
      if (n.tokens.empty()) fail(ErrorKind::Internal, "radix node {} has no tokens", id);
      const Node& parent = nodes_[n.parent];
      if (parent.parent >= 0 && static_cast<int>(parent.slot.tier) > static_cast<int>(n.slot.tier))
        fail(ErrorKind::Internal, "radix node {} in tier {} under a parent in tier {}", id,
             tier_name(n.slot.tier), tier_name(parent.slot.tier));
      if (n.start != parent.start + static_cast<int64_t>(parent.tokens.size()))
        fail(ErrorKind::Internal, "radix node {} starts at {}, its parent ends at {}", id, n.start,
             parent.start + static_cast<int64_t>(parent.tokens.size()));
      const SpanSlot& slot = n.slot;
      if (slot.n_tokens != static_cast<int64_t>(n.tokens.size()))
        fail(ErrorKind::Internal, "radix node {}: {} tokens but a slot of {}", id, n.tokens.size(),
             slot.n_tokens);
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
      const auto it = parent.children.find(n.tokens.front());
      if (it == parent.children.end() || it->second != id)
        fail(ErrorKind::Internal, "radix node {} is not its parent's child", id);
    }
    for (const auto& [tok, child] : n.children)
      if (!nodes_[child].live || nodes_[child].parent != id || nodes_[child].tokens.front() != tok)
        fail(ErrorKind::Internal, "radix node {}: broken child link", id);
  }
  // The eviction candidates are exactly the live, unpinned non-roots with no
  // child in their tier, each under its current key.
  if (!keys_dirty_) {
    size_t keyed = 0;
    for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id) {
      const Node& n = nodes_[id];
      bool candidate = n.live && n.parent >= 0 && n.pins == 0;
      for (const auto& [tok, child] : n.children) candidate = candidate && tier(child) != n.slot.tier;
      if (candidate != n.keyed)
        fail(ErrorKind::Internal, "radix node {} is {}an eviction candidate but {}listed", id,
             candidate ? "" : "not ", n.keyed ? "" : "not ");
      if (!candidate) continue;
      ++keyed;
      const EvictKey key{
          policy_->priority({id, static_cast<int64_t>(n.tokens.size()), n.hits, n.last_used, n.slot.tier}),
          n.last_used, id};
      if (!(key == n.key) || !candidates_[static_cast<int>(n.slot.tier)].count(n.key))
        fail(ErrorKind::Internal, "radix node {} is listed under a stale eviction key", id);
    }
    size_t listed = 0;
    for (const auto& c : candidates_) listed += c.size();
    if (listed != keyed) fail(ErrorKind::Internal, "{} eviction candidates listed, {} exist", listed, keyed);
  }
  for (int t = 0; t < kRemote; ++t)
    if (bytes[t] != tiers_.bytes(static_cast<Tier>(t)))
      fail(ErrorKind::Internal, "radix index counts {} bytes in the {} tier, nodes hold {}",
           tiers_.bytes(static_cast<Tier>(t)), tier_name(static_cast<Tier>(t)), bytes[t]);
  if (tiers_.disk() && tiers_.disk()->n_files() != on_disk)
    fail(ErrorKind::Internal, "the disk tier holds {} files, the index {} nodes on disk",
         tiers_.disk()->n_files(), on_disk);
  if (live != n_live_) fail(ErrorKind::Internal, "radix index counts {} nodes, {} are live", n_live_, live);
}

}  // namespace depcache

#include "kv/radix_tree.h"

#include "kv/span_record.h"
#include "util/error.h"

namespace depcache {

RadixTree::RadixTree(std::unique_ptr<ReplacementPolicy> policy)
    : policy_(policy ? std::move(policy) : make_policy("lru")) {}

RadixTree::NodeId RadixTree::new_node() {
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

RadixTree::NodeId RadixTree::root(uint64_t ns) {
  const auto it = roots_.find(ns);
  if (it != roots_.end()) return it->second;
  const NodeId id = new_node();
  nodes_[id].ns = ns;
  roots_.emplace(ns, id);
  return id;
}

double RadixTree::priority(NodeId id) const {
  const Node& n = nodes_[id];
  return policy_->priority({id, static_cast<int64_t>(n.tokens.size()), n.hits, n.last_used, n.slot.tier});
}

RadixTree::EvictKey RadixTree::key_of(NodeId id) const { return {priority(id), nodes_[id].last_used, id}; }

void RadixTree::untouch(NodeId id) {
  Node& n = nodes_[id];
  if (n.keyed) candidates_[static_cast<int>(n.slot.tier)].erase(n.key);
  n.keyed = false;
}

void RadixTree::touch(NodeId id) {
  untouch(id);
  Node& n = nodes_[id];
  if (!n.live || n.parent < 0 || n.pins > 0) return;
  for (const auto& [tok, child] : n.children)
    if (tier(child) == n.slot.tier) return;
  n.key = key_of(id);
  n.keyed = candidates_[static_cast<int>(n.slot.tier)].insert(n.key).second;
}

void RadixTree::rekey_all() {
  for (auto& c : candidates_) c.clear();
  for (Node& n : nodes_) n.keyed = false;
  for (NodeId id = 0; id < end_id(); ++id) touch(id);
  keys_dirty_ = false;
}

const RadixTree::EvictKey* RadixTree::lowest(Tier t) {
  if (keys_dirty_) rekey_all();
  const auto& candidates = candidates_[static_cast<int>(t)];
  return candidates.empty() ? nullptr : &*candidates.begin();
}

void RadixTree::set_lookahead(std::unordered_map<int32_t, double> weights) {
  std::vector<NodeId> ids;
  for (const auto& [id, w] : weights) ids.push_back(id);
  policy_->set_lookahead(std::move(weights));
  for (NodeId id : lookahead_nodes_)
    if (id < end_id()) touch(id);
  for (NodeId id : ids)
    if (id < end_id()) touch(id);
  lookahead_nodes_ = std::move(ids);
}

void RadixTree::set_fix_overhead(const Match& m, double cfo) {
  for (const Piece& p : m.pieces) {
    policy_->set_fix_overhead(p.node, cfo);
    touch(p.node);
  }
}

void RadixTree::set_observer(std::shared_ptr<IndexObserver> observer) {
  observer_ = std::move(observer);
  // What the tree already holds (adopted from disk, say) is news to it.
  if (observer_)
    for (NodeId id = 0; id < end_id(); ++id)
      if (nodes_[id].live && nodes_[id].parent >= 0 && !nodes_[id].detached)
        observer_->stored(nodes_[id].ns, path_tokens(id), nodes_[id].start);
}

size_t RadixTree::n_pinned() const {
  size_t n = 0;
  for (const Node& node : nodes_) n += node.live && node.pins > 0;
  return n;
}

size_t RadixTree::n_nodes(Tier t) const {
  size_t n = 0;
  for (const Node& node : nodes_) n += node.live && node.parent >= 0 && node.slot.tier == t;
  return n;
}

std::vector<int32_t> RadixTree::path_tokens(NodeId id) const {
  std::vector<NodeId> chain;
  for (NodeId at = id; nodes_[at].parent >= 0; at = nodes_[at].parent) chain.push_back(at);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(nodes_[id].start) + nodes_[id].tokens.size());
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    out.insert(out.end(), nodes_[*it].tokens.begin(), nodes_[*it].tokens.end());
  return out;
}

std::vector<RadixTree::NodeId> RadixTree::subtree_children_first(NodeId id) const {
  std::vector<NodeId> order = {id};
  for (size_t i = 0; i < order.size(); ++i)
    for (const auto& [tok, child] : nodes_[order[i]].children) order.push_back(child);
  return {order.rbegin(), order.rend()};
}

RadixTree::Match RadixTree::peek(uint64_t ns, std::span<const int32_t> tokens, bool as_fetched) const {
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

RadixTree::NodeId RadixTree::add_leaf(NodeId parent, std::span<const int32_t> path, int64_t from,
                                      SpanSlot slot, double cost_per_token, uint64_t content_key) {
  const NodeId id = new_node();  // may reallocate nodes_: index, do not hold references
  Node& n = nodes_[id];
  n.tokens.assign(path.begin() + from, path.end());
  n.slot = std::move(slot);
  n.ns = nodes_[parent].ns;
  n.start = from;
  n.parent = parent;
  n.last_used = clock_;
  n.hits = 1;
  nodes_[parent].children.emplace(n.tokens.front(), id);
  policy_->on_insert(id, cost_per_token, content_key);
  if (n.slot.tier != Tier::Hot) policy_->on_tier_change(id, n.slot.tier);
  if (observer_) observer_->stored(n.ns, path, from);
  touch(id);
  touch(parent);  // no longer a leaf of its tier
  return id;
}

RadixTree::NodeId RadixTree::split(NodeId id, int64_t at) {
  const NodeId head = new_node();  // may reallocate nodes_: index, do not hold references
  Node& n = nodes_[id];
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
  h.children.emplace(n.tokens.front(), id);
  const std::vector<int32_t> head_path = path_tokens(head);
  policy_->on_split(head, id, span_content_key(h.ns, head_path));
  if (observer_) observer_->split(h.ns, head_path);
  lookahead_nodes_.push_back(head);  // it may have inherited a lookahead weight
  touch(id);                         // fewer tokens
  touch(head);                       // a child in its tier: not a candidate
  return head;
}

void RadixTree::remove_leaf(NodeId id) {
  if (observer_) observer_->removed(nodes_[id].ns, path_tokens(id), nodes_[id].start);
  untouch(id);
  policy_->on_remove(id);
  Node& n = nodes_[id];
  const NodeId parent = n.parent;
  nodes_[parent].children.erase(n.tokens.front());
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

void RadixTree::pin(NodeId id) {
  ++nodes_[id].pins;
  untouch(id);
}

void RadixTree::unpin(NodeId id) {
  Node& n = nodes_[id];
  if (n.pins <= 0) fail(ErrorKind::Internal, "radix index: unpin of an unpinned node");
  if (--n.pins > 0) return;
  if (n.detached) {
    n = Node{};
    free_.push_back(id);
  } else {
    touch(id);
  }
}

void RadixTree::pin(const Match& m) {
  for (const Piece& p : m.pieces) pin(p.node);
}

void RadixTree::unpin(const Match& m) {
  for (const Piece& p : m.pieces) unpin(p.node);
}

void RadixTree::count_access(const Match& m, uint64_t tick, bool same_request) {
  for (const Piece& p : m.pieces) {
    Node& n = nodes_[p.node];
    n.fetched_from = Tier::Hot;                         // reported now
    if (n.last_used == tick && same_request) continue;  // this request counted it already
    n.last_used = tick;
    ++n.hits;
    policy_->on_access(p.node);
    touch(p.node);
  }
}

void RadixTree::check_invariants() const {
  size_t live = 0;
  for (NodeId id = 0; id < end_id(); ++id) {
    const Node& n = nodes_[id];
    if (!n.live) continue;
    ++live;
    if (n.parent < 0) {
      if (!n.tokens.empty()) fail(ErrorKind::Internal, "radix root {} has tokens", id);
    } else {
      if (n.tokens.empty()) fail(ErrorKind::Internal, "radix node {} has no tokens", id);
      const Node& parent = nodes_[n.parent];
      if (n.start != parent.start + static_cast<int64_t>(parent.tokens.size()))
        fail(ErrorKind::Internal, "radix node {} starts at {}, its parent ends at {}", id, n.start,
             parent.start + static_cast<int64_t>(parent.tokens.size()));
      if (n.slot.n_tokens != static_cast<int64_t>(n.tokens.size()))
        fail(ErrorKind::Internal, "radix node {}: {} tokens but a slot of {}", id, n.tokens.size(),
             n.slot.n_tokens);
      const auto it = parent.children.find(n.tokens.front());
      if (it == parent.children.end() || it->second != id)
        fail(ErrorKind::Internal, "radix node {} is not its parent's child", id);
    }
    for (const auto& [tok, child] : n.children)
      if (!nodes_[child].live || nodes_[child].parent != id || nodes_[child].tokens.front() != tok)
        fail(ErrorKind::Internal, "radix node {}: broken child link", id);
  }
  if (live != n_live_) fail(ErrorKind::Internal, "radix index counts {} nodes, {} are live", n_live_, live);
  if (keys_dirty_) return;  // re-ranked before the next eviction
  // The candidates are exactly the live, unpinned non-roots with no child in
  // their tier, each under its current key.
  size_t keyed = 0;
  for (NodeId id = 0; id < end_id(); ++id) {
    const Node& n = nodes_[id];
    bool candidate = n.live && n.parent >= 0 && n.pins == 0;
    for (const auto& [tok, child] : n.children) candidate = candidate && tier(child) != n.slot.tier;
    if (candidate != n.keyed)
      fail(ErrorKind::Internal, "radix node {} is {}an eviction candidate but {}listed", id,
           candidate ? "" : "not ", n.keyed ? "" : "not ");
    if (!candidate) continue;
    ++keyed;
    if (!(key_of(id) == n.key) || !candidates_[static_cast<int>(n.slot.tier)].count(n.key))
      fail(ErrorKind::Internal, "radix node {} is listed under a stale eviction key", id);
  }
  size_t listed = 0;
  for (const auto& c : candidates_) listed += c.size();
  if (listed != keyed) fail(ErrorKind::Internal, "{} eviction candidates listed, {} exist", listed, keyed);
}

}  // namespace depcache

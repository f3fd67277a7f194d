#include "kv/radix_index.h"

#include <algorithm>

#include "util/error.h"

namespace depcache {

RadixIndex::RadixIndex(size_t byte_budget, std::unique_ptr<ReplacementPolicy> policy)
    : budget_(byte_budget), policy_(policy ? std::move(policy) : make_policy("lru")) {}

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
  roots_.emplace(ns, id);
  return id;
}

RadixIndex::Match RadixIndex::peek(uint64_t ns, std::span<const int32_t> tokens) const {
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
    m.length += k;
    if (k < edge) break;
    at = c->second;
  }
  return m;
}

RadixIndex::Match RadixIndex::match(uint64_t ns, std::span<const int32_t> tokens) {
  Match m = peek(ns, tokens);
  ++clock_;
  for (const Piece& p : m.pieces) {
    Node& n = nodes_[p.node];
    n.last_used = clock_;
    ++n.hits;
    policy_->on_access(p.node);
  }
  return m;
}

RadixIndex::NodeId RadixIndex::split(NodeId node, int64_t at) {
  const NodeId head = new_node();  // may reallocate nodes_: index, do not hold references
  Node& n = nodes_[node];
  Node& h = nodes_[head];
  h.tokens.assign(n.tokens.begin(), n.tokens.begin() + at);
  if (n.span.n_tokens() > 0) {
    h.span = n.span.slice(0, at);
    n.span = n.span.slice(at, n.span.n_tokens());
  }
  h.bytes_per_token = n.bytes_per_token;
  h.parent = n.parent;
  h.last_used = n.last_used;
  h.hits = n.hits;
  // Pins stay on the tail: the head is its ancestor, and no ancestor of a
  // live node is ever a leaf, so the head cannot be evicted before the tail.
  nodes_[n.parent].children[h.tokens.front()] = head;
  n.tokens.erase(n.tokens.begin(), n.tokens.begin() + at);
  n.parent = head;
  h.children.emplace(n.tokens.front(), node);
  policy_->on_split(head, node);
  return head;  // bytes are unchanged: the tokens moved, none were added
}

int64_t RadixIndex::insert(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker& make_span,
                           double cost_per_token, Match* path) {
  return insert_impl(ns, tokens, &make_span, 0, cost_per_token, path);
}

int64_t RadixIndex::insert_virtual(uint64_t ns, std::span<const int32_t> tokens, size_t bytes_per_token,
                                   double cost_per_token, Match* path) {
  return insert_impl(ns, tokens, nullptr, bytes_per_token, cost_per_token, path);
}

int64_t RadixIndex::insert_impl(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                                size_t virtual_bytes_per_token, double cost_per_token, Match* path) {
  const int64_t added = insert_path(ns, tokens, make_span, virtual_bytes_per_token, cost_per_token);
  if (path) *path = peek(ns, tokens);
  return added;
}

int64_t RadixIndex::insert_path(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker* make_span,
                                size_t virtual_bytes_per_token, double cost_per_token) {
  ++clock_;
  NodeId at = root(ns);
  nodes_[at].last_used = clock_;
  int64_t pos = 0;
  const auto n = static_cast<int64_t>(tokens.size());
  while (pos < n) {
    const auto c = nodes_[at].children.find(tokens[pos]);
    if (c == nodes_[at].children.end()) {
      const int64_t added = n - pos;
      KvSpan span;
      size_t bytes_per_token = virtual_bytes_per_token;
      if (make_span) {
        span = (*make_span)(pos, n);
        if (span.n_tokens() != added)
          fail(ErrorKind::Internal, "radix insert: span of {} tokens for {} new ones", span.n_tokens(),
               added);
        bytes_per_token = span.bytes() / static_cast<size_t>(added);
      }
      if (bytes_per_token * static_cast<size_t>(added) > budget_) break;  // could never fit
      const NodeId leaf = new_node();
      Node& l = nodes_[leaf];
      l.tokens.assign(tokens.begin() + pos, tokens.end());
      l.span = std::move(span);
      l.bytes_per_token = bytes_per_token;
      l.parent = at;
      l.last_used = clock_;
      l.hits = 1;
      bytes_ += node_bytes(l);
      nodes_[at].children.emplace(tokens[pos], leaf);
      policy_->on_insert(leaf, cost_per_token);
      // Keep the new leaf through this eviction: it is what the caller wants cached.
      ++nodes_[leaf].pins;
      evict_to(budget_);
      --nodes_[leaf].pins;
      return added;
    }
    NodeId child = c->second;
    const auto edge = static_cast<int64_t>(nodes_[child].tokens.size());
    int64_t k = 0;
    while (k < edge && pos + k < n && nodes_[child].tokens[k] == tokens[pos + k]) ++k;
    if (k < edge) child = split(child, k);
    nodes_[child].last_used = clock_;
    pos += k;
    at = child;
  }
  evict_to(budget_);
  return 0;
}

void RadixIndex::pin(const Match& m) {
  for (const Piece& p : m.pieces) ++nodes_[p.node].pins;
}

void RadixIndex::unpin(const Match& m) {
  for (const Piece& p : m.pieces) {
    if (nodes_[p.node].pins <= 0) fail(ErrorKind::Internal, "radix index: unpin of an unpinned node");
    --nodes_[p.node].pins;
  }
  evict_to(budget_);  // what pins held above the budget can go now
}

void RadixIndex::remove_leaf(NodeId id) {
  Node& n = nodes_[id];
  nodes_[n.parent].children.erase(n.tokens.front());
  bytes_ -= node_bytes(n);
  n = Node{};
  free_.push_back(id);
  --n_live_;
  ++n_evicted_;
}

void RadixIndex::evict_to(size_t target) {
  while (bytes_ > target) {
    // The evictable leaf the policy ranks lowest. A linear scan keeps this
    // simple and lets priorities depend on anything (clocks, lookahead).
    NodeId victim = -1;
    double lowest = 0;
    for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id) {
      const Node& n = nodes_[id];
      if (!n.live || n.parent < 0 || !n.children.empty() || n.pins > 0) continue;
      const double p =
          policy_->priority({id, static_cast<int64_t>(n.tokens.size()), n.hits, n.last_used, clock_});
      if (victim < 0 || p < lowest) victim = id, lowest = p;
    }
    if (victim < 0) return;  // everything left is pinned
    policy_->on_evict(victim, lowest);
    remove_leaf(victim);
  }
}

void RadixIndex::check_invariants() const {
  size_t bytes = 0, live = 0;
  for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    if (!n.live) continue;
    ++live;
    bytes += node_bytes(n);
    if (n.parent < 0) {
      if (!n.tokens.empty()) fail(ErrorKind::Internal, "radix root {} has tokens", id);
    } else {
      if (n.tokens.empty()) fail(ErrorKind::Internal, "radix node {} has no tokens", id);
      if (n.span.n_tokens() != 0 && n.span.n_tokens() != static_cast<int64_t>(n.tokens.size()))
        fail(ErrorKind::Internal, "radix node {}: {} tokens but a span of {}", id, n.tokens.size(),
             n.span.n_tokens());
      if (n.span.n_tokens() != 0 && n.span.bytes() != node_bytes(n))
        fail(ErrorKind::Internal, "radix node {}: span of {} bytes counted as {}", id, n.span.bytes(),
             node_bytes(n));
      const auto it = nodes_[n.parent].children.find(n.tokens.front());
      if (it == nodes_[n.parent].children.end() || it->second != id)
        fail(ErrorKind::Internal, "radix node {} is not its parent's child", id);
    }
    for (const auto& [tok, child] : n.children)
      if (!nodes_[child].live || nodes_[child].parent != id || nodes_[child].tokens.front() != tok)
        fail(ErrorKind::Internal, "radix node {}: broken child link", id);
  }
  if (bytes != bytes_) fail(ErrorKind::Internal, "radix index counts {} bytes, nodes hold {}", bytes_, bytes);
  if (live != n_live_) fail(ErrorKind::Internal, "radix index counts {} nodes, {} are live", n_live_, live);
}

}  // namespace depcache

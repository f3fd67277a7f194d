#include "prompt/dep_prompt.h"

#include <algorithm>
#include <unordered_map>

#include "util/error.h"

namespace depcache {

namespace {
// Token indices are int32; refuse a prompt that would overflow them.
void check_room(size_t have, size_t more, const std::string& label) {
  if (more > static_cast<size_t>(INT32_MAX) - have)
    fail(ErrorKind::LimitExceeded, "segment '{}': prompt would exceed {} tokens", label, INT32_MAX);
}

// A tree placed after a linear segment that saw an earlier tree would
// depend on that tree through the linear segment's KV without attending to
// it: a dependency neither visibility nor cache keys would show.
void check_tree_placement(const std::vector<PromptSegment>& segments, const std::string& label) {
  bool after_tree = false;
  for (const PromptSegment& seg : segments) {
    if (seg.kind == SegmentKind::Tree) after_tree = true;
    if (seg.kind == SegmentKind::Linear && after_tree && seg.tokens.size() > 0)
      fail(ErrorKind::InvalidInput,
           "tree segment '{}' cannot follow linear segment '{}', which follows a tree segment", label,
           seg.label);
  }
}

struct TrieNode {
  int32_t token = -1;
  std::vector<int32_t> children;
};

// The paths' prefix trie; node 0 is a virtual root. n_flat: the paths' tokens
// before merging.
std::vector<TrieNode> path_trie(std::span<const std::vector<int32_t>> paths, const std::string& label,
                                int64_t& n_flat) {
  std::vector<TrieNode> trie(1);
  std::unordered_map<uint64_t, int32_t> child_of;  // (parent << 32 | token) -> trie node
  n_flat = 0;
  for (const auto& path : paths) {
    if (path.empty()) fail(ErrorKind::InvalidInput, "tree segment '{}': empty relation path", label);
    n_flat += static_cast<int64_t>(path.size());
    int32_t at = 0;
    for (int32_t tok : path) {
      const uint64_t key = (static_cast<uint64_t>(at) << 32) | static_cast<uint32_t>(tok);
      auto [it, inserted] = child_of.try_emplace(key, static_cast<int32_t>(trie.size()));
      if (inserted) {
        trie.push_back({tok, {}});
        trie[at].children.push_back(it->second);
      }
      at = it->second;
    }
  }
  return trie;
}

// Appends the trie's tokens to segment `segment` in an iterative pre-order
// walk, its roots under `anchor`. The only child of a real token extends that
// token's run (it follows it directly in pre-order); any other trie node
// opens a new prompt node.
void append_preorder(const std::vector<TrieNode>& trie, int32_t segment, int32_t anchor,
                     std::vector<int32_t>& tokens, std::vector<int32_t>& parents,
                     std::vector<int32_t>& token_node, std::vector<PromptNode>& nodes) {
  struct Frame {
    int32_t trie_node;
    int32_t parent_token;
    int32_t parent_node;  // -1 under the virtual root
    bool only_child;
  };
  std::vector<Frame> stack;
  const auto push_children = [&](int32_t trie_node, int32_t parent_token, int32_t parent_node) {
    const auto& kids = trie[trie_node].children;
    const bool only = parent_node >= 0 && kids.size() == 1;
    for (auto it = kids.rbegin(); it != kids.rend(); ++it)
      stack.push_back({*it, parent_token, parent_node, only});
  };
  push_children(0, anchor, -1);
  while (!stack.empty()) {
    const Frame f = stack.back();
    stack.pop_back();
    const auto index = static_cast<int32_t>(tokens.size());
    int32_t node = f.parent_node;
    if (f.only_child) {
      nodes[node].tokens.end = index + 1;
    } else {
      node = static_cast<int32_t>(nodes.size());
      nodes.push_back({segment, f.parent_node, {index, index + 1}});
    }
    tokens.push_back(trie[f.trie_node].token);
    parents.push_back(f.parent_token);
    token_node.push_back(node);
    push_children(f.trie_node, index, node);
  }
}

}  // namespace

int32_t DepPrompt::add_linear(std::string label, std::span<const int32_t> tokens) {
  check_room(tokens_.size(), tokens.size(), label);
  PromptSegment seg;
  seg.kind = SegmentKind::Linear;
  seg.label = std::move(label);
  const auto first = static_cast<int32_t>(tokens_.size());
  seg.tokens = {first, first + static_cast<int32_t>(tokens.size())};
  seg.first_node = static_cast<int32_t>(nodes_.size());
  seg.n_nodes = tokens.empty() ? 0 : 1;
  seg.n_flat_tokens = static_cast<int32_t>(tokens.size());
  for (int32_t s = 0; s < static_cast<int32_t>(segments_.size()); ++s) seg.depends_on.push_back(s);
  const auto id = static_cast<int32_t>(segments_.size());
  segments_.push_back(std::move(seg));
  if (!tokens.empty()) nodes_.push_back({id, -1, segments_.back().tokens});
  const int32_t anchor = segment_anchor(id);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens_.push_back(tokens[i]);
    parents_.push_back(i == 0 ? anchor : static_cast<int32_t>(tokens_.size()) - 2);
    token_node_.push_back(static_cast<int32_t>(nodes_.size()) - 1);
  }
  return id;
}

int32_t DepPrompt::segment_anchor(int32_t segment) const {
  int32_t anchor = -1;
  for (int32_t dep : segments_[segment].depends_on)
    if (segments_[dep].kind == SegmentKind::Linear && segments_[dep].tokens.size() > 0)
      anchor = std::max(anchor, segments_[dep].tokens.end - 1);
  return anchor;
}

int32_t DepPrompt::add_tree(std::string label, std::span<const std::vector<int32_t>> paths,
                            TreeContext context) {
  check_tree_placement(segments_, label);
  size_t n_path_tokens = 0;
  for (const auto& path : paths) {
    check_room(n_path_tokens, path.size(), label);
    n_path_tokens += path.size();
  }
  check_room(tokens_.size(), n_path_tokens, label);
  int64_t n_flat = 0;
  const std::vector<TrieNode> trie = path_trie(paths, label, n_flat);

  PromptSegment seg;
  seg.kind = SegmentKind::Tree;
  seg.label = std::move(label);
  seg.n_paths = static_cast<int32_t>(paths.size());
  seg.n_flat_tokens = static_cast<int32_t>(n_flat);
  for (int32_t s = 0; s < static_cast<int32_t>(segments_.size()); ++s)
    if (segments_[s].kind == SegmentKind::Linear) seg.depends_on.push_back(s);
  const auto id = static_cast<int32_t>(segments_.size());
  segments_.push_back(std::move(seg));
  const int32_t anchor = segment_anchor(id);
  PromptSegment& s = segments_.back();
  if (context == TreeContext::None) s.depends_on.clear();  // the root still hangs under the anchor
  s.tokens.begin = static_cast<int32_t>(tokens_.size());
  s.first_node = static_cast<int32_t>(nodes_.size());
  append_preorder(trie, id, anchor, tokens_, parents_, token_node_, nodes_);
  s.tokens.end = static_cast<int32_t>(tokens_.size());
  s.n_nodes = static_cast<int32_t>(nodes_.size()) - s.first_node;
  return id;
}

std::vector<int32_t> DepPrompt::positions(PositionScheme scheme) const {
  std::vector<int32_t> pos(tokens_.size());
  if (scheme == PositionScheme::Sequential) {
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
    return pos;
  }
  int32_t next = 0;  // one past the largest position so far
  for (const PromptSegment& seg : segments_) {
    if (seg.kind == SegmentKind::Tree) {
      // Parents precede children in pre-order, and a root's parent (the
      // anchor) lies in an earlier segment.
      for (int32_t i = seg.tokens.begin; i < seg.tokens.end; ++i) {
        const bool root = parents_[i] < seg.tokens.begin;
        if (scheme == PositionScheme::Stacked && root)
          pos[i] = next;
        else
          pos[i] = parents_[i] < 0 ? 0 : pos[parents_[i]] + 1;
      }
      for (int32_t i = seg.tokens.begin; i < seg.tokens.end; ++i) next = std::max(next, pos[i] + 1);
      continue;
    }
    int32_t start = 0;
    for (int32_t dep : seg.depends_on)
      for (int32_t i = segments_[dep].tokens.begin; i < segments_[dep].tokens.end; ++i)
        start = std::max(start, pos[i] + 1);
    for (int32_t i = seg.tokens.begin; i < seg.tokens.end; ++i) pos[i] = start + (i - seg.tokens.begin);
    next = std::max(next, start + seg.tokens.size());
  }
  return pos;
}

std::string_view position_scheme_name(PositionScheme scheme) {
  switch (scheme) {
    case PositionScheme::Sequential:
      return "sequential";
    case PositionScheme::Depth:
      return "depth";
    case PositionScheme::Stacked:
      return "stacked";
  }
  return "?";
}

std::optional<PositionScheme> parse_position_scheme(std::string_view name) {
  for (PositionScheme s : {PositionScheme::Sequential, PositionScheme::Depth, PositionScheme::Stacked})
    if (position_scheme_name(s) == name) return s;
  return std::nullopt;
}

std::string_view tree_context_name(TreeContext context) {
  return context == TreeContext::System ? "system" : "none";
}

std::optional<TreeContext> parse_tree_context(std::string_view name) {
  for (TreeContext c : {TreeContext::System, TreeContext::None})
    if (tree_context_name(c) == name) return c;
  return std::nullopt;
}

std::vector<TokenRange> DepPrompt::visible_ranges(int32_t token) const {
  if (token < 0 || token >= static_cast<int32_t>(tokens_.size()))
    fail(ErrorKind::Internal, "visible_ranges: token {} out of range [0, {})", token, tokens_.size());
  std::vector<TokenRange> ranges = node_context(token_node_[token]);
  const TokenRange own{nodes_[token_node_[token]].tokens.begin, token + 1};
  if (!ranges.empty() && ranges.back().end == own.begin)
    ranges.back().end = own.end;  // context ranges all precede the node
  else
    ranges.push_back(own);
  return ranges;
}

std::vector<int32_t> DepPrompt::node_path(int32_t node) const {
  if (node < 0 || node >= static_cast<int32_t>(nodes_.size()))
    fail(ErrorKind::Internal, "node_path: node {} out of range [0, {})", node, nodes_.size());
  std::vector<int32_t> path;
  for (int32_t n = node; n >= 0; n = nodes_[n].parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  return path;
}

std::vector<int32_t> DepPrompt::node_children(int32_t node) const {
  if (node < 0 || node >= static_cast<int32_t>(nodes_.size()))
    fail(ErrorKind::Internal, "node_children: node {} out of range [0, {})", node, nodes_.size());
  std::vector<int32_t> kids;
  const PromptSegment& seg = segments_[nodes_[node].segment];
  for (int32_t n = node + 1; n < seg.first_node + seg.n_nodes; ++n)
    if (nodes_[n].parent == node) kids.push_back(n);
  return kids;
}

std::vector<TokenRange> DepPrompt::node_context(int32_t node) const {
  std::vector<TokenRange> ranges;
  const std::vector<int32_t> path = node_path(node);
  for (int32_t dep : segments_[nodes_[node].segment].depends_on)
    if (segments_[dep].tokens.size() > 0) ranges.push_back(segments_[dep].tokens);
  for (size_t i = 0; i + 1 < path.size(); ++i) ranges.push_back(nodes_[path[i]].tokens);
  std::sort(ranges.begin(), ranges.end(),
            [](const TokenRange& a, const TokenRange& b) { return a.begin < b.begin; });
  std::vector<TokenRange> merged;
  for (const TokenRange& r : ranges) {
    if (!merged.empty() && r.begin <= merged.back().end)
      merged.back().end = std::max(merged.back().end, r.end);
    else
      merged.push_back(r);
  }
  return merged;
}

bool DepPrompt::attends(int32_t query, int32_t key) const {
  if (key == query) return true;
  if (key > query) return false;  // every dependency points backwards in pre-order
  const int32_t qs = nodes_[token_node_[query]].segment;
  const int32_t ks = nodes_[token_node_[key]].segment;
  if (qs != ks) {
    const auto& deps = segments_[qs].depends_on;
    return std::find(deps.begin(), deps.end(), ks) != deps.end();
  }
  if (segments_[qs].kind == SegmentKind::Linear) return true;
  const int32_t begin = segments_[qs].tokens.begin;
  for (int32_t t = parents_[query]; t >= begin; t = parents_[t])
    if (t == key) return true;
  return false;
}

int64_t DepPrompt::n_flat_tokens() const {
  int64_t n = 0;
  for (const PromptSegment& seg : segments_) n += seg.n_flat_tokens;
  return n;
}

int64_t DepPrompt::n_attention_pairs() const {
  // Depth inside its own tree (1 for a root) plus every token of the segments it depends on.
  std::vector<int32_t> depth(tokens_.size(), 0);
  int64_t pairs = 0;
  for (const PromptSegment& seg : segments_) {
    int64_t dep_tokens = 0;
    for (int32_t dep : seg.depends_on) dep_tokens += segments_[dep].tokens.size();
    for (int32_t i = seg.tokens.begin; i < seg.tokens.end; ++i) {
      const int32_t p = parents_[i];
      if (seg.kind == SegmentKind::Linear)
        depth[i] = i - seg.tokens.begin + 1;
      else
        depth[i] = (p >= seg.tokens.begin) ? depth[p] + 1 : 1;
      pairs += dep_tokens + depth[i];
    }
  }
  return pairs;
}

int64_t DepPrompt::n_flat_attention_pairs() const {
  const int64_t n = n_flat_tokens();
  return n * (n + 1) / 2;
}

}  // namespace depcache

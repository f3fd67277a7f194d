#pragma once
// DepPrompt: a prompt as segments with dependencies (DepCache's dependency
// attention). Linear segments (system, task) are ordinary token runs; a tree
// segment holds one entity's relation paths merged on shared token prefixes, so
// a token depends only on its ancestors in that tree plus the segments the tree
// depends on. The structure knows nothing about models: it holds token ids,
// parents, positions and visibility, which the executor turns into KV ranges.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace depcache {

enum class SegmentKind { Linear, Tree };

// How RoPE positions are assigned.
//  Sequential: position = index in the pre-order token sequence.
//  Depth: position = parent's position + 1, so every path sees exactly the
//         positions it would have alone (siblings share positions); a linear
//         segment starts after the largest position it depends on.
//  Stacked: depth inside a tree, trees one after another: a tree's root
//         comes one past the largest position before it (siblings share
//         positions, trees do not overlap).
enum class PositionScheme { Sequential, Depth, Stacked };

// What a tree's tokens see besides their ancestors in the tree.
//  System: every linear segment before the tree (the system text): the
//          layout DepCache describes.
//  None:   nothing else, so a tree's KV depends on its own tokens and their
//          distances alone: a tree moved whole to another offset is
//          re-encoded exactly by rotating its keys, under every position
//          scheme (a node moved inside its tree is not, but under depth
//          positions). A model must be trained for it.
// Positions do not change: a tree still hangs under the system text.
enum class TreeContext { System, None };

// "system", "none"; parse returns nullopt for other names.
std::string_view tree_context_name(TreeContext context);
std::optional<TreeContext> parse_tree_context(std::string_view name);

// "sequential", "depth", "stacked"; parse returns nullopt for other names.
std::string_view position_scheme_name(PositionScheme scheme);
std::optional<PositionScheme> parse_position_scheme(std::string_view name);

// Half-open range of token indices in the pre-order sequence.
struct TokenRange {
  int32_t begin = 0;
  int32_t end = 0;
  int32_t size() const { return end - begin; }
  bool operator==(const TokenRange&) const = default;
};

struct PromptSegment {
  SegmentKind kind = SegmentKind::Linear;
  std::string label;       // e.g. "system", "entity dog.n.01", "task"
  TokenRange tokens;       // contiguous in the pre-order sequence
  int32_t first_node = 0;  // nodes of this segment are contiguous too
  int32_t n_nodes = 0;
  std::vector<int32_t> depends_on;  // segments whose every token is visible
  int32_t n_paths = 0;              // tree segments: paths inserted
  int32_t n_flat_tokens = 0;        // tokens before prefix merging
};

// A maximal run of tokens without branching (a radix-tree node). Caching and
// visibility work on nodes; a token sees its node up to itself and every
// ancestor node in full.
struct PromptNode {
  int32_t segment = 0;
  int32_t parent = -1;  // node index, -1 for a root of its segment
  TokenRange tokens;
};

class DepPrompt {
 public:
  // A linear segment; it depends on every segment added before it.
  int32_t add_linear(std::string label, std::span<const int32_t> tokens);

  // A tree segment from token paths (each non-empty), merged on shared
  // prefixes; children keep first-insertion order. It depends on the linear
  // segments added before it (none under TreeContext::None), not on other
  // trees. Trees must all precede any linear segment that follows a tree
  // (else InvalidInput).
  int32_t add_tree(std::string label, std::span<const std::vector<int32_t>> paths,
                   TreeContext context = TreeContext::System);

  size_t size() const { return tokens_.size(); }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // pre-order
  // The token each token hangs under: the previous token on its path or in
  // its linear segment; for the first token of a tree or linear segment, the
  // last token of the latest linear segment before it (-1 if none). Trees and
  // later linear segments thus hang under the system segment; what a token
  // attends to is given by visible_ranges, not by this chain alone.
  const std::vector<int32_t>& parents() const { return parents_; }
  const std::vector<int32_t>& token_nodes() const { return token_node_; }
  const std::vector<PromptSegment>& segments() const { return segments_; }
  const std::vector<PromptNode>& nodes() const { return nodes_; }

  std::vector<int32_t> positions(PositionScheme scheme) const;

  // Tokens the given token attends to (itself included), as sorted,
  // non-overlapping, non-adjacent ranges.
  std::vector<TokenRange> visible_ranges(int32_t token) const;
  // Node-level view for the executor: a token of `node` attends to
  // node_context(node) plus its own node up to itself. Context is sorted,
  // merged, and lies before the node.
  std::vector<TokenRange> node_context(int32_t node) const;
  // Nodes from the segment's root node down to `node` (inclusive): the radix
  // path whose tokens identify the node's KV inside its segment.
  std::vector<int32_t> node_path(int32_t node) const;
  std::vector<int32_t> node_children(int32_t node) const;
  // The same relation as a predicate (reference for tests and small prompts).
  bool attends(int32_t query, int32_t key) const;

  // Tokens a flat (unmerged) serialization of the same segments would hold.
  int64_t n_flat_tokens() const;
  // Query-key pairs under dependency attention versus causal attention over
  // the flat serialization: the work the executor saves.
  int64_t n_attention_pairs() const;
  int64_t n_flat_attention_pairs() const;

 private:
  int32_t segment_anchor(int32_t segment) const;  // last token a tree root hangs under

  std::vector<int32_t> tokens_;
  std::vector<int32_t> parents_;
  std::vector<int32_t> token_node_;
  std::vector<PromptSegment> segments_;
  std::vector<PromptNode> nodes_;
};

}  // namespace depcache

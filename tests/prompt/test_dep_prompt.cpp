// DepPrompt: pre-order merge of relation paths, parents, nodes, both position
// schemes and the visibility relation, on hand-made and random prompts.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/dep_prompt.h"
#include "prompt/graph_prompt.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using Paths = std::vector<std::vector<int32_t>>;

// system [1 2] | tree {10 11 12, 10 11 13, 10 14} | task [3]
DepPrompt small_prompt() {
  DepPrompt p;
  p.add_linear("system", std::vector<int32_t>{1, 2});
  const Paths paths = {{10, 11, 12}, {10, 11, 13}, {10, 14}};
  p.add_tree("entity", paths);
  p.add_linear("task", std::vector<int32_t>{3});
  return p;
}

TEST(DepPrompt, PreOrderMergesSharedPrefixes) {
  const DepPrompt p = small_prompt();
  EXPECT_EQ(p.tokens(), (std::vector<int32_t>{1, 2, 10, 11, 12, 13, 14, 3}));
  // The task hangs under the system segment like the tree does.
  EXPECT_EQ(p.parents(), (std::vector<int32_t>{-1, 0, 1, 2, 3, 3, 2, 1}));
  EXPECT_EQ(p.n_flat_tokens(), 11);
  ASSERT_EQ(p.segments().size(), 3u);
  EXPECT_EQ(p.segments()[1].tokens, (TokenRange{2, 7}));
  EXPECT_EQ(p.segments()[1].n_paths, 3);
  EXPECT_EQ(p.segments()[1].n_flat_tokens, 8);
  EXPECT_EQ(p.segments()[1].depends_on, (std::vector<int32_t>{0}));
  EXPECT_EQ(p.segments()[2].depends_on, (std::vector<int32_t>{0, 1}));
}

TEST(DepPrompt, NodesAreNonBranchingRuns) {
  const DepPrompt p = small_prompt();
  // system | 10 | 11 | 12 | 13 | 14 | task: 10 and 11 both branch.
  ASSERT_EQ(p.nodes().size(), 7u);
  EXPECT_EQ(p.nodes()[1].tokens, (TokenRange{2, 3}));
  EXPECT_EQ(p.nodes()[2].tokens, (TokenRange{3, 4}));
  EXPECT_EQ(p.nodes()[2].parent, 1);
  EXPECT_EQ(p.nodes()[3].parent, 2);
  EXPECT_EQ(p.nodes()[4].parent, 2);
  EXPECT_EQ(p.nodes()[5].parent, 1);
  EXPECT_EQ(p.nodes()[5].tokens, (TokenRange{6, 7}));
  EXPECT_EQ(p.segments()[1].first_node, 1);
  EXPECT_EQ(p.segments()[1].n_nodes, 5);

  // A single path is one node however long.
  DepPrompt chain;
  const Paths one = {{5, 6, 7, 8}};
  chain.add_tree("t", one);
  ASSERT_EQ(chain.nodes().size(), 1u);
  EXPECT_EQ(chain.nodes()[0].tokens, (TokenRange{0, 4}));
}

TEST(DepPrompt, BothPositionSchemes) {
  const DepPrompt p = small_prompt();
  EXPECT_EQ(p.positions(PositionScheme::Sequential), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Siblings share depth; the task starts after the deepest context token.
  EXPECT_EQ(p.positions(PositionScheme::Depth), (std::vector<int32_t>{0, 1, 2, 3, 4, 4, 3, 5}));
}

TEST(DepPrompt, DepthPositionsOfATreeDoNotDependOnItsNeighbours) {
  // The same subtree after a different sibling keeps its depth positions:
  // this is what makes its KV reusable exactly.
  const Paths a = {{20, 21, 22}}, b = {{30, 31}, {30, 32, 33, 34}};
  DepPrompt p1, p2;
  p1.add_linear("system", std::vector<int32_t>{1, 2, 3});
  p1.add_tree("a", a);
  p1.add_tree("b", b);
  p2.add_linear("system", std::vector<int32_t>{1, 2, 3});
  p2.add_tree("b", b);
  const auto d1 = p1.positions(PositionScheme::Depth), d2 = p2.positions(PositionScheme::Depth);
  const auto seq1 = p1.positions(PositionScheme::Sequential), seq2 = p2.positions(PositionScheme::Sequential);
  const TokenRange r1 = p1.segments()[2].tokens, r2 = p2.segments()[1].tokens;
  ASSERT_EQ(r1.size(), r2.size());
  for (int32_t i = 0; i < r1.size(); ++i) {
    EXPECT_EQ(d1[r1.begin + i], d2[r2.begin + i]);
    EXPECT_EQ(seq1[r1.begin + i] - seq2[r2.begin + i], 3);  // shifted by the sibling's 3 tokens
  }
}

TEST(DepPrompt, VisibilityFollowsAncestorsAndSegmentDependencies) {
  const DepPrompt p = small_prompt();
  EXPECT_EQ(p.visible_ranges(5),
            (std::vector<TokenRange>{{0, 4}, {5, 6}}));  // 13 sees system, 10, 11, itself
  EXPECT_EQ(p.visible_ranges(6), (std::vector<TokenRange>{{0, 3}, {6, 7}}));  // 14 sees system, 10, itself
  EXPECT_EQ(p.visible_ranges(7), (std::vector<TokenRange>{{0, 8}}));          // the task sees everything
  EXPECT_EQ(p.visible_ranges(1), (std::vector<TokenRange>{{0, 2}}));
  EXPECT_FALSE(p.attends(5, 4));  // sibling
  EXPECT_TRUE(p.attends(5, 3));
  EXPECT_FALSE(p.attends(6, 3));
  EXPECT_TRUE(p.attends(6, 2));
  EXPECT_FALSE(p.attends(2, 5));  // never forward
  // 2 system tokens seen by each of 5 tree tokens + tree depths 1,2,3,3,2 + causal system 1+2 + task 8.
  EXPECT_EQ(p.n_attention_pairs(), 3 + 5 * 2 + 11 + 8);
  EXPECT_EQ(p.n_flat_attention_pairs(), 11 * 12 / 2);
}

TEST(DepPrompt, TreesDoNotSeeEachOther) {
  DepPrompt p;
  p.add_linear("system", std::vector<int32_t>{1});
  const Paths a = {{4, 5}}, b = {{6, 7}};
  p.add_tree("a", a);
  p.add_tree("b", b);
  p.add_linear("task", std::vector<int32_t>{9});
  EXPECT_EQ(p.visible_ranges(3), (std::vector<TokenRange>{{0, 1}, {3, 4}}));  // 6 sees system and itself
  EXPECT_FALSE(p.attends(3, 1));
  EXPECT_TRUE(p.attends(5, 2));  // the task sees both trees
  EXPECT_EQ(p.positions(PositionScheme::Depth), (std::vector<int32_t>{0, 1, 2, 1, 2, 3}));
}

// A tree that sees nothing but itself: its tokens lose the system text and
// keep their positions (the root still hangs under it); the task still sees
// everything.
TEST(DepPrompt, TreesAloneSeeOnlyThemselves) {
  DepPrompt p;
  p.add_linear("system", std::vector<int32_t>{1, 2});
  const Paths a = {{4, 5}, {4, 6}}, b = {{7, 8}};
  p.add_tree("a", a, TreeContext::None);
  p.add_tree("b", b, TreeContext::None);
  p.add_linear("task", std::vector<int32_t>{9});
  // system 0-1 | a: 4@2 5@3 6@4 | b: 7@5 8@6 | task 9@7
  EXPECT_EQ(p.visible_ranges(2), (std::vector<TokenRange>{{2, 3}}));  // a root sees only itself
  EXPECT_EQ(p.visible_ranges(4), (std::vector<TokenRange>{{2, 3}, {4, 5}}));
  EXPECT_EQ(p.visible_ranges(6), (std::vector<TokenRange>{{5, 7}}));
  EXPECT_EQ(p.visible_ranges(7), (std::vector<TokenRange>{{0, 8}}));
  EXPECT_FALSE(p.attends(3, 1));
  EXPECT_FALSE(p.attends(5, 0));
  EXPECT_TRUE(p.attends(7, 1));
  EXPECT_EQ(p.node_context(p.token_nodes()[3]), (std::vector<TokenRange>{{2, 3}}));
  EXPECT_TRUE(p.segments()[1].depends_on.empty());
  // Positions as when the trees see the system text.
  DepPrompt seen;
  seen.add_linear("system", std::vector<int32_t>{1, 2});
  seen.add_tree("a", a);
  seen.add_tree("b", b);
  seen.add_linear("task", std::vector<int32_t>{9});
  for (PositionScheme s : {PositionScheme::Sequential, PositionScheme::Depth, PositionScheme::Stacked})
    EXPECT_EQ(p.positions(s), seen.positions(s)) << position_scheme_name(s);
  // 1 + 2 (system) + 1 + 2 + 2 (a) + 1 + 2 (b) + 8 (task).
  EXPECT_EQ(p.n_attention_pairs(), 19);
  EXPECT_EQ(parse_tree_context("none"), TreeContext::None);
  EXPECT_EQ(parse_tree_context("system"), TreeContext::System);
  EXPECT_EQ(parse_tree_context("all"), std::nullopt);
}

TEST(DepPrompt, AChainIsCausalAttention) {
  DepPrompt p;
  p.add_linear("system", std::vector<int32_t>{1, 2});
  const Paths chain = {{3, 4, 5, 6}};
  p.add_tree("chain", chain);
  p.add_linear("task", std::vector<int32_t>{7, 8});
  for (int32_t t = 0; t < static_cast<int32_t>(p.size()); ++t) {
    EXPECT_EQ(p.visible_ranges(t), (std::vector<TokenRange>{{0, t + 1}})) << t;
  }
  EXPECT_EQ(p.positions(PositionScheme::Depth), p.positions(PositionScheme::Sequential));
  EXPECT_EQ(p.n_attention_pairs(), p.n_flat_attention_pairs());
}

TEST(DepPrompt, NodeLevelContext) {
  const DepPrompt p = small_prompt();
  // Nodes: system | 10 | 11 | 12 | 13 | 14 | task.
  ASSERT_EQ(p.nodes().size(), 7u);
  EXPECT_EQ(p.node_context(0), (std::vector<TokenRange>{}));
  EXPECT_EQ(p.node_context(3), (std::vector<TokenRange>{{0, 4}}));
  EXPECT_EQ(p.node_context(5), (std::vector<TokenRange>{{0, 3}}));
  EXPECT_EQ(p.node_context(6), (std::vector<TokenRange>{{0, 7}}));
  EXPECT_EQ(p.node_path(4), (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(p.node_children(1), (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(p.node_children(3), (std::vector<int32_t>{}));
  EXPECT_THROW(p.node_context(7), Error);
}

// A tree after "system, tree, linear" would depend on the first tree through
// the linear segment's KV without attending to it.
TEST(DepPrompt, TreeAfterALinearSegmentThatSawATreeIsRejected) {
  DepPrompt p;
  p.add_linear("system", std::vector<int32_t>{1});
  const Paths paths = {{10, 11}};
  p.add_tree("a", paths);
  p.add_tree("b", paths);  // trees side by side are fine
  p.add_linear("task", std::vector<int32_t>{3});
  EXPECT_THROW(p.add_tree("c", paths), Error);
}

TEST(DepPrompt, EmptyPathIsAnError) {
  DepPrompt p;
  const Paths bad = {{1, 2}, {}};
  EXPECT_THROW(p.add_tree("t", bad), Error);
  DepPrompt empty;
  const Paths none;
  empty.add_tree("t", none);  // an entity without paths is just empty
  EXPECT_EQ(empty.size(), 0u);
}

// Random prompts: visible_ranges agrees with attends() everywhere, every input
// path is a root-to-leaf chain, node runs are non-branching, depth positions
// follow parents.
TEST(DepPrompt, RandomPromptsAreConsistent) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    DepPrompt p;
    std::vector<Paths> trees;
    const int n_trees = 1 + static_cast<int>(rng() % 3);
    p.add_linear("system", std::vector<int32_t>(rng() % 3, 1));
    for (int t = 0; t < n_trees; ++t) {
      Paths paths;
      const int n_paths = 1 + static_cast<int>(rng() % 6);
      for (int i = 0; i < n_paths; ++i) {
        std::vector<int32_t> path(1 + rng() % 5);
        for (auto& tok : path) tok = static_cast<int32_t>(rng() % 3);  // tiny alphabet: lots of sharing
        path.push_back(100 + static_cast<int32_t>(rng() % 4));         // a distinct end token
        paths.push_back(path);
      }
      p.add_tree("t", paths);
      trees.push_back(paths);
    }
    if (rng() % 2) p.add_linear("task", std::vector<int32_t>{5, 6});
    const int32_t n = static_cast<int32_t>(p.size());
    const auto depth = p.positions(PositionScheme::Depth);
    std::vector<int32_t> n_children(n, 0);
    for (int32_t i = 0; i < n; ++i) {
      const auto ranges = p.visible_ranges(i);
      std::vector<bool> vis(n, false);
      for (const TokenRange& r : ranges)
        for (int32_t k = r.begin; k < r.end; ++k) vis[k] = true;
      for (int32_t k = 0; k < n; ++k)
        ASSERT_EQ(vis[k], p.attends(i, k)) << "trial " << trial << " q " << i << " k " << k;
      const PromptSegment& seg = p.segments()[p.nodes()[p.token_nodes()[i]].segment];
      if (seg.kind == SegmentKind::Tree) {
        const int32_t par = p.parents()[i];
        ASSERT_EQ(depth[i], par < 0 ? 0 : depth[par] + 1);
        if (par >= seg.tokens.begin) ++n_children[par];
      }
    }
    for (const PromptNode& node : p.nodes()) {
      for (int32_t t = node.tokens.begin + 1; t < node.tokens.end; ++t) {
        ASSERT_EQ(p.parents()[t], t - 1);
        if (p.segments()[node.segment].kind == SegmentKind::Tree) {
          ASSERT_EQ(n_children[t - 1], 1);
        }
      }
    }
    // Root-to-leaf chains of each tree are exactly its distinct paths.
    size_t seg_index = 1;
    for (const Paths& paths : trees) {
      const PromptSegment& seg = p.segments()[seg_index++];
      std::set<std::vector<int32_t>> want(paths.begin(), paths.end()), got;
      for (int32_t t = seg.tokens.begin; t < seg.tokens.end; ++t) {
        if (p.tokens()[t] < 100) continue;  // leaves are the end tokens
        std::vector<int32_t> chain;
        for (int32_t a = t; a >= seg.tokens.begin; a = p.parents()[a]) chain.push_back(p.tokens()[a]);
        std::reverse(chain.begin(), chain.end());
        got.insert(chain);
      }
      ASSERT_EQ(got, want) << "trial " << trial;
    }
  }
}

TEST(GraphPrompt, PathsSharingTextShareTokens) {
  const Tokenizer tok(Vocab::builtin_bytes());
  GraphPromptText text;
  text.system = "Answer from the paths.";
  text.entities.push_back({"dog.n.01",
                           {"dog -hypernym-> canine -hyponym-> wolf", "dog -hypernym-> canine -hyponym-> fox",
                            "dog -part meronym-> flag"}});
  text.task = "Question: what is a dog?";
  const DepPrompt p = build_graph_prompt(tok, text);
  ASSERT_EQ(p.segments().size(), 3u);
  EXPECT_EQ(p.tokens().front(), tok.bos());
  const int64_t flat = p.n_flat_tokens();
  EXPECT_LT(static_cast<int64_t>(p.size()), flat);
  // Every path line, as inserted, is a root-to-leaf chain of the tree.
  const PromptSegment& tree = p.segments()[1];
  for (const std::string& path : text.entities[0].paths) {
    const std::vector<int32_t> want = path_tokens(tok, path);
    bool found = false;
    for (int32_t t = tree.tokens.begin; t < tree.tokens.end && !found; ++t) {
      std::vector<int32_t> chain;
      for (int32_t a = t; a >= tree.tokens.begin; a = p.parents()[a]) chain.push_back(p.tokens()[a]);
      std::reverse(chain.begin(), chain.end());
      found = chain == want;
    }
    EXPECT_TRUE(found) << path;
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

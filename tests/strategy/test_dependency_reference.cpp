// Dependency attention against an independent float64 reference. The test
// builds, from a request's prompt parts alone, what DepCache's dependency
// attention means — the pre-order token layout of each entity's merged paths,
// who sees whom (a tree token: the system prompt unless trees are alone, its
// ancestors and itself; the task: everything before it) and the positions of
// every scheme — and
// runs the reference forward pass on it. The engine's DepPrompt, visibility
// lists, position schemes, span placement with RoPE re-encoding and the
// depcache strategy with reuse are then compared with it: every computed
// token's logits (executor level) and, through the strategy, the answer's
// logits and every K/V row of the assembly, reused rows included.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "exec/forward.h"
#include "exec/visibility.h"
#include "graph_requests.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "reference_forward.h"
#include "strategy/dependency_visibility.h"
#include "strategy/strategy.h"
#include "test_support.h"
#include "util/numeric.h"
#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// The meaning of dependency attention over a request, built independently of
// DepPrompt: a token trie per context item (children in first-insertion
// order), laid out in pre-order after the system prompt, then the linear
// segments after the trees.
struct ExpectedLayout {
  std::vector<int32_t> tokens;
  std::vector<int32_t> tree;    // item index, -1 for the system prompt and later linear segments
  std::vector<int64_t> parent;  // within the tree, -1 for a root
  std::vector<int32_t> depth;   // within the tree, 0 for a root
  int64_t n_system = 0;
  bool trees_see_system = true;
  std::vector<int32_t> positions(PositionScheme scheme) const;
  bool sees(int64_t q, int64_t k) const;
};

struct Trie {
  int32_t token = 0;
  std::vector<std::unique_ptr<Trie>> children;
};

void lay_out(const Trie& node, int32_t item, int64_t parent, int32_t depth, ExpectedLayout& l) {
  for (const auto& child : node.children) {
    const auto at = static_cast<int64_t>(l.tokens.size());
    l.tokens.push_back(child->token);
    l.tree.push_back(item);
    l.parent.push_back(parent);
    l.depth.push_back(depth);
    lay_out(*child, item, at, depth + 1, l);
  }
}

ExpectedLayout expected_layout(const PromptParts& parts, TreeContext tree_context = TreeContext::System) {
  ExpectedLayout l;
  l.trees_see_system = tree_context == TreeContext::System;
  const auto linear = [&l](const std::vector<int32_t>& run) {
    for (int32_t t : run) {
      l.tokens.push_back(t);
      l.tree.push_back(-1);
      l.parent.push_back(-1);
      l.depth.push_back(0);
    }
  };
  linear(parts.system);
  l.n_system = static_cast<int64_t>(parts.system.size());
  for (size_t item = 0; item < parts.items.size(); ++item) {
    Trie root;
    for (const auto& path : parts.items[item].paths) {
      Trie* at = &root;
      for (int32_t t : path) {
        Trie* next = nullptr;
        for (const auto& c : at->children)
          if (c->token == t) next = c.get();
        if (!next) {
          at->children.push_back(std::make_unique<Trie>());
          next = at->children.back().get();
          next->token = t;
        }
        at = next;
      }
    }
    lay_out(root, static_cast<int32_t>(item), -1, 0, l);
  }
  linear(parts.text);
  linear(parts.task);
  return l;
}

std::vector<int32_t> ExpectedLayout::positions(PositionScheme scheme) const {
  std::vector<int32_t> pos(tokens.size());
  int32_t next = 0;        // one past every earlier position
  int32_t tree_start = 0;  // stacked: where the current tree's root sits
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (scheme == PositionScheme::Sequential) {
      pos[i] = static_cast<int32_t>(i);
    } else if (tree[i] >= 0) {
      if (scheme == PositionScheme::Depth) {
        pos[i] = static_cast<int32_t>(n_system) + depth[i];
      } else {
        if (i == 0 || tree[i - 1] != tree[i]) tree_start = next;  // a new tree starts after everything before
        pos[i] = tree_start + depth[i];
      }
    } else {
      pos[i] = static_cast<int64_t>(i) < n_system ? static_cast<int32_t>(i) : next;
    }
    next = std::max(next, pos[i] + 1);
  }
  return pos;
}

bool ExpectedLayout::sees(int64_t q, int64_t k) const {
  if (k > q) return false;
  if (tree[q] < 0) return true;  // system (causal) and the segments after the trees: all before
  if (k < n_system) return trees_see_system;
  for (int64_t a = q; a >= 0; a = parent[a])
    if (a == k) return true;
  return false;
}

// Largest difference relative to the largest reference value of a set of
// rows (one layer's keys, say).
struct RelDiff {
  double diff = 0, scale = 1e-30;
  void add(std::span<const float> got, std::span<const double> want) {
    diff = std::max(diff, max_abs_difference(got, want));
    for (double w : want) scale = std::max(scale, std::fabs(w));
  }
  double rel() const { return diff / scale; }
};

using test::graph_request;
using test::kCat;
using test::kDog;
using test::kDog2;
using test::kOwl;

struct Case {
  std::string preset;  // tiny: normal rotary; tiny-qwen2: NeoX rotary and q/k/v biases
  DType kv_type;
  PositionScheme scheme;
  TreeContext tree_context = TreeContext::System;
};

std::string case_name(const Case& c) {
  std::string n = c.preset + "_" + std::string(dtype_info(c.kv_type).name) + "_" +
                  std::string(position_scheme_name(c.scheme)) +
                  (c.tree_context == TreeContext::None ? "_alone" : "");
  for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return n;
}

class DependencyReference : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    model_ = test::random_model(c.preset, DType::F32);
    StrategyOptions so{c.scheme, true};
    so.tree_context = c.tree_context;
    EngineOptions o = test::engine_options(c.kv_type);
    o.pool_rows = 1024;
    o.cache_bytes = 64 << 20;
    o.strategy = so;
    engine_ = std::make_unique<Engine>(model_, o);
  }
  // f16 K/V carry a relative rounding of 2^-11 per element, amplified through
  // the layers of a random model with wide weights (as in the plain forward
  // test); f32 leaves only float32 accumulation.
  double tolerance() const { return GetParam().kv_type == DType::F32 ? 1e-4 : 5e-3; }

  struct Outcome {
    PrefillReport report;
    double logits_rel = 0;
    std::vector<double> k_rel, v_rel;  // per layer, over every row of the assembly
    std::vector<double> row_rel;       // per row, the largest over layers, keys and values
    std::vector<int32_t> tree;         // per row: the context item it belongs to, -1 for none
  };

  // One request through the engine's depcache strategy on its index (or
  // beside it, without reuse), compared with the reference on the expected
  // layout.
  Outcome run(const RagRequest& request, bool reuse = true) {
    const Case& c = GetParam();
    const PromptParts parts = make_prompt_parts(tok_, request);
    const ExpectedLayout want = expected_layout(parts, c.tree_context);
    EXPECT_EQ(parts.dep_prompt(c.tree_context).tokens(), want.tokens) << "the pre-order layout differs";
    const auto positions = want.positions(c.scheme);
    EXPECT_EQ(parts.dep_prompt().positions(c.scheme), positions);
    const auto ref = test::reference_forward(*model_, want.tokens, positions,
                                             [&want](int64_t q, int64_t k) { return want.sees(q, k); });

    Outcome o;
    SamplingParams one = test::greedy(1);
    one.prompt_kv = true;
    const RequestId id =
        engine_->submit("depcache", parts, one, {}, reuse ? CacheUse::Shared : CacheUse::None);
    const RequestResult result = engine_->wait(id);
    engine_->forget(id);
    o.report = result.report;
    const KvAssembly kv = test::prompt_assembly(model_->config(), result.prompt_kv);
    const auto n = static_cast<int64_t>(want.tokens.size());
    EXPECT_EQ(o.report.prompt_tokens, n);
    EXPECT_EQ(kv.n_past(), n);
    const int n_vocab = model_->config().n_vocab;
    const std::span<const double> last(ref.logits.data() + (n - 1) * n_vocab, n_vocab);
    o.logits_rel = test::max_rel_diff(o.report.logits, last, "answer logits vs reference");
    // Every row of every layer, relative to the largest reference value of
    // that layer's keys (values); per layer and per row.
    o.row_rel.assign(n, 0.0);
    o.tree = want.tree;
    std::vector<float> k(kv.row_elems()), v(kv.row_elems());
    for (int il = 0; il < model_->config().n_layer; ++il) {
      RelDiff dk, dv;
      std::vector<double> row_k(n), row_v(n);
      for (int64_t r = 0; r < n; ++r) {
        EXPECT_EQ(kv.position(r), positions[r]) << "row " << r;
        kv.read(il, r, k.data(), v.data());
        row_k[r] = max_abs_difference(std::span<const float>(k), std::span<const double>(ref.k[il][r]));
        row_v[r] = max_abs_difference(std::span<const float>(v), std::span<const double>(ref.v[il][r]));
        dk.add(k, ref.k[il][r]);
        dv.add(v, ref.v[il][r]);
      }
      for (int64_t r = 0; r < n; ++r)
        o.row_rel[r] = std::max({o.row_rel[r], row_k[r] / dk.scale, row_v[r] / dv.scale});
      std::printf("[check] layer %d: K rows %.3g, V rows %.3g (relative)\n", il, dk.rel(), dv.rel());
      o.k_rel.push_back(dk.rel());
      o.v_rel.push_back(dv.rel());
    }
    return o;
  }

  void expect_exact(const Outcome& o, const std::string& what) {
    const double tol = tolerance();
    EXPECT_LT(o.logits_rel, tol) << what;
    for (size_t il = 0; il < o.k_rel.size(); ++il) {
      EXPECT_LT(o.k_rel[il], tol) << what << ": keys of layer " << il;
      EXPECT_LT(o.v_rel[il], tol) << what << ": values of layer " << il;
    }
  }

  std::shared_ptr<const Model> model_;
  Tokenizer tok_{Vocab::builtin_bytes()};
  ThreadPool pool_{2};
  Forward fwd_{test::random_model(GetParam().preset, DType::F32), pool_};
  std::unique_ptr<Engine> engine_;  // its index is shared by the requests of a test
};

// The executor alone: the whole DepPrompt computed in one sparse prefill
// under the engine's visibility lists gives every token's logits of the
// reference.
TEST_P(DependencyReference, EveryTokenOfASparsePrefill) {
  const Case& c = GetParam();
  const PromptParts parts = make_prompt_parts(tok_, graph_request({kDog, kCat, kOwl}, "Which animals?"));
  const ExpectedLayout want = expected_layout(parts, c.tree_context);
  const DepPrompt prompt = parts.dep_prompt(c.tree_context);
  ASSERT_EQ(prompt.tokens(), want.tokens);
  const auto n = static_cast<int64_t>(prompt.size());
  PrefillPlan plan;
  plan.tokens = prompt.tokens();
  plan.positions = prompt.positions(c.scheme);
  std::vector<int64_t> rows(n);
  for (int64_t r = 0; r < n; ++r) rows[r] = r;
  plan.rows = rows;
  plan.visibility = dependency_dag(prompt, rows);
  plan.logits_for = rows;
  KvAssembly kv(model_->config(), n, c.kv_type);
  const PrefillResult got = fwd_.prefill(plan, kv);
  const auto ref = test::reference_forward(*model_, want.tokens, want.positions(c.scheme),
                                           [&want](int64_t q, int64_t k) { return want.sees(q, k); });
  EXPECT_LT(test::max_rel_diff(got.logits, ref.logits, "every token's logits vs reference"), tolerance());
}

// Several trees, then the same trees reordered, one partly changed and one
// new, then documents and plain text: with reuse (and without), every
// request's answer logits and every K/V row equal the reference. Under the
// depth scheme a subtree has the positions it would have alone wherever it
// sits, so reuse is exact; under the sequential scheme it is exact while the
// reused subtrees stay where they were computed. Trees that see nothing but
// themselves are exact wherever they move under every scheme (rotation is
// all a move changes), as long as a reused node keeps its offset inside its tree.
TEST_P(DependencyReference, ReuseAcrossRequests) {
  const bool moves_exactly =
      GetParam().scheme == PositionScheme::Depth || GetParam().tree_context == TreeContext::None;
  expect_exact(run(graph_request({kDog, kCat}, "Which animals?")), "cold");
  const Outcome same = run(graph_request({kDog, kCat}, "Which animals are carnivores?"));
  EXPECT_GT(same.report.reused_tokens, 60);
  expect_exact(same, "same trees, other question");
  if (moves_exactly) {
    const Outcome moved = run(graph_request({kOwl, kCat, kDog2}, "Which animals eat mice?"));
    EXPECT_GT(moved.report.reused_tokens, 40);
    EXPECT_GT(moved.report.computed_tokens, 20);  // the owl and dog's changed path
    expect_exact(moved, "reordered, partly changed, new");
    expect_exact(run(graph_request({kCat, kDog2, kOwl}, "Which animals?"), false), "without reuse");
  }
  RagRequest docs;
  docs.question = "Who barks?";
  docs.documents = {{"d1", "Dogs", "Dogs bark at night."}, {"d2", "Cats", "Cats purr."}};
  expect_exact(run(docs), "documents");
  if (moves_exactly) {
    std::swap(docs.documents[0], docs.documents[1]);
    const Outcome swapped = run(docs);
    EXPECT_EQ(swapped.report.computed_tokens,
              static_cast<int64_t>(make_prompt_parts(tok_, docs).task.size()));
    expect_exact(swapped, "documents swapped");
  }
  RagRequest text;
  text.question = "What happened?";
  text.text = "Once upon a time there was a dog.";
  expect_exact(run(text), "plain text");
  const Outcome again = run(text);
  EXPECT_EQ(again.report.computed_tokens, 1);
  expect_exact(again, "plain text again");
}

// Under the sequential and stacked schemes a reused subtree that moved is re-encoded by
// rotation only: approximate by design. What must stay exact: the first
// layer's keys and values (they depend on the token and its position alone,
// so rotation is all there is), and every row of a subtree that did not move.
// The moved subtree's deeper layers saw the system prompt at another
// distance; how far that takes the answer is measured against the reference
// and bounded by the figure measured on these random models (printed), so a
// change that makes the approximation worse fails. Random models with wide
// weights amplify any change; the figure on a trained model is in the
// fidelity measurement of `depcache run`.
class OffsetSchemes : public DependencyReference {};

TEST_P(OffsetSchemes, MovedSubtreesDeviateOnlyWhereTheyMoved) {
  run(graph_request({kDog, kCat}, "Which animals?"));
  // dog stays first; the owl is new; the cat moves behind it.
  const Outcome moved = run(graph_request({kDog, kOwl, kCat}, "Which animals?"));
  EXPECT_GT(moved.report.reused_tokens, 60);
  EXPECT_LT(moved.k_rel[0], tolerance()) << "first-layer keys are a rotation";
  EXPECT_LT(moved.v_rel[0], tolerance()) << "first-layer values do not depend on position";
  double unmoved = 0, cat = 0;
  for (size_t r = 0; r < moved.row_rel.size(); ++r) {
    if (moved.tree[r] == 2) cat = std::max(cat, moved.row_rel[r]);
    if (moved.tree[r] != 2 && r + 1 < moved.row_rel.size() && moved.tree[r] >= 0)
      unmoved = std::max(unmoved, moved.row_rel[r]);
  }
  std::printf("[measure] %s scheme, moved subtree: its rows %.3g, unmoved subtrees %.3g, answer %.3g\n",
              std::string(position_scheme_name(GetParam().scheme)).c_str(), cat, unmoved, moved.logits_rel);
  EXPECT_LT(unmoved, tolerance()) << "rows of subtrees that stayed in place";
  EXPECT_GT(cat, tolerance()) << "the moved subtree was expected to deviate (is it still reused?)";
  EXPECT_LT(moved.logits_rel, 0.3);  // measured: 0.080 (tiny), 0.142 (tiny-qwen2)
}

// The schemes whose positions depend on where a tree sits.
const auto kOffsetCases = ::testing::Values(Case{"tiny", DType::F32, PositionScheme::Sequential},
                                            Case{"tiny", DType::F16, PositionScheme::Sequential},
                                            Case{"tiny-qwen2", DType::F32, PositionScheme::Sequential},
                                            Case{"tiny-qwen2", DType::F16, PositionScheme::Sequential},
                                            Case{"tiny", DType::F32, PositionScheme::Stacked},
                                            Case{"tiny", DType::F16, PositionScheme::Stacked},
                                            Case{"tiny-qwen2", DType::F32, PositionScheme::Stacked},
                                            Case{"tiny-qwen2", DType::F16, PositionScheme::Stacked});
INSTANTIATE_TEST_SUITE_P(Depth, DependencyReference,
                         ::testing::Values(Case{"tiny", DType::F32, PositionScheme::Depth},
                                           Case{"tiny", DType::F16, PositionScheme::Depth},
                                           Case{"tiny-qwen2", DType::F32, PositionScheme::Depth},
                                           Case{"tiny-qwen2", DType::F16, PositionScheme::Depth}),
                         [](const auto& info) { return case_name(info.param); });
// Trees that see only themselves, under the schemes whose positions move them.
INSTANTIATE_TEST_SUITE_P(
    Alone, DependencyReference,
    ::testing::Values(Case{"tiny", DType::F32, PositionScheme::Sequential, TreeContext::None},
                      Case{"tiny", DType::F16, PositionScheme::Sequential, TreeContext::None},
                      Case{"tiny-qwen2", DType::F32, PositionScheme::Sequential, TreeContext::None},
                      Case{"tiny-qwen2", DType::F16, PositionScheme::Sequential, TreeContext::None},
                      Case{"tiny", DType::F32, PositionScheme::Stacked, TreeContext::None},
                      Case{"tiny", DType::F32, PositionScheme::Depth, TreeContext::None}),
    [](const auto& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(Offset, DependencyReference, kOffsetCases,
                         [](const auto& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(Offset, OffsetSchemes, kOffsetCases,
                         [](const auto& info) { return case_name(info.param); });

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// Strategies end to end on a random-weight model: prefix reuse equals full
// prefill; depcache with reuse equals depcache without reuse (depth scheme
// always, sequential scheme when the reused subtrees are identical);
// dependency attention on a chain equals causal attention; decoding after a
// sparse prefill equals decoding after a full one.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "graph_requests.h"
#include "model/model.h"
#include "model/model_writer.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "strategy/strategy.h"
#include "strategy_rig.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::entity;
using test::graph_request;
using test::kCat;
using test::kDog;
using test::kDog2;
using test::kOwl;

using Rig = test::StrategyRig;

TEST(Strategies, PrefixReuseEqualsFullPrefill) {
  for (DType kv_type : {DType::F32, DType::F16}) {
    Rig rig("tiny", kv_type);
    const RagRequest a = graph_request({kDog, kCat}, "What is a dog?");
    const RagRequest b = graph_request({kDog, kOwl}, "What is a dog?");
    const PrefillReport first = rig.run("prefix", a);
    EXPECT_EQ(first.reused_tokens, 0);
    const PrefillReport second = rig.run("prefix", b);
    const PrefillReport full = rig.run("full", b);
    // system + dog's paths are shared; cat vs owl diverge after "\n".
    EXPECT_GT(second.reused_tokens, 100);
    EXPECT_EQ(second.computed_tokens + second.reused_tokens, full.prompt_tokens);
    // Same KV bytes either way; only batch-shape-dependent float sums differ.
    EXPECT_LT(test::max_abs_diff(second.logits, full.logits, "second.logits vs full.logits"), 1e-3)
        << dtype_info(kv_type).name;
    EXPECT_EQ(rig.run("prefix", b).computed_tokens, 1);  // all but the logits token
  }
}

// RAGCache's knowledge tree on the engine: the system prompt and whole
// documents in their context are reused, the question never is, and the
// logits equal full prefill's.
TEST(Strategies, KnowledgeTreeReuseEqualsFullPrefill) {
  Rig rig;
  const RagRequest a = graph_request({kDog, kCat}, "What is a dog?");
  const RagRequest b = graph_request({kDog, kOwl}, "What is a dog?");
  const PromptParts pb = make_prompt_parts(rig.tok, b);
  int64_t dog = 0;
  for (const auto& path : pb.items[0].paths) dog += static_cast<int64_t>(path.size());
  EXPECT_EQ(rig.run("ragcache", a).reused_tokens, 0);
  const PrefillReport second = rig.run("ragcache", b);
  EXPECT_EQ(second.reused_tokens, static_cast<int64_t>(pb.system.size()) + dog) << "system and dog, not owl";
  const PrefillReport full = rig.run("full", b);
  EXPECT_EQ(second.computed_tokens + second.reused_tokens, full.prompt_tokens);
  EXPECT_LT(test::max_abs_diff(second.logits, full.logits, "ragcache vs full"), 1e-3);
  // Again: everything but the question (never stored).
  const PrefillReport third = rig.run("ragcache", b);
  EXPECT_EQ(third.computed_tokens, static_cast<int64_t>(pb.task.size()));
  EXPECT_LT(test::max_abs_diff(third.logits, full.logits, "ragcache again vs full"), 1e-3);
}

TEST(Strategies, DependencyAttentionOnAChainEqualsCausalAttention) {
  Rig rig("tiny-qwen2");
  // One entity with one path: system → path → task is a chain, and both
  // position schemes number it 0..n-1.
  const RagRequest r = graph_request({entity("dog", {"dog -hypernym-> canine"})}, "What is a dog?");
  const PrefillReport full = rig.run("full", r);
  for (PositionScheme s : {PositionScheme::Depth, PositionScheme::Sequential}) {
    const PrefillReport dep = rig.run("depcache", r, {s, false});
    EXPECT_EQ(dep.prompt_tokens, full.prompt_tokens);
    EXPECT_EQ(dep.attention_pairs, full.attention_pairs);
    EXPECT_LT(test::max_abs_diff(dep.logits, full.logits, "dep.logits vs full.logits"), 1e-4);
  }
}

TEST(Strategies, DepCacheReuseEqualsNoReuseUnderTheDepthScheme) {
  for (const char* preset : {"tiny", "tiny-qwen2"})
    for (DType kv_type : {DType::F32, DType::F16}) {
      const StrategyOptions reuse{PositionScheme::Depth, true}, none{PositionScheme::Depth, false};
      Rig rig(preset, kv_type, reuse);
      rig.run("depcache", graph_request({kDog, kCat}, "Which animals?"), reuse);
      // Reordered, one subtree changed (partial match), one new.
      const RagRequest b = graph_request({kOwl, kCat, kDog2}, "Which animals eat mice?");
      const PrefillReport with = rig.run("depcache", b, reuse);
      const PrefillReport without = rig.run("depcache", b, none);
      EXPECT_GT(with.reused_tokens, 60);
      EXPECT_EQ(without.reused_tokens, 0);
      EXPECT_EQ(with.prompt_tokens, without.prompt_tokens);
      EXPECT_LT(with.attention_pairs, without.attention_pairs);
      // f16 KV: the reused rows were rounded in the same way; only sums differ.
      EXPECT_LT(test::max_abs_diff(with.logits, without.logits, "with.logits vs without.logits"),
                kv_type == DType::F32 ? 1e-4 : 2e-3)
          << preset << " " << dtype_info(kv_type).name;
    }
}

TEST(Strategies, DepCacheReuseEqualsNoReuseForIdenticalSubtreesUnderTheSequentialScheme) {
  const StrategyOptions reuse{PositionScheme::Sequential, true}, none{PositionScheme::Sequential, false};
  Rig rig("tiny-qwen2", DType::F32, reuse);
  const RagRequest r = graph_request({kDog, kCat}, "Which animals?");
  rig.run("depcache", r, reuse);
  RagRequest again = r;
  again.question = "Which animals are carnivores?";  // same subtrees at the same places
  const PrefillReport with = rig.run("depcache", again, reuse);
  const PrefillReport without = rig.run("depcache", again, none);
  // Everything but the task is reused.
  const auto task = static_cast<int64_t>(make_prompt_parts(rig.tok, again).task.size());
  EXPECT_EQ(with.reused_tokens, with.prompt_tokens - task);
  EXPECT_EQ(with.computed_tokens, task);
  EXPECT_LT(test::max_abs_diff(with.logits, without.logits, "with.logits vs without.logits"), 1e-4);
  // Moved subtrees are re-encoded by rotation and reused whole (approximate:
  // their distance to the system segment changed).
  const RagRequest moved_request = graph_request({kOwl, kCat, kDog}, "Which?");
  const PrefillReport moved = rig.run("depcache", moved_request, reuse);
  EXPECT_EQ(moved.reused_tokens, with.reused_tokens);
}

// The ablation without position alignment: reused keys stay at the
// positions they were computed at. Where subtrees do not move (depth scheme,
// or the same places) nothing changes; where they move, the answer does.
TEST(Strategies, WithoutRealignmentMovedSubtreesKeepTheirOldPositions) {
  for (PositionScheme scheme : {PositionScheme::Depth, PositionScheme::Sequential}) {
    const StrategyOptions realign{scheme, true}, keep{scheme, true, false};
    Rig rig("tiny-qwen2", DType::F32, realign);
    rig.run("depcache", graph_request({kDog, kCat}, "Which animals?"), realign);
    const RagRequest moved = graph_request({kOwl, kCat, kDog}, "Which?");
    rig.run("depcache", moved, realign);  // caches owl where it is; dog and cat stay cached where they were
    const PrefillReport aligned = rig.run("depcache", moved, realign);
    const PrefillReport kept = rig.run("depcache", moved, keep);
    EXPECT_EQ(kept.reused_tokens, aligned.reused_tokens);
    EXPECT_GT(kept.reused_tokens, 60);
    const double diff = test::max_abs_diff(kept.logits, aligned.logits, "kept vs aligned");
    if (scheme == PositionScheme::Depth)
      EXPECT_LT(diff, 1e-4) << "depth positions do not depend on the place: nothing to align";
    else
      EXPECT_GT(diff, 1e-3) << "moved subtrees attended at their old distances";
  }
}

// Greedy decoding from a sparse assembly (reuse) and from the same assembly
// computed in full picks the same tokens with the same logits.
TEST(Strategies, DecodeAfterSparsePrefillEqualsDecodeAfterFullPrefill) {
  const StrategyOptions reuse{PositionScheme::Depth, true}, none{PositionScheme::Depth, false};
  Rig rig("tiny", DType::F32, reuse);
  rig.run("depcache", graph_request({kDog, kCat}, "Which animals?"), reuse);
  const RagRequest b = graph_request({kCat, kDog2}, "Which animals?");
  const int n_vocab = rig.model->config().n_vocab;
  SamplingParams six = test::greedy(6);
  six.token_logits = true;
  RequestResult decoded[2];
  for (int pass = 0; pass < 2; ++pass) {
    decoded[pass] = rig.answer("depcache", make_prompt_parts(rig.tok, b), pass == 0 ? reuse : none, six);
    if (pass == 0) {
      EXPECT_GT(decoded[pass].report.reused_tokens, 0);
    }
    // Six tokens, each picked from its own logits: the prefill's, then five
    // decode steps over the assembly the prefill left.
    ASSERT_EQ(decoded[pass].tokens.size(), 6u);
    ASSERT_EQ(decoded[pass].token_logits.size(), size_t{6} * n_vocab);
    EXPECT_EQ(
        std::vector<float>(decoded[pass].token_logits.begin(), decoded[pass].token_logits.begin() + n_vocab),
        decoded[pass].report.logits);
  }
  for (int i = 0; i < 6; ++i) {
    const auto step = [&](int pass) {
      return std::span<const float>(decoded[pass].token_logits)
          .subspan(static_cast<size_t>(i) * n_vocab, n_vocab);
    };
    EXPECT_LT(test::max_abs_diff(step(0), step(1), "steps[0][i] vs steps[1][i]"), 1e-4) << "step " << i;
  }
  EXPECT_EQ(decoded[0].tokens, decoded[1].tokens);
}

// Documents are one-path trees (reused wherever they sit); a plain-text
// request is system + text + task, whose leading run is reused as a prefix.
TEST(Strategies, DepCacheWithDocumentsAndPlainText) {
  Rig rig("tiny");
  const StrategyOptions reuse{PositionScheme::Depth, true}, none{PositionScheme::Depth, false};
  RagRequest docs;
  docs.question = "Who barks?";
  docs.documents = {{"d1", "Dogs", "Dogs bark at night."}, {"d2", "Cats", "Cats purr."}};
  rig.run("depcache", docs, reuse);
  std::swap(docs.documents[0], docs.documents[1]);
  const PrefillReport with = rig.run("depcache", docs, reuse);
  const PrefillReport without = rig.run("depcache", docs, none);
  const auto task = static_cast<int64_t>(make_prompt_parts(rig.tok, docs).task.size());
  EXPECT_EQ(with.computed_tokens, task);  // system and both documents reused
  EXPECT_LT(test::max_abs_diff(with.logits, without.logits, "with.logits vs without.logits"), 1e-4);

  RagRequest text;
  text.question = "What happened?";
  text.text = "Once upon a time there was a dog.";
  rig.run("depcache", text, reuse);
  const PrefillReport again = rig.run("depcache", text, reuse);
  EXPECT_EQ(again.computed_tokens, 1);  // the whole causal prompt but the logits token
  EXPECT_LT(test::max_abs_diff(again.logits, rig.run("depcache", text, none).logits,
                               "plain text: reuse vs no reuse"),
            1e-4);
  EXPECT_LT(test::max_abs_diff(again.logits, rig.run("full", text).logits, "plain text: depcache vs full"),
            1e-4);  // no trees: plain causal
}

// What a subtree's KV depends on is in its key: the system prompt and the KV
// dtype (and the model, by its fingerprint).
TEST(Strategies, KeysSeparateSystemPromptsAndKvTypes) {
  Rig rig("tiny");
  const RagRequest r = graph_request({kDog, kCat}, "Which animals?");
  rig.run("depcache", r);
  EXPECT_GT(rig.run("depcache", r).reused_tokens, 0);
  RagWrapper other;
  other.system = "Use the paths.\n";
  EXPECT_EQ(rig.run("depcache", r, {}, other).reused_tokens, 1);  // BOS, as a prefix; no subtree
  // The same request keyed for f16 K/V finds none of the f32 K/V.
  const PrefillReport f16 =
      rig.run(*make_strategy("depcache", rig.engine.cache_fingerprint(), DType::F16), r);
  EXPECT_EQ(f16.reused_tokens, 0);
}

// The model's identity covers every weight byte: a copy is the same model,
// one changed weight in the middle of a matrix makes another (whose cached
// K/V must never be served for this one).
TEST(Strategies, FingerprintCoversEveryWeight) {
  RandomModelOptions o;
  o.shape = *model_preset("tiny");
  o.type = DType::F32;
  o.seed = 11;
  const auto a = test::temp_path("fp-a") += ".gguf", b = test::temp_path("fp-b") += ".gguf";
  write_random_model(a, o);
  std::filesystem::copy_file(a, b);
  const uint64_t fa = Model::load(a)->fingerprint();
  EXPECT_EQ(Model::load(b)->fingerprint(), fa) << "a byte-identical copy";
  // blk.1.ffn_up.weight is [64, 160]: element 5000 is far from both ends.
  test::set_f32_weight(b, "blk.1.ffn_up.weight", 5000, 0.125f);
  EXPECT_NE(Model::load(b)->fingerprint(), fa) << "one weight in the middle of a matrix";
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

// depcache.position_scheme round-trips through the GGUF writer and reader
// and sets the default scheme; an unknown value is a clear error.
TEST(Strategies, PositionSchemeMetadataSetsTheDefault) {
  RandomModelOptions o;
  o.shape = *model_preset("tiny");
  const auto path = test::temp_path("scheme") += ".gguf";
  write_random_model(path, o);
  EXPECT_EQ(Model::load(path)->config().position_scheme, "");
  EXPECT_EQ(default_position_scheme(Model::load(path)->config()), kDefaultPositionScheme);
  for (PositionScheme s : {PositionScheme::Depth, PositionScheme::Sequential, PositionScheme::Stacked}) {
    o.position_scheme = std::string(position_scheme_name(s));
    write_random_model(path, o);
    const auto m = Model::load(path);
    EXPECT_EQ(m->config().position_scheme, position_scheme_name(s));
    EXPECT_EQ(default_position_scheme(m->config()), s);
  }
  o.position_scheme = "diagonal";
  write_random_model(path, o);
  try {
    default_position_scheme(Model::load(path)->config());
    ADD_FAILURE() << "an unknown scheme was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("diagonal"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

// depcache.tree_context likewise: absent means trees see the system text.
TEST(Strategies, TreeContextMetadataSetsTheDefault) {
  RandomModelOptions o;
  o.shape = *model_preset("tiny");
  const auto path = test::temp_path("tree-context") += ".gguf";
  write_random_model(path, o);
  EXPECT_EQ(default_tree_context(Model::load(path)->config()), TreeContext::System);
  for (TreeContext c : {TreeContext::None, TreeContext::System}) {
    o.tree_context = std::string(tree_context_name(c));
    write_random_model(path, o);
    EXPECT_EQ(default_tree_context(Model::load(path)->config()), c);
  }
  o.tree_context = "siblings";
  write_random_model(path, o);
  try {
    default_tree_context(Model::load(path)->config());
    ADD_FAILURE() << "an unknown tree context was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("siblings"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

// A model carries its prompt template: written with it, read back, inherited
// from the vocabulary file a model is made from (one part overridden), and
// every part lands where make_prompt_parts puts it.
TEST(Strategies, TheModelsPromptTemplateShapesItsPrompts) {
  RandomModelOptions o;
  o.shape = *model_preset("tiny");
  const auto plain = test::temp_path("tmpl-plain") += ".gguf", own = test::temp_path("tmpl-own") += ".gguf",
             derived = test::temp_path("tmpl-derived") += ".gguf";
  write_random_model(plain, o);
  EXPECT_EQ(Model::load(plain)->config().prompt, RagWrapper{}) << "no keys: the defaults";
  RagWrapper facts;
  facts.system = "Facts:\n";
  facts.task_prefix = "";
  facts.task_suffix = " ->";
  o.prompt = facts;
  write_random_model(own, o);
  const auto model = Model::load(own);
  EXPECT_EQ(model->config().prompt, facts);
  o.prompt.reset();
  o.vocab_from = own;
  write_random_model(derived, o);
  EXPECT_EQ(Model::load(derived)->config().prompt, facts) << "inherited from --vocab-from";
  RagWrapper other = facts;
  other.task_prefix = "Q: ";
  o.prompt = other;
  write_random_model(derived, o);
  EXPECT_EQ(Model::load(derived)->config().prompt, other) << "given parts replace the inherited keys";

  const Tokenizer tok(Vocab::from_gguf(model->file()));
  const RagRequest r = graph_request({kDog}, "Which animal?");
  const PromptParts parts = make_prompt_parts(tok, r, model->config().prompt);
  std::vector<int32_t> system = {tok.bos()};
  for (int32_t t : tok.encode("Facts:\n", false, false)) system.push_back(t);
  EXPECT_EQ(parts.system, system);
  EXPECT_EQ(parts.task, tok.encode("Which animal? ->", false, false));
  EXPECT_LT(parts.n_flat_tokens(), make_prompt_parts(tok, r).n_flat_tokens());
  for (const auto& p : {plain, own, derived}) std::filesystem::remove(p);
}

// A prefill that fails after the cached spans were matched and pinned (here:
// its forward pass, which finds the plan's rows and visibility disagreeing)
// leaves no pin behind: the request's lease releases them as it fails, and
// the index can evict again.
TEST(Strategies, AFailedPrefillLeavesNoPin) {
  for (const char* name : {"prefix", "ragcache", "depcache"}) {
    const StrategyOptions o{PositionScheme::Depth, true};
    Rig rig("tiny", DType::F32, o);
    const RagRequest r = graph_request({kDog, kCat}, "Which animals?");
    rig.run(name, r, o);  // cached now
    const PromptParts parts = make_prompt_parts(rig.tok, r);
    RequestPlan bad = make_strategy(name, rig.engine.cache_fingerprint(), DType::F32, o)->plan(parts);
    ASSERT_FALSE(bad.runs.empty()) << name;
    // Each computed token's K/V is written to one row and attended at the next.
    bad.visibility = [planned = bad.visibility](std::span<const int64_t> computed) {
      std::vector<QueryGroup> groups = planned(computed).groups();
      for (QueryGroup& g : groups) ++g.self_row;
      return Visibility(std::move(groups));
    };
    const RequestId id = rig.engine.submit_plan(std::move(bad), test::greedy(1));
    try {
      rig.engine.wait(id);
      ADD_FAILURE() << name << ": the broken plan was computed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("visibility group"), std::string::npos) << e.what();
    }
    EXPECT_EQ(rig.engine.result(id).state, RequestState::Failed) << name;
    EXPECT_EQ(rig.index.n_pinned(), 0u) << name;
    EXPECT_GT(rig.run(name, r, o).reused_tokens, 0) << name << ": the cache still serves";
    rig.index.evict_to(0);
    EXPECT_EQ(rig.index.bytes(), 0u) << name << ": everything is evictable again";
  }
}

// Planning reads nothing and changes nothing: a plan made before and after
// other requests is the same, and the index is untouched by it.
TEST(Strategies, PlanningHasNoSideEffects) {
  Rig rig("tiny");
  const RagRequest r = graph_request({kDog, kCat}, "Which animals?");
  const auto strategy = make_strategy("depcache", *rig.model, DType::F32, {PositionScheme::Depth, true});
  const PromptParts parts = make_prompt_parts(rig.tok, r);
  const RequestPlan before = strategy->plan(parts);
  EXPECT_EQ(rig.index.n_nodes(), 0u);
  rig.run("depcache", r);
  const size_t nodes = rig.index.n_nodes();
  const RequestPlan after = strategy->plan(parts);
  EXPECT_EQ(rig.index.n_nodes(), nodes);
  EXPECT_EQ(before.tokens, after.tokens);
  EXPECT_EQ(before.positions, after.positions);
  ASSERT_EQ(before.runs.size(), after.runs.size());
  for (size_t i = 0; i < before.runs.size(); ++i) EXPECT_EQ(before.runs[i].tokens, after.runs[i].tokens);
}

TEST(Strategies, ErrorsAreClear) {
  Rig rig("tiny");
  EXPECT_THROW(make_strategy("nope", *rig.model, DType::F32), Error);
  // A pool of 16 rows: the prompt cannot fit.
  Rig small(rig.model, Vocab::builtin_bytes(), DType::F32, {}, 16);
  try {
    small.run("full", graph_request({kDog}, "q"));
    ADD_FAILURE() << "an oversized prompt was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::LimitExceeded);
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// Cache-Craft on a random-weight model: a chunk missed is computed in the
// request's context (so the first request is full prefill) and stored as a
// variant keyed by the chunks before it; the same context again is prefix
// caching; another context places the best variant and fixes ceil(CFO * n)
// of its tokens; CFO 1 everywhere is full prefill. The scores follow the
// paper's formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "chunk_documents.h"
#include "eval/fidelity.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "strategy/cache_craft.h"
#include "strategy/strategy.h"
#include "strategy_rig.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::doc_request;
using test::kBark;
using test::kHoot;
using test::kPurr;
using test::kSwim;

StrategyOptions craft_options(double alpha, int window) {
  StrategyOptions o;
  o.cachecraft_alpha = alpha;
  o.focus_window = window;
  return o;
}

// The shared rig on a qwen2 model, running Cache-Craft with one alpha and
// focus window (the engine's).
struct Rig : test::StrategyRig {
  explicit Rig(double alpha = 1.0, int window = 0)
      : StrategyRig("tiny-qwen2", DType::F32, craft_options(alpha, window)) {}
  PrefillReport run(const RagRequest& r) { return StrategyRig::run("cachecraft", r, options); }
  int64_t chunk_tokens(const RagRequest& r) const {
    int64_t n = 0;
    for (const auto& item : make_prompt_parts(tok, r).items)
      for (const auto& p : item.paths) n += static_cast<int64_t>(p.size());
    return n;
  }
};

TEST(CacheCraft, FitFollowsThePaper) {
  const ChunkVariant v{1, {10, 20, 30}, {1, 2, 1}, 0.7, {}};
  // A and C of A, B, C present: beta = (1 + 1) / 4; in the same order.
  VariantFit f = fit_variant(v, std::vector<uint64_t>{10, 30, 40}, 0.5);
  EXPECT_DOUBLE_EQ(f.beta, 0.5);
  EXPECT_DOUBLE_EQ(f.gamma, 0.0);
  EXPECT_DOUBLE_EQ(f.score, 0.7 * 0.5);
  EXPECT_DOUBLE_EQ(f.cfo, 0.5 * 0.7 * 0.5);
  // Reversed: their one pair is discordant, beta' = 0.
  f = fit_variant(v, std::vector<uint64_t>{30, 10}, 0.5);
  EXPECT_DOUBLE_EQ(f.gamma, 1.0);
  EXPECT_DOUBLE_EQ(f.beta_adjusted, 0.0);
  EXPECT_DOUBLE_EQ(f.cfo, 0.35);
  // All three, one pair of three swapped.
  f = fit_variant(v, std::vector<uint64_t>{20, 10, 30}, 1.0);
  EXPECT_DOUBLE_EQ(f.beta, 1.0);
  EXPECT_NEAR(f.gamma, 1.0 / 3.0, 1e-12);
  // The same context: reused as is; CFO is clamped to 1.
  EXPECT_DOUBLE_EQ(fit_variant(v, std::vector<uint64_t>{10, 20, 30}, 1.0).cfo, 0.0);
  EXPECT_DOUBLE_EQ(fit_variant(v, std::vector<uint64_t>{}, 5.0).cfo, 1.0);
  // Computed first: any context now is new to it.
  const ChunkVariant first{2, {}, {}, 0.5, {}};
  EXPECT_DOUBLE_EQ(fit_variant(first, std::vector<uint64_t>{}, 1.0).beta, 1.0);
  EXPECT_DOUBLE_EQ(fit_variant(first, std::vector<uint64_t>{10}, 1.0).cfo, 0.5);
}

TEST(CacheCraft, FocusedChunksAreCutByTheEntropyOfTheGaps) {
  // Two chunks well above the other two.
  EXPECT_EQ(focused_chunks(std::vector<double>{0.9, 0.1, 0.85, 0.05}), (std::vector<int>{0, 2}));
  // One far above the rest.
  EXPECT_EQ(focused_chunks(std::vector<double>{0.1, 0.12, 0.9, 0.11, 0.1}), (std::vector<int>{2}));
  // Too few to cut, or nothing to tell apart: all focused.
  EXPECT_EQ(focused_chunks(std::vector<double>{0.9, 0.1}), (std::vector<int>{0, 1}));
  EXPECT_EQ(focused_chunks(std::vector<double>{0.3, 0.3, 0.3}), (std::vector<int>{0, 1, 2}));
}

TEST(CacheCraft, VariantsKeepTheNewestPerChunk) {
  ChunkVariants store(2);
  store.add(7, {1, {}, {}, 0.5, {}});
  store.add(7, {2, {}, {}, 0.5, {}});
  store.add(7, {1, {}, {}, 0.6, {}});  // replaces ns 1, now the newest
  store.add(7, {3, {}, {}, 0.5, {}});
  const std::vector<ChunkVariant> vs = store.of(7);
  ASSERT_EQ(vs.size(), 2u);
  EXPECT_EQ(vs[0].ns, 1u);
  EXPECT_DOUBLE_EQ(vs[0].cci, 0.6);
  EXPECT_EQ(vs[1].ns, 3u);
  EXPECT_TRUE(store.of(8).empty());
}

// Saved beside a disk tier for the next process: what is read back is what
// was saved; unreadable lines are dropped and counted; no file, no variants.
TEST(CacheCraft, VariantsSurviveASaveAndLoad) {
  const auto file = test::temp_path("variants") += ".jsonl";
  ChunkVariants store(5);
  store.add(7, {11, {3, 4}, {0.25, 0.5}, 0.75, {2, 0, 1}});
  store.add(8, {12, {}, {}, 0.5, {0}});
  store.save(file);
  {
    std::ofstream out(file, std::ios::app);
    out << "{\"chunk\": 9, \"ns\": 1}\n"  // fields missing
        << "not json\n"                   // garbage
        << R"({"chunk": 9, "ns": 2, "context": [1], "inter": [], "cci": 0.5, "ranked": []})"  // sizes
                                                                                              // disagree
        << "\n";
  }
  ChunkVariants back(5);
  EXPECT_EQ(back.load(file), 3u);
  EXPECT_EQ(back.size(), 2u);
  const std::vector<ChunkVariant> vs = back.of(7);
  ASSERT_EQ(vs.size(), 1u);
  EXPECT_EQ(vs[0].ns, 11u);
  EXPECT_EQ(vs[0].context, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(vs[0].inter, (std::vector<double>{0.25, 0.5}));
  EXPECT_DOUBLE_EQ(vs[0].cci, 0.75);
  EXPECT_EQ(vs[0].ranked, (std::vector<int32_t>{2, 0, 1}));
  ChunkVariants none(5);
  EXPECT_EQ(none.load(test::temp_path("no-such-file")), 0u);
  EXPECT_EQ(none.size(), 0u);
  std::filesystem::remove(file);
}

// A chunk missed is computed in this request's context: the first request
// is full prefill, and the same chunks in the same order again are exact.
TEST(CacheCraft, ChunksComputedInContextAndReusedInTheSameContextAreExact) {
  Rig rig;
  const RagRequest first = doc_request({kBark, kPurr, kHoot}, "Who purrs?");
  const PrefillReport a = rig.run(first);
  EXPECT_EQ(a.reused_tokens, 0);
  EXPECT_LT(test::max_abs_diff(a.logits, rig.full(first).logits, "first vs full"), 1e-4);
  const RagRequest again = doc_request({kBark, kPurr, kHoot}, "Who hunts at night?");
  const PrefillReport b = rig.run(again);
  const PromptParts parts = make_prompt_parts(rig.tok, again);
  EXPECT_EQ(b.reused_tokens, static_cast<int64_t>(parts.system.size()) + rig.chunk_tokens(again));
  EXPECT_LT(test::max_abs_diff(b.logits, rig.full(again).logits, "same context vs full"), 1e-4);
}

// The variants a request learns, as saved: a first chunk's (no earlier
// chunk, not probed) has CCI sigmoid(0) = 0.5 and its tokens in order; a
// later chunk's, probed, attends to the ones before it (CCI above 0.5).
TEST(CacheCraft, VariantsLearnedFromTheProbeAndTheFirstChunkWithout) {
  Rig rig;
  rig.run(doc_request({kBark, kPurr, kHoot}, "Who purrs?"));
  const auto dir = test::temp_path("cachecraft-learned");
  std::filesystem::create_directories(dir);
  rig.engine.save_strategy_state(dir);
  std::ifstream in(dir / kCacheCraftStateFile);
  int first = 0, later = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const auto ranked = j.at("ranked").get<std::vector<int32_t>>();
    if (j.at("context").empty()) {
      ++first;
      EXPECT_EQ(j.at("cci").get<double>(), 0.5);
      for (size_t i = 0; i < ranked.size(); ++i) EXPECT_EQ(ranked[i], static_cast<int32_t>(i));
    } else {
      ++later;
      EXPECT_GT(j.at("cci").get<double>(), 0.5) << line;
      EXPECT_EQ(j.at("inter").size(), j.at("context").size());
      EXPECT_FALSE(std::is_sorted(ranked.begin(), ranked.end())) << line;
    }
  }
  EXPECT_EQ(first, 1);
  EXPECT_EQ(later, 2);
  std::filesystem::remove_all(dir);
}

// In another context the placed variants are fixed by ceil(CFO * n) of their
// tokens: none at alpha 0; all at CFO 1, which is full prefill again.
TEST(CacheCraft, ChunksInAnotherContextAreFixedAsTheirCfoSays) {
  const RagRequest seen = doc_request({kBark, kPurr, kHoot}, "Who purrs?");
  // No chunk's old context is all here (beta = 0 for each).
  const RagRequest moved = doc_request({kSwim, kHoot, kPurr, kBark}, "Who sleeps?");
  int64_t computed[3] = {};
  double diff[3] = {};
  const double alphas[3] = {0.0, 1.0, 1e6};
  for (int i = 0; i < 3; ++i) {
    Rig rig(alphas[i]);
    rig.run(seen);
    const PrefillReport r = rig.run(moved);
    computed[i] = r.computed_tokens;
    diff[i] = test::max_abs_diff(r.logits, rig.full(moved).logits, "moved vs full");
    for (float x : r.logits) ASSERT_TRUE(std::isfinite(x));
    if (i < 2) {
      EXPECT_GT(r.reused_tokens, rig.chunk_tokens(moved) / 2);
    }
  }
  EXPECT_LT(computed[0], computed[1]);
  EXPECT_LT(computed[1], computed[2]);
  EXPECT_GT(diff[0], 1e-3);  // reused as is: not full attention
  EXPECT_LT(diff[2], 1e-4);  // every variant needs a full fix: none is placed
}

// On a trained model (stories260K, 5 layers): chunks moved to other
// contexts, fixed as their metadata says, come closer to full attention than
// chunks reused as computed alone (fullreuse); once the question's focused
// chunks hold for a layer, the other chunks stop being fixed: fewer tokens
// computed, the quality about the same.
TEST(CacheCraft, FixingRestoresQualityOnATrainedModelAndFocusCutsWork) {
  DEPCACHE_REQUIRE_SHARED(path, "models/stories260K-f32.v1.gguf");
  const auto model = Model::load(path);
  const Tokenizer tok(Vocab::from_gguf(model->file()));
  const std::vector<RequestDocument>& docs = test::kStories;
  const std::vector<std::vector<int>> seen = {{0, 1, 2}, {3, 4, 0}, {1, 3, 2, 4}};
  const std::vector<std::vector<int>> asked = {{2, 0, 3}, {4, 3, 1}, {1, 4, 0}, {3, 2, 4}, {2, 1, 0, 4}};
  const auto request = [&](const std::vector<int>& order) {
    std::vector<RequestDocument> ds;
    for (int i : order) ds.push_back(docs[i]);
    return doc_request(ds, "What did they do?");
  };
  struct Arm {
    std::string name;
    int window;
    std::unique_ptr<test::StrategyRig> rig;  // its engine's index, its strategy's variants
    double kl = 0;
    int64_t computed = 0;
    std::vector<LayerDeviation> deviation;  // summed over the asked requests
  };
  std::vector<std::unique_ptr<Arm>> arms;
  for (const auto& [name, window] :
       std::vector<std::pair<std::string, int>>{{"fullreuse", 0}, {"cachecraft", 0}, {"cachecraft", 1}}) {
    auto arm = std::make_unique<Arm>();
    arm->name = name;
    arm->window = window;
    arm->rig = std::make_unique<test::StrategyRig>(model, Vocab::from_gguf(model->file()), DType::F32,
                                                   craft_options(1.0, window), 512);
    arms.push_back(std::move(arm));
  }
  SamplingParams with_kv = test::greedy(1);
  with_kv.prompt_kv = true;
  const auto prefill = [&](test::StrategyRig& rig, const std::string& strategy, const RagRequest& r) {
    return rig.answer(strategy, make_prompt_parts(tok, r), rig.options, with_kv);
  };
  for (auto& arm : arms)
    for (const auto& order : seen) prefill(*arm->rig, arm->name, request(order));
  for (const auto& order : asked) {
    const RagRequest r = request(order);
    // Full attention, nothing reused (on the first arm's engine, beside its index).
    StrategyOptions alone = arms[0]->rig->options;
    alone.reuse = false;
    const RequestResult want_result = arms[0]->rig->answer("full", make_prompt_parts(tok, r), alone, with_kv);
    const PrefillReport& want = want_result.report;
    const KvAssembly want_kv = test::prompt_assembly(model->config(), want_result.prompt_kv);
    for (auto& arm : arms) {
      const RequestResult got_result = prefill(*arm->rig, arm->name, r);
      const PrefillReport& got = got_result.report;
      const KvAssembly got_kv = test::prompt_assembly(model->config(), got_result.prompt_kv);
      // The prompt's rows but the last (the question's last token is never cached).
      const std::vector<LayerDeviation> dev = kv_deviation(want_kv, got_kv, got.prompt_tokens - 1);
      arm->deviation.resize(dev.size());
      for (size_t l = 0; l < dev.size(); ++l) {
        arm->deviation[l].k += dev[l].k / static_cast<double>(asked.size());
        arm->deviation[l].v += dev[l].v / static_cast<double>(asked.size());
      }
      EXPECT_GT(got.reused_tokens, 0) << arm->name;
      const double d = kl_divergence_of_logits(want.logits, got.logits);
      ASSERT_TRUE(std::isfinite(d)) << arm->name;
      arm->kl += d / static_cast<double>(asked.size());
      arm->computed += got.computed_tokens;
    }
  }
  for (const auto& arm : arms) {
    std::printf(
        "[check] stories260K %s (focus window %d): mean KL %.3g, %lld tokens computed; K/V deviation by "
        "layer:",
        arm->name.c_str(), arm->window, arm->kl, static_cast<long long>(arm->computed));
    for (const LayerDeviation& d : arm->deviation) std::printf(" %.3f/%.3f", d.k, d.v);
    std::printf("\n");
  }
  // Layer 0's K/V depend on the token and its position only: whatever the
  // context, reuse there is exact up to the keys' re-rotation; deeper
  // layers drift, and fixing pulls the last layer back.
  for (const auto& arm : arms) {
    EXPECT_LT(arm->deviation.front().k, 1e-5) << arm->name;
    EXPECT_LT(arm->deviation.front().v, 1e-5) << arm->name;
    EXPECT_GT(arm->deviation.back().v, 1e-3) << arm->name;
  }
  EXPECT_LT(arms[1]->deviation.back().v, arms[0]->deviation.back().v);
  EXPECT_LT(arms[1]->kl, arms[0]->kl / 2);
  EXPECT_LT(arms[2]->computed, arms[1]->computed);
  EXPECT_LT(arms[2]->kl, arms[0]->kl);
}

TEST(CacheCraft, RejectsBadOptions) {
  Rig rig;
  StrategyOptions o;
  o.cachecraft_alpha = -1;
  EXPECT_THROW(make_strategy("cachecraft", *rig.model, DType::F32, o), Error);
  o = {};
  o.chunk_variants = 0;
  EXPECT_THROW(make_strategy("cachecraft", *rig.model, DType::F32, o), Error);
  o = {};
  o.focus_window = -2;
  EXPECT_THROW(make_strategy("cachecraft", *rig.model, DType::F32, o), Error);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// Chunk reuse on a random-weight model: a chunk's KV is what it computes
// alone after the system prompt, wherever it is placed; recomputing every
// chunk token gives full prefill, recomputing none gives full reuse; the
// recompute passes compute what their ratio says; selection picks the
// highest scores.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "chunk_documents.h"
#include "eval/fidelity.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "strategy/chunk_reuse.h"
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

// The shared rig, run with a recompute ratio and reuse on or off.
struct Rig : test::StrategyRig {
  using StrategyRig::StrategyRig;
  PrefillReport run(const std::string& strategy, const RagRequest& r, double ratio = 0.15,
                    bool reuse = true) {
    StrategyOptions o;
    o.reuse = reuse;
    o.recompute_ratio = ratio;
    return StrategyRig::run(strategy, r, o);
  }
};

TEST(ChunkReuse, LayoutFollowsTheFlatPrompt) {
  const Tokenizer tok(Vocab::builtin_bytes());
  const PromptParts parts = make_prompt_parts(tok, doc_request({kBark, kPurr}, "Who purrs?"));
  const ChunkLayout l = chunk_layout(parts);
  ASSERT_EQ(l.chunks.size(), 2u);
  EXPECT_EQ(l.system, (RowRange{0, static_cast<int64_t>(parts.system.size())}));
  EXPECT_EQ(l.chunks[0].begin, l.system.end);
  EXPECT_EQ(l.chunks[0].size(), static_cast<int64_t>(parts.items[0].paths[0].size()));
  EXPECT_EQ(l.chunks[1].begin, l.chunks[0].end);
  EXPECT_EQ(l.tail.end, parts.n_flat_tokens());
  EXPECT_EQ(l.tail.size(), static_cast<int64_t>(parts.task.size()));
  EXPECT_EQ(l.chunk_tokens(), l.chunks[0].size() + l.chunks[1].size());
}

TEST(ChunkReuse, TopFractionTakesTheHighestScoresInRowOrder) {
  const std::vector<double> s = {0.1, 0.9, 0.5, 0.9, 0.2, NAN, 0.0};
  EXPECT_EQ(top_fraction(s, 0.0), (std::vector<int64_t>{}));
  EXPECT_EQ(top_fraction(s, 0.3), (std::vector<int64_t>{1, 3, 5}));  // ceil(2.1) = 3; NaN counts as highest
  EXPECT_EQ(top_fraction(s, 2.0 / 7.0), (std::vector<int64_t>{1, 5}));  // of the tied 1 and 3, the earlier
  EXPECT_EQ(top_fraction(s, 1.0).size(), s.size());
  EXPECT_TRUE(top_fraction({}, 0.5).empty());
}

// One chunk after the system prompt: block-diagonal is causal, so full reuse
// is full prefill, computed or placed.
TEST(ChunkReuse, FullReuseOfOneChunkEqualsFullPrefill) {
  for (DType kv : {DType::F32, DType::F16}) {
    Rig rig("tiny", kv);
    const RagRequest r = doc_request({kBark}, "Who barks?");
    const PrefillReport full = rig.run("full", r);
    const PrefillReport first = rig.run("fullreuse", r);
    const PrefillReport second = rig.run("fullreuse", doc_request({kBark}, "When do dogs bark?"));
    EXPECT_EQ(first.reused_tokens, 0);
    EXPECT_LT(test::max_abs_diff(first.logits, full.logits, "first vs full"), 1e-4);
    const auto parts = make_prompt_parts(rig.tok, r);
    EXPECT_EQ(second.reused_tokens,
              static_cast<int64_t>(parts.system.size() + parts.items[0].paths[0].size()));
    const PrefillReport full2 = rig.run("full", doc_request({kBark}, "When do dogs bark?"));
    EXPECT_LT(test::max_abs_diff(second.logits, full2.logits, "second vs full"),
              kv == DType::F32 ? 1e-4 : 2e-3);
  }
}

// A chunk placed somewhere else holds what it computed alone: reuse equals
// computing every chunk alone in this request (keys rotated to the new
// positions: rounding only).
TEST(ChunkReuse, ChunksPlacedAnywhereEqualChunksComputedAlone) {
  // Then with Llama 3's RoPE scaling, Qwen3's per-head norms, Gemma 2's
  // soft-capped attention, Gemma 3's
  // windowed layers with their own RoPE base, Phi-3's fused weights and
  // SmolLM3's layers without RoPE.
  for (const std::string preset : {"tiny-qwen2", "tiny-llama3", "tiny-ministral3", "tiny-qwen3",
                                   "tiny-gemma2", "tiny-gemma3", "tiny-phi3", "tiny-smollm3"}) {
    SCOPED_TRACE(preset);
    Rig rig(preset);
    rig.run("fullreuse", doc_request({kBark, kPurr}, "Who?"));
    const RagRequest moved = doc_request({kHoot, kPurr, kBark}, "Who sleeps?");
    const PrefillReport with = rig.run("fullreuse", moved);
    const PrefillReport without = rig.run("fullreuse", moved, 0, false);
    const auto parts = make_prompt_parts(rig.tok, moved);
    EXPECT_EQ(with.reused_tokens, static_cast<int64_t>(parts.system.size() + parts.items[1].paths[0].size() +
                                                       parts.items[2].paths[0].size()));
    EXPECT_EQ(without.reused_tokens, 0);
    EXPECT_LT(test::max_abs_diff(with.logits, without.logits, "reused vs computed alone"), 1e-4);
    // ...and differs from full attention, which the recompute strategies
    // restore (unless every layer's window ends inside the last chunk, as
    // tiny-phi3's 16 positions do: then the question sees the same either way).
    if (preset == "tiny-phi3") continue;
    const PrefillReport full = rig.run("full", moved);
    EXPECT_GT(test::max_abs_diff(with.logits, full.logits, "full reuse vs full"), 1e-3);
  }
}

// Recomputing every chunk token is full prefill; recomputing none in
// FusionRAG is full reuse.
TEST(ChunkReuse, FullRecomputeEqualsFullPrefillAndNoneEqualsFullReuse) {
  for (const char* preset : {"tiny", "tiny-qwen2", "tiny-gemma2", "tiny-gemma3"}) {
    Rig rig(preset);
    rig.run("fullreuse", doc_request({kBark, kPurr}, "Who?"));
    const RagRequest moved = doc_request({kHoot, kPurr, kBark}, "Who sleeps?");
    const PrefillReport full = rig.run("full", moved);
    const PrefillReport reuse = rig.run("fullreuse", moved);
    for (const char* strategy : {"cacheblend", "fusionrag"}) {
      const PrefillReport all = rig.run(strategy, moved, 1.0);
      EXPECT_GT(all.reused_tokens, 0) << strategy;
      EXPECT_LT(test::max_abs_diff(all.logits, full.logits, std::string(strategy) + " 100% vs full"), 1e-4)
          << preset;
    }
    const PrefillReport none = rig.run("fusionrag", moved, 0.0);
    EXPECT_LT(test::max_abs_diff(none.logits, reuse.logits, "fusionrag 0% vs fullreuse"), 1e-4) << preset;
  }
}

// What each pass computes, in whole-model token equivalents, when every
// chunk is cached: FusionRAG runs the question over the placed chunks, then
// the chosen fraction and the question again; CacheBlend runs every chunk
// token through layers 0-1 and the chosen fraction (and the question) on to
// the end.
TEST(ChunkReuse, ComputedTokensFollowTheRatio) {
  Rig rig("tiny");
  const RagRequest r = doc_request({kBark, kPurr, kHoot}, "Who hunts?");
  rig.run("fullreuse", r);  // every chunk cached
  const auto parts = make_prompt_parts(rig.tok, r);
  const ChunkLayout l = chunk_layout(parts);
  const int64_t chunk = l.chunk_tokens(), tail = l.tail.size();
  const int n_layer = rig.model->config().n_layer;
  for (double ratio : {0.0, 0.15, 0.5}) {
    const auto k = static_cast<int64_t>(std::ceil(ratio * static_cast<double>(chunk) - 1e-9));
    const PrefillReport fusion = rig.run("fusionrag", r, ratio);
    EXPECT_EQ(fusion.reused_tokens, static_cast<int64_t>(parts.system.size()) + chunk);
    EXPECT_EQ(fusion.computed_tokens, 2 * tail + k) << ratio;
    const PrefillReport blend = rig.run("cacheblend", r, ratio);
    const int64_t pairs = (chunk + tail) * (kCacheBlendSelectLayer + 1)  // everything up to selection
                          + (k + tail) * (n_layer - kCacheBlendSelectLayer - 1);
    EXPECT_EQ(blend.computed_tokens, (pairs + n_layer / 2) / n_layer) << ratio;
  }
}

// A chunk missed by the lookup is stored as computed alone, even by a
// strategy that then recomputes part of it for its own request.
TEST(ChunkReuse, WhatIsStoredIsTheChunkAlone) {
  Rig rig("tiny-qwen2");
  const RagRequest r = doc_request({kHoot, kBark}, "Who?");
  rig.run("cacheblend", r, 0.5);  // stores both chunks
  const RagRequest again = doc_request({kHoot, kBark}, "Who hunts?");
  const PrefillReport reused = rig.run("fullreuse", again);
  EXPECT_GT(reused.reused_tokens, 0);
  const PrefillReport alone = rig.run("fullreuse", again, 0, false);
  EXPECT_LT(test::max_abs_diff(reused.logits, alone.logits, "stored by cacheblend vs alone"), 1e-4);
}

// Without realignment (an ablation) chunks keep the positions they had
// computed alone: nothing changes for the first chunk, which sits there.
TEST(ChunkReuse, WithoutRealignmentChunksKeepThePositionsTheyWereComputedAt) {
  Rig rig("tiny-qwen2");
  const auto run = [&](const RagRequest& r, bool realign) {
    StrategyOptions o;
    o.realign = realign;
    return rig.StrategyRig::run("fullreuse", r, o);
  };
  const RagRequest one = doc_request({kBark}, "Who barks?");
  EXPECT_LT(test::max_abs_diff(run(one, false).logits, run(one, true).logits, "one chunk"), 1e-5);
  const RagRequest two = doc_request({kBark, kPurr}, "Who purrs?");
  EXPECT_GT(test::max_abs_diff(run(two, false).logits, run(two, true).logits, "two chunks"), 1e-3);
}

// Quality on a trained model (stories260K): reused chunks never saw the
// chunks before them, and recomputing a fraction of their tokens brings the
// first-token distribution back toward full attention's. The measure is
// mean KL(full || strategy) over requests whose chunks all sit elsewhere
// than where they were computed.
TEST(ChunkReuse, RecomputingRestoresWhatFullReuseLosesOnATrainedModel) {
  DEPCACHE_REQUIRE_SHARED(path, "models/stories260K-f32.v1.gguf");
  const auto model = Model::load(path);
  test::StrategyRig rig(model, Vocab::from_gguf(model->file()), DType::F32, {}, 512);
  const std::vector<RequestDocument>& docs = test::kStories;
  const std::vector<std::vector<int>> orders = {{0, 1, 2}, {2, 0, 3}, {4, 3, 1},
                                                {1, 4, 0}, {3, 2, 4}, {2, 1, 0}};
  const auto prefill = [&](const std::string& strategy, const RagRequest& r, double ratio) {
    StrategyOptions o;
    o.recompute_ratio = ratio;
    return rig.run(strategy, r, o);
  };
  // Every document cached alone, right after the system prompt.
  for (const RequestDocument& d : docs) prefill("fullreuse", doc_request({d}, "Who?"), 0);
  std::map<std::string, double> kl;
  const std::vector<std::pair<std::string, double>> runs = {
      {"fullreuse", 0}, {"cacheblend", 0.3}, {"fusionrag", 0.3}, {"cacheblend", 1}, {"fusionrag", 1}};
  for (const auto& order : orders) {
    RagRequest r = doc_request({docs[order[0]], docs[order[1]], docs[order[2]]}, "What did they do?");
    const PrefillReport full = prefill("full", r, 0);
    for (const auto& [strategy, ratio] : runs) {
      const PrefillReport got = prefill(strategy, r, ratio);
      EXPECT_GT(got.reused_tokens, 0);
      const double d = kl_divergence_of_logits(full.logits, got.logits);
      ASSERT_TRUE(std::isfinite(d)) << strategy;
      kl[strategy + " " + std::to_string(ratio)] += d / static_cast<double>(orders.size());
    }
  }
  for (const auto& [name, value] : kl)
    std::printf("[check] stories260K mean KL(full || %s) = %.3g\n", name.c_str(), value);
  const double reuse = kl["fullreuse " + std::to_string(0.0)];
  EXPECT_GT(reuse, 1e-4) << "reused chunks that never saw the chunks before them";
  // Well chosen, 30% of the tokens take most of the loss away (measured:
  // 4% and 14% of full reuse's KL left; the 30% chosen worst leave ~95%).
  EXPECT_LT(kl["cacheblend " + std::to_string(0.3)], reuse / 3);
  EXPECT_LT(kl["fusionrag " + std::to_string(0.3)], reuse / 3);
  EXPECT_LT(kl["cacheblend " + std::to_string(1.0)], 1e-6);
  EXPECT_LT(kl["fusionrag " + std::to_string(1.0)], 1e-6);
}

// FusionRAG's offline step: a chunk fused after one neighbour holds what it
// computes after the system prompt and that neighbour, so a request with
// both, in that order, is full prefill with nothing recomputed; the chunk's
// plain cache (what fullreuse finds) is untouched by it.
TEST(ChunkReuse, AFusedChunkAfterItsNeighbourIsFullPrefill) {
  for (const char* preset : {"tiny", "tiny-qwen2"}) {
    Rig rig(preset);
    PromptParts fuse = make_prompt_parts(rig.tok, doc_request({kPurr, kBark}, "x"));
    fuse.task.clear();
    // As `chunks fuse` runs it: the plan submitted to the engine.
    const PrefillReport fused =
        rig.finish(rig.engine.submit_plan(fusion_plan(fuse, rig.engine.cache_fingerprint(), rig.kv_type),
                                          test::greedy(1)))
            .report;
    EXPECT_EQ(fused.reused_tokens, 0);
    const RagRequest r = doc_request({kPurr, kBark}, "Who barks?");
    const PrefillReport got = rig.run("fusionrag", r, 0.0);
    const auto parts = make_prompt_parts(rig.tok, r);
    EXPECT_EQ(got.reused_tokens, parts.n_flat_tokens() - static_cast<int64_t>(parts.task.size()));
    const PrefillReport full = rig.run("full", r);
    EXPECT_LT(test::max_abs_diff(got.logits, full.logits, std::string(preset) + " fused vs full"), 1e-4);
    // fullreuse finds the plain caches: the chunk as computed alone.
    const PrefillReport plain = rig.run("fullreuse", r);
    const PrefillReport alone = rig.run("fullreuse", r, 0, false);
    EXPECT_LT(plain.reused_tokens, got.reused_tokens) << "the chunk fused was not stored plain";
    EXPECT_LT(test::max_abs_diff(plain.logits, alone.logits, "plain cache after fusion"), 1e-4);
    EXPECT_GT(test::max_abs_diff(plain.logits, full.logits, "plain vs full"), 1e-3);
  }
}

TEST(ChunkReuse, RejectsARatioOutsideZeroToOne) {
  Rig rig;
  StrategyOptions o;
  o.recompute_ratio = 1.5;
  EXPECT_THROW(make_strategy("cacheblend", *rig.model, DType::F32, o), Error);
  try {
    make_strategy("chunky", *rig.model, DType::F32);
    FAIL() << "an unknown strategy was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fusionrag"), std::string::npos) << e.what();
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

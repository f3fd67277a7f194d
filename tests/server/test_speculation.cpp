// Dynamic speculative pipelining over a real engine loop and a staged BM25
// search: what it starts, stops and keeps follows the search's stages (an
// oracle replays them), and the answer is always the one the final list
// gives without speculation.
#include <gtest/gtest.h>

#include <random>
#include <sstream>
#include <stdexcept>

#include "engine/engine_loop.h"
#include "model/model.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "retrieval/retriever.h"
#include "server/server_client.h"
#include "server/speculation.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// Sentences over a small vocabulary with Zipf-like word frequencies, so query
// terms differ in IDF and an early stage's top-k is sometimes the final one.
Corpus word_corpus(size_t n_docs, uint32_t seed) {
  static const std::vector<std::string> words = {"river",   "castle",  "orchard", "lantern", "harbor",
                                                 "meadow",  "falcon",  "copper",  "glacier", "violin",
                                                 "thunder", "saffron", "marble",  "compass", "willow",
                                                 "ember",   "canyon",  "quartz",  "pepper",  "anchor"};
  std::mt19937 rng(seed);
  std::vector<double> weights;
  for (size_t i = 0; i < words.size(); ++i) weights.push_back(1.0 / static_cast<double>(i + 1));
  std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
  Corpus c;
  for (size_t d = 0; d < n_docs; ++d) {
    std::string text;
    for (int i = 0; i < 10; ++i) text += words[pick(rng)] + (i == 9 ? "." : " ");
    c.docs.push_back({std::to_string(d), "", text});
  }
  return c;
}

std::vector<std::string> questions(size_t n, uint32_t seed) {
  const Corpus words = word_corpus(n, seed);  // reuse its sentences, cut to four words
  std::vector<std::string> out;
  for (const Document& d : words.docs) {
    std::istringstream in(d.text);
    std::string q, w;
    for (int i = 0; i < 4 && in >> w; ++i) q += w + " ";
    out.push_back(q + "?");
  }
  return out;
}

// Questions per stream: fewer in a sanitizer build (each is a prefill; the
// first twelve already bring accepted, rejected and stopped speculations).
constexpr size_t kQuestions = test::kSanitized ? 12 : 24;

std::vector<uint32_t> ids(const std::vector<ScoredDoc>& top) {
  std::vector<uint32_t> out;
  for (const ScoredDoc& d : top) out.push_back(d.doc);
  return out;
}

// What speculation should do for one question, from the search's own stages:
// prefills started (one per change of a non-empty intermediate list) and
// whether the last intermediate list is the final one.
struct Expected {
  int speculations = 0;
  bool accepted = false;
};
Expected replay(const ChunkIndex& index, const std::string& q, size_t k, size_t stages, StageOrder order) {
  std::vector<std::vector<uint32_t>> lists;
  const auto final_hits = index.search_staged(
      q, k, stages,
      [&](const SearchStage& s) {
        lists.push_back(ids(s.top));
        return true;
      },
      order);
  Expected e;
  std::vector<uint32_t> current;
  for (size_t i = 0; i + 1 < lists.size(); ++i) {
    if (!current.empty() && lists[i] == current) continue;
    current = lists[i];
    if (!current.empty()) ++e.speculations;
  }
  std::vector<uint32_t> final_ids;
  for (const ChunkHit& h : final_hits) final_ids.push_back(h.chunk);
  e.accepted = !current.empty() && current == final_ids;
  return e;
}

struct LoopAndCorpus {
  std::shared_ptr<const Model> model = Model::load(test::serve_model_file());
  std::shared_ptr<const Tokenizer> tok = std::make_shared<const Tokenizer>(Vocab::from_gguf(model->file()));
  ChunkIndex index = ChunkIndex::build(word_corpus(40, 3), *tok);
  std::unique_ptr<EngineLoop> loop;
  LoopAndCorpus() {
    EngineOptions eo;
    eo.pool_rows = 8192;
    eo.threads = 2;
    loop = std::make_unique<EngineLoop>(model, eo);
  }
  SpeculativeSearch::PromptOf prompt(const std::string& question) const {
    return [this, question](const std::vector<RequestDocument>& docs) {
      RagRequest r;
      r.question = question;
      r.documents = docs;
      return make_prompt_parts(*tok, r);
    };
  }
};

std::vector<int32_t> answer(const std::shared_ptr<RequestStream>& stream) {
  while (stream->next()) {
  }
  const RequestResult r = stream->result();
  EXPECT_EQ(r.state, RequestState::Finished) << r.error;
  return r.tokens;
}

TEST(Speculation, FollowsTheStagesAndAnswersAsTheFinalListDoes) {
  LoopAndCorpus s;
  SamplingParams sampling;
  sampling.max_tokens = 3;
  sampling.stop_at_eog = false;
  for (const StageOrder order : {StageOrder::Documents, StageOrder::Terms}) {
    SCOPED_TRACE(order == StageOrder::Terms ? "by terms" : "by documents");
    SpeculationOptions plain_options;
    plain_options.stages = 4;
    plain_options.order = order;
    SpeculativeSearch plain(*s.loop, s.index, plain_options);
    SpeculationOptions spec_options = plain_options;
    spec_options.speculate = true;
    spec_options.max_prefill_bs = 8;
    SpeculativeSearch speculative(*s.loop, s.index, spec_options);

    int accepted = 0, rejected = 0, discarded = 0;
    for (const std::string& q : questions(kQuestions, 11)) {
      SCOPED_TRACE(q);
      const SpeculativeSearch::Submitted base = plain.submit(q, 2, s.prompt(q), "full", sampling);
      EXPECT_EQ(base.report.speculations, 0);
      EXPECT_FALSE(base.report.accepted);
      EXPECT_DOUBLE_EQ(base.report.non_overlapped_ms, base.report.search_ms);
      const std::vector<int32_t> expected = answer(base.stream);

      const SpeculativeSearch::Submitted got = speculative.submit(q, 2, s.prompt(q), "full", sampling);
      const Expected e = replay(s.index, q, 2, 4, order);
      EXPECT_EQ(got.report.speculations, e.speculations);
      EXPECT_EQ(got.report.accepted, e.accepted);
      EXPECT_EQ(got.report.discarded, got.report.speculations - (e.accepted ? 1 : 0));
      EXPECT_LE(got.report.non_overlapped_ms, got.report.search_ms);
      ASSERT_EQ(got.documents.size(), base.documents.size());
      for (size_t i = 0; i < got.documents.size(); ++i) EXPECT_EQ(got.documents[i].id, base.documents[i].id);
      EXPECT_EQ(answer(got.stream), expected) << "speculation changed the answer";
      EXPECT_EQ(speculative.in_flight(), 0u);
      (e.accepted ? accepted : rejected) += 1;
      discarded += got.report.discarded;
    }
    // The stream exercises both outcomes and stops speculations on the way.
    EXPECT_GT(accepted, 0);
    EXPECT_GT(rejected, 0);
    EXPECT_GT(discarded, 0);
  }
}

TEST(Speculation, BoundedByMaxPrefillBsAndRefusedListsAreNotSpeculatedOn) {
  LoopAndCorpus s;
  SamplingParams sampling;
  sampling.max_tokens = 2;
  SpeculationOptions o;
  o.stages = 4;
  o.speculate = true;
  o.max_prefill_bs = 0;
  SpeculativeSearch none(*s.loop, s.index, o);
  const std::string q = questions(1, 5).front();
  const SpeculativeSearch::Submitted r = none.submit(q, 2, s.prompt(q), "full", sampling);
  EXPECT_EQ(r.report.speculations, 0) << "no room for a speculative prefill";
  EXPECT_DOUBLE_EQ(r.report.non_overlapped_ms, r.report.search_ms);
  answer(r.stream);

  // Every list is refused: nothing is speculated on and the final refusal is the caller's error.
  o.max_prefill_bs = 4;
  SpeculativeSearch refusing(*s.loop, s.index, o);
  const auto refuse = [](const std::vector<RequestDocument>&) -> PromptParts {
    throw std::invalid_argument("too long");
  };
  EXPECT_THROW(refusing.submit(q, 2, refuse, "full", sampling), std::invalid_argument);
  EXPECT_EQ(refusing.in_flight(), 0u);
  EXPECT_EQ(s.loop->snapshot().waiting, 0u);
}

// The stage latency is paid by every stage, with or without speculation, and
// speculation hides part of it: a speculation accepted before the last stage
// was submitted at least one stage before the search ended.
TEST(Speculation, StageLatencyIsHiddenWhenASpeculationIsAccepted) {
  LoopAndCorpus s;
  SamplingParams sampling;
  sampling.max_tokens = 1;
  SpeculationOptions o;
  o.stages = 4;
  o.speculate = true;
  o.stage_latency = std::chrono::milliseconds(20);
  SpeculativeSearch spec(*s.loop, s.index, o);
  bool seen = false;
  for (const std::string& q : questions(kQuestions, 11)) {
    const SpeculativeSearch::Submitted r = spec.submit(q, 2, s.prompt(q), "full", sampling);
    answer(r.stream);
    // Stages are clamped to the query's distinct terms.
    EXPECT_GE(r.report.stages, 1u);
    EXPECT_GE(r.report.search_ms, static_cast<double>(r.report.stages) * 20.0) << q;
    if (!r.report.accepted) continue;
    seen = true;
    EXPECT_LE(r.report.non_overlapped_ms, r.report.search_ms - 20.0) << q;
  }
  EXPECT_TRUE(seen);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

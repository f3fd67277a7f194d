// What the engine gives a request besides its tokens, on the trained
// stories260K model: logprobs equal to the log-softmax of a float64 forward
// pass over the same tokens (raw logits: before penalties and temperature),
// penalties that pick the token OpenAI's formula predicts, and stop strings
// matched on the decoded text that end generation at the token completing
// them.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "reference_forward.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

struct Stories {
  std::shared_ptr<const Model> model;
  std::shared_ptr<const Tokenizer> tok;
  PromptParts parts;
  EngineOptions options;

  explicit Stories(const std::filesystem::path& path) : model(Model::load(path)) {
    tok = std::make_shared<const Tokenizer>(Vocab::from_gguf(model->file()));
    parts.system = tok->encode("Once upon a time", true, true);
    options = test::engine_options();
    options.tokenizer = tok;
    options.eog_ids = tok->eog_ids();
  }
  RequestResult run(const SamplingParams& sp, std::vector<TokenEvent>* events = nullptr) const {
    Engine e(model, options);
    const RequestId id = e.submit("full", parts, sp, [&](const TokenEvent& ev) {
      if (events) events->push_back(ev);
    });
    e.run_until_idle();
    RequestResult r = e.result(id);
    EXPECT_EQ(r.state, RequestState::Finished) << r.error;
    return r;
  }
  // log-softmax of the float64 reference's logits for each generated token
  // (row i: the distribution token i was drawn from).
  std::vector<std::vector<double>> reference_logprobs(const std::vector<int32_t>& generated) const {
    std::vector<int32_t> all = parts.system;
    all.insert(all.end(), generated.begin(), generated.end() - 1);
    const std::vector<double> logits = test::reference_logits(*model, all);
    const auto n_vocab = static_cast<size_t>(model->config().n_vocab);
    std::vector<std::vector<double>> out;
    for (size_t i = 0; i < generated.size(); ++i) {
      const double* row = logits.data() + (parts.system.size() - 1 + i) * n_vocab;
      const double max = *std::max_element(row, row + n_vocab);
      double sum = 0;
      for (size_t t = 0; t < n_vocab; ++t) sum += std::exp(row[t] - max);
      std::vector<double> lp(n_vocab);
      for (size_t t = 0; t < n_vocab; ++t) lp[t] = row[t] - max - std::log(sum);
      out.push_back(std::move(lp));
    }
    return out;
  }
};

TEST(EngineSampling, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  DEPCACHE_REQUIRE_SHARED(path, "models/stories260K-f32.v1.gguf");
  const Stories s(path);
  for (const float temperature : {0.0f, 1.5f}) {
    SCOPED_TRACE(temperature);
    SamplingParams sp = test::greedy(16);
    sp.sampler.temperature = temperature;
    sp.sampler.seed = 4;
    sp.logprobs = 5;
    std::vector<TokenEvent> events;
    const RequestResult r = s.run(sp, &events);
    ASSERT_EQ(r.logprobs.size(), r.tokens.size()) << "every token's text is in the answer";
    const auto ref = s.reference_logprobs(r.tokens);
    std::string pieces;
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      const TokenLogprob& lp = r.logprobs[i].logprob;
      ASSERT_EQ(lp.token, r.tokens[i]);
      // Raw logits: the same at any temperature.
      EXPECT_NEAR(lp.logprob, ref[i][lp.token], 1e-3) << i;
      ASSERT_EQ(lp.top.size(), 5u);
      double mass = 0;
      for (size_t k = 0; k < lp.top.size(); ++k) {
        ASSERT_TRUE(std::isfinite(lp.top[k].logprob));
        EXPECT_NEAR(lp.top[k].logprob, ref[i][lp.top[k].token], 1e-3) << i;
        if (k > 0) {
          EXPECT_GE(lp.top[k - 1].logprob, lp.top[k].logprob);
        }
        mass += std::exp(lp.top[k].logprob);
      }
      EXPECT_LE(mass, 1.0 + 1e-6);
      const auto ref_best = std::max_element(ref[i].begin(), ref[i].end()) - ref[i].begin();
      EXPECT_EQ(lp.top[0].token, ref_best) << i;
      if (temperature == 0) {
        EXPECT_EQ(lp.top[0].token, lp.token) << "greedy picks the most likely token";
        EXPECT_EQ(lp.top[0].logprob, lp.logprob);
      }
      // Offsets in characters of the text, where each token's piece begins.
      EXPECT_EQ(r.logprobs[i].text_offset, static_cast<int64_t>(pieces.size())) << i;
      pieces += s.tok->token_to_piece(lp.token);
    }
    EXPECT_EQ(pieces, r.text);
    // The events carried the same, token by token, with their text.
    std::vector<OutputLogprob> streamed;
    for (const TokenEvent& ev : events) {
      if (!ev.logprobs.empty()) {
        EXPECT_FALSE(ev.text.empty());
      }
      streamed.insert(streamed.end(), ev.logprobs.begin(), ev.logprobs.end());
    }
    ASSERT_EQ(streamed.size(), r.logprobs.size());
    for (size_t i = 0; i < streamed.size(); ++i)
      EXPECT_EQ(streamed[i].logprob.logprob, r.logprobs[i].logprob.logprob);
  }
  // Not asked: none computed.
  EXPECT_TRUE(s.run(test::greedy(4)).logprobs.empty());
  SamplingParams bad = test::greedy(4);
  bad.logprobs = 21;
  Engine e(s.model, s.options);
  EXPECT_THROW(e.submit("full", s.parts, bad), Error);
}

// With penalties each greedy token is the argmax of the raw logits minus
// OpenAI's penalties over the tokens generated before it. The raw
// log-probabilities of the top 20 (shifted logits) tell which that is,
// whenever the winner is among them (any token outside has a raw
// log-probability at most the 20th's, and positive penalties only lower it).
TEST(EngineSampling, PenaltiesPickTheTokenOpenAIsFormulaPredicts) {
  DEPCACHE_REQUIRE_SHARED(path, "models/stories260K-f32.v1.gguf");
  const Stories s(path);
  SamplingParams plain = test::greedy(48);
  plain.logprobs = 20;
  const RequestResult unpenalized = s.run(plain);
  for (const auto& [presence, frequency] :
       std::vector<std::pair<float, float>>{{0.0f, 0.7f}, {1.2f, 0.0f}, {0.4f, 0.4f}}) {
    SCOPED_TRACE(fmt::format("presence {} frequency {}", presence, frequency));
    SamplingParams sp = plain;
    sp.sampler.presence_penalty = presence;
    sp.sampler.frequency_penalty = frequency;
    const RequestResult r = s.run(sp);
    ASSERT_EQ(r.logprobs.size(), r.tokens.size());
    EXPECT_NE(r.tokens, unpenalized.tokens) << "the story repeats itself: penalties change it";
    std::map<int32_t, int> counts;
    int checked = 0;
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      const std::vector<TokenProb>& top = r.logprobs[i].logprob.top;
      ASSERT_EQ(top.size(), 20u);
      std::vector<std::pair<double, int32_t>> adjusted;
      for (const TokenProb& t : top) {
        const int c = counts.count(t.token) ? counts[t.token] : 0;
        adjusted.emplace_back(t.logprob - c * frequency - (c > 0 ? presence : 0), t.token);
      }
      std::sort(adjusted.rbegin(), adjusted.rend());
      const bool decided =
          adjusted[0].first >= top.back().logprob && adjusted[0].first - adjusted[1].first > 1e-4;
      if (decided) {
        EXPECT_EQ(r.tokens[i], adjusted[0].second) << "token " << i;
        ++checked;
      }
      ++counts[r.tokens[i]];
    }
    EXPECT_GT(checked, 40);
  }
}

// Token ids and where each one's piece begins in the greedy text.
struct Pieces {
  std::vector<std::string> piece;
  std::vector<size_t> begin;
};
Pieces pieces_of(const Tokenizer& tok, const std::vector<int32_t>& tokens) {
  Pieces p;
  size_t at = 0;
  for (int32_t t : tokens) {
    p.piece.push_back(tok.token_to_piece(t));
    p.begin.push_back(at);
    at += p.piece.back().size();
  }
  return p;
}

// A stop string is matched on the decoded text, across token boundaries or
// inside one token; generation ends at the token that completes it (counted
// in usage), the text ends where it begins, and only tokens whose text
// begins before it have logprobs.
TEST(EngineSampling, AStopStringEndsGenerationAtTheTokenCompletingIt) {
  DEPCACHE_REQUIRE_SHARED(path, "models/stories260K-f32.v1.gguf");
  const Stories s(path);
  SamplingParams sp = test::greedy(40);
  const RequestResult all = s.run(sp);
  ASSERT_EQ(all.tokens.size(), 40u);
  const Pieces p = pieces_of(*s.tok, all.tokens);
  struct Case {
    std::string stop;
    size_t completing;  // index of the token that completes it
    size_t cut;         // where it begins in the text
  };
  std::vector<Case> cases;
  // Across a boundary: the last character of a token and the first of the next.
  for (size_t i = 4; i + 1 < all.tokens.size() && cases.empty(); ++i) {
    if (p.piece[i].empty() || p.piece[i + 1].empty()) continue;
    const std::string stop = p.piece[i].substr(p.piece[i].size() - 1) + p.piece[i + 1].substr(0, 1);
    if (all.text.find(stop) == p.begin[i + 1] - 1) cases.push_back({stop, i + 1, p.begin[i + 1] - 1});
  }
  // Inside one token: its second and third characters.
  for (size_t i = 4; i < all.tokens.size() && cases.size() < 2; ++i) {
    if (p.piece[i].size() < 3) continue;
    const std::string stop = p.piece[i].substr(1, 2);
    if (all.text.find(stop) == p.begin[i] + 1) cases.push_back({stop, i, p.begin[i] + 1});
  }
  // Spanning three tokens: the end of one, all of the next, the start of the one after.
  for (size_t i = 4; i + 2 < all.tokens.size() && cases.size() < 3; ++i) {
    if (p.piece[i].empty() || p.piece[i + 1].empty() || p.piece[i + 2].empty()) continue;
    const std::string stop =
        p.piece[i].substr(p.piece[i].size() - 1) + p.piece[i + 1] + p.piece[i + 2].substr(0, 1);
    if (all.text.find(stop) == p.begin[i + 1] - 1) cases.push_back({stop, i + 2, p.begin[i + 1] - 1});
  }
  ASSERT_EQ(cases.size(), 3u) << all.text;
  for (const Case& c : cases) {
    SCOPED_TRACE("stop '" + c.stop + "'");
    SamplingParams stopped = sp;
    stopped.stop = {"never there", c.stop};
    stopped.logprobs = 0;
    std::vector<TokenEvent> events;
    const RequestResult r = s.run(stopped, &events);
    EXPECT_EQ(r.finish_reason, FinishReason::Stop);
    EXPECT_EQ(r.tokens.size(), c.completing + 1);
    EXPECT_EQ(r.text, all.text.substr(0, c.cut));
    std::string streamed;
    for (const TokenEvent& ev : events) streamed += ev.text;
    EXPECT_EQ(streamed, r.text);
    size_t with_text = 0;
    while (with_text < r.tokens.size() && p.begin[with_text] < c.cut) ++with_text;
    EXPECT_EQ(r.logprobs.size(), with_text);
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

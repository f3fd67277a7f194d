// The BPE vocabulary learner: what it learns, that the engine's tokenizer
// reads it back losslessly, and that it is deterministic.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/vocab_learner.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// Sentences over a small made-up world: a few relation words repeated often,
// names less often.
std::vector<std::string> world_text(uint64_t seed, int n) {
  const std::vector<std::string> rels = {"employer", "home", "friend", "teacher"};
  const std::vector<std::string> names = {"Bolam", "Kirat", "Tishaun", "Mezor", "Daikal", "Shivon"};
  std::mt19937_64 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i)
    out.push_back(fmt::format("The {} of {} is {}.\n", rels[rng() % rels.size()], names[rng() % names.size()],
                              names[rng() % names.size()]));
  return out;
}

std::vector<std::string> pieces(const Tokenizer& tok, const std::string& text) {
  std::vector<std::string> out;
  for (int32_t id : tok.encode(text, false, false)) out.push_back(tok.token_to_piece(id));
  return out;
}

TEST(VocabLearner, FrequentWordsBecomeSingleTokens) {
  VocabLearnOptions o;
  o.size = 1000;
  VocabLearnReport rep;
  const Vocab v = learn_bpe_vocab(world_text(1, 500), o, &rep);
  EXPECT_LT(v.n_tokens(), 1000) << "merging stops when every word is whole";
  EXPECT_EQ(rep.n_fragments, 500);
  EXPECT_EQ(rep.n_chars + rep.n_merges + 259, v.n_tokens());
  const Tokenizer tok(v);
  EXPECT_EQ(pieces(tok, "employer"), std::vector<std::string>{" employer"});
  // Every word of a seen sentence is one token, the full stop another: a
  // name is the same token where a sentence ends after it and where not.
  EXPECT_EQ(pieces(tok, "The teacher of Bolam is Kirat."),
            (std::vector<std::string>{" The", " teacher", " of", " Bolam", " is", " Kirat", "."}));
  EXPECT_EQ(pieces(tok, "Kirat"), std::vector<std::string>{" Kirat"});
  for (int32_t id = 259; id < v.n_tokens(); ++id) {
    const std::string& t = v.tokens[static_cast<size_t>(id)];
    if (t.size() > 1 && t.find_first_not_of(".,;:!?") != std::string::npos) {
      EXPECT_EQ(std::string_view(".,;:!?").find(t.back()), std::string_view::npos)
          << "a piece joins a word to the punctuation ending it: " << t;
    }
  }
  // A smaller vocabulary is filled to its size, the most frequent merges first.
  o.size = 300;
  const Vocab small = learn_bpe_vocab(world_text(1, 500), o);
  EXPECT_EQ(small.n_tokens(), 300);
  for (int32_t id = 259; id < 300; ++id) EXPECT_EQ(small.tokens[id], v.tokens[id]) << id;
  // No merge crosses a word: a piece holds at most one space, at its start.
  for (int32_t id = 259; id < v.n_tokens(); ++id) {
    const std::string& t = v.tokens[static_cast<size_t>(id)];
    EXPECT_EQ(t.find("\xE2\x96\x81", 1), std::string::npos) << t;
  }
}

// CSV rows as SubGCache's prompts hold them: ids, names and relation words
// joined by commas.
TEST(VocabLearner, SplitScriptsKeepsIdsWordsAndPunctuationApart) {
  const std::vector<std::string> names = {"Bolam", "Kirat", "Tishaun", "Mezor", "Daikal", "Shivon"};
  std::mt19937_64 rng(3);
  std::vector<std::string> rows;
  for (int i = 0; i < 600; ++i) {
    rows.push_back(fmt::format("{},{}\n", rng() % 40, names[rng() % names.size()]));
    rows.push_back(fmt::format("{},friend,{}\n", rng() % 40, rng() % 40));
  }
  VocabLearnOptions o;
  o.size = 2000;
  const Tokenizer joined(learn_bpe_vocab(rows, o));
  // Without the split, pieces run across the commas.
  EXPECT_NE(pieces(joined, "15,friend,8").size(), 5u);
  o.split_scripts = true;
  const Vocab v = learn_bpe_vocab(rows, o);
  const Tokenizer tok(v);
  // (A fragment's first word keeps the space mark it starts with.)
  EXPECT_EQ(pieces(tok, "15,friend,8"), (std::vector<std::string>{" 15", ",", "friend", ",", "8"}));
  EXPECT_EQ(pieces(tok, "27,Tishaun"), (std::vector<std::string>{" 27", ",", "Tishaun"}));
  for (int32_t id = 259; id < v.n_tokens(); ++id) {
    std::string t = v.tokens[static_cast<size_t>(id)];
    if (t.starts_with("\xE2\x96\x81")) t = t.substr(3);
    const bool digit = t.find_first_of("0123456789") != std::string::npos;
    EXPECT_TRUE(!digit || t.find_first_not_of("0123456789") == std::string::npos) << t;
    EXPECT_TRUE(t.size() == 1 || t.find(',') == std::string::npos) << t;
  }
}

// With the space mark on its own, a name is the same token in a CSV row, in a
// question and as an answer (space-prefixed): a model can match it and copy it.
TEST(VocabLearner, SplitSpacesMakesAWordOneTokenWhereverItStands) {
  const std::vector<std::string> names = {"Bolam", "Kirat", "Tishaun", "Mezor", "Daikal", "Shivon"};
  std::mt19937_64 rng(5);
  std::vector<std::string> texts;
  for (int i = 0; i < 600; ++i) {
    texts.push_back(fmt::format("{},{}\n", rng() % 40, names[rng() % names.size()]));
    texts.push_back(fmt::format("What is the friend of {}?", names[rng() % names.size()]));
  }
  VocabLearnOptions o;
  o.size = 2000;
  o.split_scripts = true;
  const Tokenizer joined(learn_bpe_vocab(texts, o));
  // Without it the question's name is another token than the row's.
  const std::vector<std::string> row = pieces(joined, "27,Kirat");
  const std::vector<std::string> question = pieces(joined, "What is the friend of Kirat?");
  ASSERT_EQ(row.back(), "Kirat");
  EXPECT_EQ(std::find(question.begin(), question.end(), row.back()), question.end());
  o.split_spaces = true;
  const Vocab v = learn_bpe_vocab(texts, o);
  const Tokenizer tok(v);
  EXPECT_EQ(pieces(tok, "27,Tishaun"), (std::vector<std::string>{" ", "27", ",", "Tishaun"}));
  EXPECT_EQ(pieces(tok, "What is the friend of Tishaun?"),
            (std::vector<std::string>{" ", "What", " ", "is", " ", "the", " ", "friend", " ", "of", " ",
                                      "Tishaun", "?"}));
  for (int32_t id = 259; id < v.n_tokens(); ++id) {
    const std::string& t = v.tokens[static_cast<size_t>(id)];
    EXPECT_TRUE(t == "\xE2\x96\x81" || t.find("\xE2\x96\x81") == std::string::npos) << t;
  }
}

TEST(VocabLearner, AnyTextRoundTripsThroughTheEngineTokenizer) {
  VocabLearnOptions o;
  o.size = 1000;
  const Vocab v = learn_bpe_vocab(world_text(2, 200), o);
  const Tokenizer tok(v);
  // Seen and unseen words, other scripts (byte fallback), malformed UTF-8.
  for (const std::string& text :
       {std::string("The friend of Mezor is Daikal.\n"), std::string("Zyxwv quokka!"),
        std::string("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC  two  spaces"),
        std::string("bad \xFF\xC3 bytes\n\n")}) {
    const std::vector<int32_t> ids = tok.encode(text, false, false);
    EXPECT_EQ(tok.decode(ids), text);
  }
  // A token per word (and the full stop) on text like what it learned from.
  const std::string seen = "The home of Shivon is Tishaun.\n";
  EXPECT_EQ(tok.encode(seen, false, false).size(), 8u);
}

TEST(VocabLearner, DeterministicAndShapedByItsText) {
  VocabLearnOptions o;
  o.size = 350;
  const Vocab a = learn_bpe_vocab(world_text(3, 300), o);
  const Vocab b = learn_bpe_vocab(world_text(3, 300), o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.scores, b.scores);
  const Vocab c = learn_bpe_vocab({"Completely different words here.\n", "Different words, again.\n"}, o);
  EXPECT_NE(a.tokens, c.tokens);
  EXPECT_LT(c.n_tokens(), 350) << "little text runs out of pairs seen twice";
}

TEST(VocabLearner, LimitsAreKept) {
  VocabLearnOptions o;
  o.size = 600;
  o.max_piece_chars = 4;
  const Vocab v = learn_bpe_vocab(world_text(4, 300), o);
  for (int32_t id = 259; id < v.n_tokens(); ++id) {
    const std::string& t = v.tokens[static_cast<size_t>(id)];
    size_t chars = 0;
    for (unsigned char ch : t) chars += (ch & 0xC0) != 0x80;
    EXPECT_LE(chars, 4u) << t;
  }
  o.size = 259;
  EXPECT_THROW(learn_bpe_vocab(world_text(4, 10), o), Error);
}

TEST(VocabLearner, WrittenAndReadAsGguf) {
  VocabLearnOptions o;
  o.size = 320;
  const Vocab v = learn_bpe_vocab(world_text(5, 200), o);
  std::vector<std::pair<std::string, GgufValue>> md;
  v.append_gguf_metadata(md);
  GgufWriter w;
  for (auto& [k, value] : md) w.set(k, std::move(value));
  const auto path = test::temp_path("vocab.gguf");
  w.write(path);
  const Vocab back = Vocab::from_gguf(GgufFile::open(path));
  std::filesystem::remove(path);
  EXPECT_EQ(back.tokens, v.tokens);
  EXPECT_EQ(back.scores, v.scores);
  const std::string text = "The employer of Kirat is Bolam.\n";
  EXPECT_EQ(Tokenizer(back).encode(text, true, false), Tokenizer(v).encode(text, true, false));
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// Tokenizers against the reference vocab tests (.inp/.out pairs), plus the
// builtin vocab, streaming decode and vocab validation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "model/gguf.h"
#include "model/pre_tokenizer.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string read_all(const std::filesystem::path& p) {
  std::ifstream is(p, std::ios::binary);
  std::ostringstream ss;
  ss << is.rdbuf();
  return ss.str();
}

// Cases are separated by "\n__ggml_vocab_test__\n"; the file ends with one.
std::vector<std::string> split_cases(const std::string& s) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(sep, pos)) != std::string::npos; pos = hit + sep.size())
    out.push_back(s.substr(pos, hit - pos));
  if (pos < s.size()) out.push_back(s.substr(pos));
  return out;
}

std::vector<std::vector<int32_t>> read_expected(const std::filesystem::path& p) {
  std::vector<std::vector<int32_t>> out;
  std::istringstream is(read_all(p));
  for (std::string line; std::getline(is, line);) {
    std::istringstream ls(line);
    out.emplace_back();
    for (int32_t id; ls >> id;) out.back().push_back(id);
  }
  return out;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

Tokenizer load(const std::filesystem::path& p) { return Tokenizer(Vocab::from_gguf(GgufFile::open(p))); }

// Runs every case of <vocab>.inp against <vocab>.out and checks decode round-trips.
void check_vocab_file(const std::filesystem::path& gguf) {
  const Tokenizer tok = load(gguf);
  const std::vector<std::string> cases = split_cases(read_all(gguf.string() + ".inp"));
  const std::vector<std::vector<int32_t>> expected = read_expected(gguf.string() + ".out");
  ASSERT_EQ(cases.size(), expected.size()) << "case count of .inp and .out differ";
  size_t passed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> got = tok.encode(cases[i], /*add_bos=*/false, /*parse_special=*/true);
    if (got == expected[i]) ++passed;
    EXPECT_EQ(show(got), show(expected[i])) << "case " << i << " text: '" << cases[i] << "'";
    EXPECT_EQ(tok.decode(got), cases[i]) << "round trip of case " << i;
  }
  std::printf("[check] %s: %zu/%zu cases match\n", gguf.filename().c_str(), passed, cases.size());
}

TEST(Tokenizer, LlamaSpmReferenceCases) {
  DEPCACHE_REQUIRE_SHARED(path, "tokenizers/ggml-vocab-llama-spm.gguf");
  check_vocab_file(path);
}

TEST(Tokenizer, Gpt2ReferenceCases) {
  DEPCACHE_REQUIRE_SHARED(path, "tokenizers/ggml-vocab-gpt-2.gguf");
  check_vocab_file(path);
}

// Every vocabulary with test vectors in the leading C++ engine's source
// (scripts/fetch_llama_cpp.sh): all cases match, or loading refuses it with a
// message naming the part it does not implement (listed here, so a newly
// refused vocabulary fails).
TEST(Tokenizer, EveryLlamaCppVocabulary) {
  DEPCACHE_REQUIRE_LLAMA_CPP(models, "models");
  const std::map<std::string, std::string> refused = {
      {"ggml-vocab-bert-bge.gguf", "unsupported tokenizer model 'bert'"},
      {"ggml-vocab-nomic-bert-moe.gguf", "unsupported tokenizer model 't5'"},
  };
  size_t checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(models)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("ggml-vocab-") || entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(name);
    const auto why = refused.find(name);
    if (why != refused.end()) {
      try {
        load(entry.path());
        ADD_FAILURE() << name << " loaded but is listed as refused";
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), HasSubstr(why->second));
      }
      continue;
    }
    if (!std::filesystem::exists(entry.path().string() + ".inp")) {
      EXPECT_NO_THROW(load(entry.path()));  // no vectors: it must at least load
      continue;
    }
    check_vocab_file(entry.path());
    ++checked;
  }
  EXPECT_GE(checked, 14u);
}

std::vector<std::string> pieces(std::string_view pre, std::string_view text) {
  std::vector<std::string> out;
  PreTokenizer(pre).split(text, [&](std::string_view w) { out.emplace_back(w); });
  return out;
}

// What the vocabulary vectors do not reach: combining marks (Qwen3.5), case
// changes (Tekken), sequences of splits (DeepSeek Coder), unknown names.
TEST(PreTokenizer, FamiliesSplitAsPublished) {
  const std::string e_acute = "cafe\xCC\x81";  // e + U+0301 COMBINING ACUTE ACCENT
  EXPECT_THAT(pieces("qwen35", e_acute + " ok"), ElementsAre(e_acute, " ok"));
  EXPECT_THAT(pieces("qwen2", e_acute + " ok"), ElementsAre("cafe", "\xCC\x81", " ok"));
  EXPECT_THAT(pieces("tekken", "HelloWorld 123"), ElementsAre("Hello", "World", " ", "1", "2", "3"));
  EXPECT_THAT(pieces("llama3", "HelloWorld 12345"), ElementsAre("HelloWorld", " ", "123", "45"));
  EXPECT_THAT(pieces("deepseek-coder", "ab\ncd 42"), ElementsAre("ab", "\n", "cd", " ", "4", "2"));
  EXPECT_THAT(pieces("gemma4", "a b\n\nc"), ElementsAre("a b", "\n\n", "c"));
  for (const PreTokenizerSpec& spec : pre_tokenizer_specs())
    for (std::string_view name : spec.names) {
      std::string joined;
      PreTokenizer(name).split("It's 2024: x\r\n  y\xFF!", [&](std::string_view w) { joined += w; });
      EXPECT_EQ(joined, "It's 2024: x\r\n  y\xFF!") << name;  // the pieces cover the text
    }
  try {
    PreTokenizer("no-such-family");
    ADD_FAILURE() << "an unknown pre-tokenizer was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unsupported BPE pre-tokenizer 'no-such-family'"));
    EXPECT_THAT(e.what(), HasSubstr("qwen35"));
  }
}

TEST(Tokenizer, Stories260kOnceUponATime) {
  DEPCACHE_REQUIRE_SHARED(path, "models/stories260K-f32.v1.gguf");
  const Tokenizer tok = load(path);
  EXPECT_TRUE(tok.vocab().add_bos);  // no add_bos key: SentencePiece default
  const std::vector<int32_t> ids = tok.encode("Once upon a time", true, true);
  ASSERT_EQ(ids.size(), 5u) << show(ids);
  EXPECT_EQ(ids[0], tok.bos());
  EXPECT_EQ(tok.token_to_piece(ids[1]), " Once");
  EXPECT_EQ(tok.decode(ids), "Once upon a time");
  EXPECT_TRUE(tok.is_eog(tok.eos()));
  EXPECT_FALSE(tok.is_eog(ids[1]));
  EXPECT_EQ(tok.eog_ids(), std::vector<int32_t>{tok.eos()});
}

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
  DEPCACHE_REQUIRE_SHARED(path, "tokenizers/ggml-vocab-llama-spm.gguf");
  const Tokenizer tok = load(path);
  const std::string text = "<s>Hello</s> world";
  const std::vector<int32_t> on = tok.encode(text, false, true);
  EXPECT_THAT(on, ElementsAre(1, 15043, 2, 29871, 3186)) << show(on);
  EXPECT_EQ(tok.decode(on, /*render_special=*/true), text);
  EXPECT_EQ(tok.decode(on), "Hello world");
  const std::vector<int32_t> off = tok.encode(text, false, false);
  for (int32_t id : off) EXPECT_TRUE(id != 1 && id != 2) << show(off);
  EXPECT_EQ(tok.decode(off), text);
  EXPECT_EQ(tok.encode("", true, true), std::vector<int32_t>{1});
  EXPECT_EQ(tok.encode("Hi", true, true), (std::vector<int32_t>{1, 6324}));
}

TEST(Tokenizer, Gpt2EndOfTextToken) {
  DEPCACHE_REQUIRE_SHARED(path, "tokenizers/ggml-vocab-gpt-2.gguf");
  const Tokenizer tok = load(path);
  const std::string text = "Hello<|endoftext|> world";
  EXPECT_THAT(tok.encode(text, false, true), ElementsAre(15496, 50256, 995));
  const std::vector<int32_t> off = tok.encode(text, false, false);
  EXPECT_GT(off.size(), 3u);
  EXPECT_EQ(tok.decode(off), text);
  EXPECT_EQ(tok.decode(tok.encode(text, false, true), true), text);
  EXPECT_TRUE(tok.is_eog(50256));
  // Invalid UTF-8 passes through byte-level BPE unchanged.
  const std::string bad = "a\xff\xfe b\xe2\x82";
  EXPECT_EQ(tok.decode(tok.encode(bad, false, true)), bad);
}

std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids,
                       std::vector<std::string>* parts) {
  StreamDecoder dec(tok);
  std::string out;
  for (int32_t id : ids) {
    parts->push_back(dec.push(id));
    out += parts->back();
  }
  return out + dec.flush();
}

TEST(Tokenizer, StreamDecoderHoldsBackSplitCharacters) {
  const Tokenizer tok(Vocab::builtin_bytes());
  const std::vector<int32_t> ids = tok.encode("a \xF0\x9F\xA6\x99!", false, true);  // "a 🦙!"
  std::vector<std::string> parts;
  EXPECT_EQ(stream_all(tok, ids, &parts), "a \xF0\x9F\xA6\x99!");
  for (const std::string& p : parts)
    EXPECT_TRUE(p.empty() || p == "a" || p == " \xF0\x9F\xA6\x99" || p == "!" || p == "\xF0\x9F\xA6\x99" ||
                p == " ")
        << "partial output '" << p << "'";

  const Vocab& v = tok.vocab();
  auto byte = [&v](int b) {
    for (int32_t id = 0; id < v.n_tokens(); ++id)
      if (v.tokens[id] == fmt::format("<0x{:02X}>", b)) return id;
    return -1;
  };
  StreamDecoder dec(tok);
  EXPECT_EQ(dec.push(byte(0xF0)), "");
  EXPECT_EQ(dec.push(byte(0x9F)), "");
  EXPECT_EQ(dec.push(byte(0xA6)), "");
  EXPECT_EQ(dec.push(byte(0x99)), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(dec.push(byte(0xFF)), "\xEF\xBF\xBD");  // never valid: replaced at once
  EXPECT_EQ(dec.push(byte(0xE2)), "");              // might still complete
  EXPECT_EQ(dec.push(byte('A')),
            "\xEF\xBF\xBD"
            "A");  // ... but did not
  EXPECT_EQ(dec.push(byte(0xE2)), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");  // an unfinished character at the end
}

TEST(Tokenizer, StreamDecoderSpmByteFallback) {
  DEPCACHE_REQUIRE_SHARED(path, "tokenizers/ggml-vocab-llama-spm.gguf");
  const Tokenizer tok = load(path);
  const std::vector<int32_t> ids = tok.encode("\xF0\x9F\xA6\x99", false, true);  // 🦙
  EXPECT_THAT(ids, ElementsAre(29871, 243, 162, 169, 156));                      // ▁ + 4 byte tokens
  std::vector<std::string> parts;
  EXPECT_EQ(stream_all(tok, ids, &parts), "\xF0\x9F\xA6\x99");
  EXPECT_THAT(parts, ElementsAre("", "", "", "", "\xF0\x9F\xA6\x99"));
  StreamDecoder cont(tok, false, /*starts_text=*/false);  // continuing text keeps its spaces
  EXPECT_EQ(cont.push(3186), " world");
}

TEST(Tokenizer, BuiltinVocabRoundTrips) {
  const Vocab v = Vocab::builtin_bytes();
  EXPECT_GT(v.n_tokens(), 3 + 256 + 300);
  const Tokenizer tok(v);
  const std::string texts[] = {"Once upon a time, there was a little girl named Lily.",
                               "  two  spaces\tand\nnewlines\n",
                               "Grüße, 東京! Ça va? 🦙🚀",
                               "",
                               " ",
                               "x"};
  for (const std::string& t : texts) {
    const std::vector<int32_t> ids = tok.encode(t, true, true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], tok.bos());
    EXPECT_EQ(tok.decode(ids), t);
    EXPECT_LE(ids.size(), t.size() + 2);
  }
  const std::vector<int32_t> the = tok.encode("the", false, false);
  ASSERT_EQ(the.size(), 1u);
  EXPECT_EQ(v.tokens[the[0]], "\xE2\x96\x81the");

  // The metadata it writes reads back as the same vocab.
  std::vector<std::pair<std::string, GgufValue>> meta;
  v.append_gguf_metadata(meta);
  GgufWriter w;
  for (auto& [k, val] : meta) w.set(k, val);
  const std::filesystem::path path = test::temp_path("builtin-vocab.gguf");
  w.write(path);
  const Vocab back = Vocab::from_gguf(GgufFile::open(path));
  std::filesystem::remove(path);
  EXPECT_EQ(back.tokens, v.tokens);
  EXPECT_EQ(back.scores, v.scores);
  EXPECT_EQ(back.types, v.types);
  EXPECT_EQ(back.bos, v.bos);
  EXPECT_EQ(back.eos, v.eos);
  EXPECT_EQ(back.unk, v.unk);
  EXPECT_EQ(Tokenizer(back).encode(texts[0], true, true), tok.encode(texts[0], true, true));
}

TEST(Tokenizer, LongInputIsFast) {
  const Tokenizer tok(Vocab::builtin_bytes());
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  text += std::string(20000, 'a');  // one long word: no quadratic merging
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  EXPECT_EQ(tok.decode(ids), text);
}

// A small GGUF with the given tokenizer keys, read back through the parser.
Vocab vocab_from(const std::vector<std::pair<std::string, GgufValue>>& meta) {
  GgufWriter w;
  for (const auto& [k, v] : meta) w.set(k, v);
  const std::filesystem::path path = test::temp_path("bad-vocab.gguf");
  w.write(path);
  struct Remove {
    std::filesystem::path p;
    ~Remove() { std::filesystem::remove(p); }
  } cleanup{path};
  return Vocab::from_gguf(GgufFile::open(path));
}

GgufValue strings(std::vector<std::string> items) {
  std::vector<GgufValue> out;
  for (auto& s : items) out.push_back(GgufValue::string(std::move(s)));
  return GgufValue::array(GgufType::String, std::move(out));
}

std::string error_of(const std::vector<std::pair<std::string, GgufValue>>& meta) {
  try {
    vocab_from(meta);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    return e.what();
  }
  return "(no error)";
}

TEST(Vocab, RejectsInconsistentMetadata) {
  const GgufValue model = GgufValue::string("llama");
  const GgufValue toks = strings({"<unk>", "<s>", "a", "b", "ab"});
  const GgufValue two_scores = GgufValue::array(GgufType::F32, {GgufValue::f32(0), GgufValue::f32(1)});
  EXPECT_THAT(error_of({{"tokenizer.ggml.model", model},
                        {"tokenizer.ggml.tokens", toks},
                        {"tokenizer.ggml.scores", two_scores}}),
              HasSubstr("tokenizer.ggml.scores has 2 entries but tokenizer.ggml.tokens has 5"));
  EXPECT_THAT(error_of({{"tokenizer.ggml.model", model},
                        {"tokenizer.ggml.tokens", toks},
                        {"tokenizer.ggml.bos_token_id", GgufValue::u32(7)}}),
              HasSubstr("bos_token_id = 7 is out of range"));
  EXPECT_THAT(
      error_of({{"tokenizer.ggml.model", GgufValue::string("bert")}, {"tokenizer.ggml.tokens", toks}}),
      HasSubstr("unsupported tokenizer model 'bert'"));
  EXPECT_THAT(error_of({{"tokenizer.ggml.model", model}, {"tokenizer.ggml.tokens", toks}}),
              HasSubstr("add_bos_token is true but there is no bos_token_id"));
  EXPECT_THAT(error_of({{"tokenizer.ggml.model", model}}), HasSubstr("tokenizer.ggml.tokens is missing"));
  EXPECT_THAT(
      error_of({{"tokenizer.ggml.model", model},
                {"tokenizer.ggml.tokens", toks},
                {"tokenizer.ggml.bos_token_id", GgufValue::u32(1)},
                {"tokenizer.ggml.token_type",
                 GgufValue::array(GgufType::I32, {GgufValue::i32(2), GgufValue::i32(3), GgufValue::i32(9),
                                                  GgufValue::i32(1), GgufValue::i32(1)})}}),
      HasSubstr("tokenizer.ggml.token_type[2] = 9"));

  const GgufValue gpt2 = GgufValue::string("gpt2");
  EXPECT_THAT(error_of({{"tokenizer.ggml.model", gpt2},
                        {"tokenizer.ggml.tokens", toks},
                        {"tokenizer.ggml.merges", strings({"a b", "ab"})}}),
              HasSubstr("tokenizer.ggml.merges[1] = 'ab' is not of the form 'left right'"));
  EXPECT_THAT(error_of({{"tokenizer.ggml.model", gpt2},
                        {"tokenizer.ggml.tokens", toks},
                        {"tokenizer.ggml.merges", strings({"a c"})}}),
              HasSubstr("'c' is not a token"));
  EXPECT_THAT(error_of({{"tokenizer.ggml.model", gpt2},
                        {"tokenizer.ggml.tokens", toks},
                        {"tokenizer.ggml.merges", strings({"b a"})}}),
              HasSubstr("'ba' is not a token"));

  // A valid BPE vocab with an unknown pre-tokenizer loads but cannot make a tokenizer.
  const Vocab ok = vocab_from({{"tokenizer.ggml.model", gpt2},
                               {"tokenizer.ggml.pre", GgufValue::string("mystery")},
                               {"tokenizer.ggml.tokens", toks},
                               {"tokenizer.ggml.merges", strings({"a b"})}});
  EXPECT_FALSE(ok.add_bos);
  EXPECT_FALSE(ok.add_space_prefix);
  try {
    Tokenizer t(ok);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("unsupported BPE pre-tokenizer 'mystery'"));
    EXPECT_THAT(e.what(), HasSubstr("llama3"));
  }
}

TEST(Vocab, TinyBpeMergesByRank) {
  Vocab v;
  v.kind = VocabKind::Bpe;
  v.add_bos = false;
  v.add_space_prefix = false;
  v.tokens = {"a", "b", "c", "ab", "bc", "abc", "\xC4\xA0"};  // Ġ is the stand-in for ' '
  v.scores.assign(v.tokens.size(), 0);
  v.types.assign(v.tokens.size(), TokenType::Normal);
  v.merges = {{"b", "c"}, {"a", "b"}, {"a", "bc"}};
  const Tokenizer tok(v);
  EXPECT_THAT(tok.encode("abc", false, false), ElementsAre(5));         // bc first, then a+bc
  EXPECT_THAT(tok.encode("abab", false, false), ElementsAre(3, 3));     // ab, ab
  EXPECT_THAT(tok.encode("ab c", false, false), ElementsAre(3, 6, 2));  // "ab", " c" -> Ġ c
  EXPECT_EQ(tok.decode(tok.encode("ab c", false, false)), "ab c");
}

// A byte-level vocab with one token per GPT-2 byte stand-in, plus `extra`.
Vocab byte_level_vocab(const std::string& pre, const std::vector<std::string>& extra) {
  Vocab v;
  v.kind = VocabKind::Bpe;
  v.pre = pre;
  v.add_bos = false;
  v.add_space_prefix = false;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80)
      s += static_cast<char>(cp);
    else
      s += {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    v.tokens.push_back(s);
  }
  for (const std::string& e : extra) v.tokens.push_back(e);
  v.scores.assign(v.tokens.size(), 0);
  v.types.assign(v.tokens.size(), TokenType::Normal);
  return v;
}

TEST(Tokenizer, PreTokenizerPatternsDiffer) {
  const std::vector<std::string> extra = {"123", "45",
                                          "\xC4\xA0"
                                          "abc"};  // Ġabc
  const Tokenizer llama3(byte_level_vocab("llama3", extra));
  // Digits go in groups of three and a whole-word token wins over merges.
  EXPECT_THAT(llama3.encode("12345 abc", false, false), ElementsAre(256, 257, 258));
  const Tokenizer qwen2(byte_level_vocab("qwen2", extra));
  EXPECT_EQ(qwen2.encode("12345 abc", false, false).size(), 9u);  // single digits, no merges
  for (const char* pre : {"default", "gpt-2", "llama-bpe"}) {
    const Tokenizer t(byte_level_vocab(pre, extra));
    EXPECT_EQ(t.decode(t.encode("It's 12345 \xE2\x82\xAC!\n\n  x", false, false)),
              "It's 12345 \xE2\x82\xAC!\n\n  x");
  }
}

TEST(Tokenizer, RandomBytesRoundTrip) {
  const Tokenizer tok(Vocab::builtin_bytes());
  const Tokenizer bpe(byte_level_vocab("gpt-2", {}));
  uint32_t state = 12345;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  for (int round = 0; round < 200; ++round) {
    std::string text(next() % 40, '\0');
    for (char& c : text) c = static_cast<char>(next() >> 24);
    for (const Tokenizer* t : {&tok, &bpe}) {
      const std::vector<int32_t> ids = t->encode(text, false, false);
      EXPECT_EQ(t->decode(ids), text);
      StreamDecoder dec(*t);
      std::string streamed;
      for (int32_t id : ids) streamed += dec.push(id);
      streamed += dec.flush();
      std::string expect, pending = text;
      drain_utf8(pending, expect, true);  // the same text made valid
      EXPECT_EQ(streamed, expect);
    }
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

#include "model/vocab.h"

#include <cmath>
#include <limits>
#include <string_view>
#include <unordered_set>

#include "util/error.h"
#include "util/utf8.h"

namespace depcache {
namespace {

constexpr std::string_view kTokens = "tokenizer.ggml.tokens";
constexpr std::string_view kScores = "tokenizer.ggml.scores";
constexpr std::string_view kTypes = "tokenizer.ggml.token_type";
constexpr std::string_view kMerges = "tokenizer.ggml.merges";

const std::vector<GgufValue>* find_array(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find(key);
  return v ? &v->as_array(key) : nullptr;
}

// Special ids: absent, -1 or 0xFFFFFFFF (how some converters spell "none") mean no token.
int32_t read_id(const GgufFile& f, std::string_view key) {
  const std::optional<int64_t> v = f.get_int_or(key);
  if (!v || *v == -1 || *v == 0xFFFFFFFFll) return -1;
  if (*v < 0 || *v > std::numeric_limits<int32_t>::max())
    fail(ErrorKind::InvalidInput, "{} = {} is not a valid token id", key, *v);
  return static_cast<int32_t>(*v);
}

bool read_bool(const GgufFile& f, std::string_view key, bool fallback) {
  const GgufValue* v = f.find(key);
  return v ? v->as_bool(key) : fallback;
}

// Byte tokens are spelled <0xAB>; returns the byte or -1.
int parse_byte_token(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  int value = 0;
  for (char c : s.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9')
      value |= c - '0';
    else if (c >= 'A' && c <= 'F')
      value |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      value |= c - 'a' + 10;
    else
      return -1;
  }
  return value;
}

void check_id(int32_t id, std::string_view name, size_t n) {
  if (id >= 0 && static_cast<size_t>(id) >= n)
    fail(ErrorKind::InvalidInput, "tokenizer.ggml.{} = {} is out of range (the vocab has {} tokens)", name,
         id, n);
}

// Common English words for the builtin vocab; each also contributes its
// prefixes so the SentencePiece bigram merge can reach it one step at a time.
constexpr std::string_view kBuiltinWords =
    "the of and to in is was that for it with as on be at by this had not are but from or have an they which "
    "one you were her all she there would their we him been has when who will more no if out so said what up "
    "its about into than them can only other new some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through back years where much your "
    "way well down should because each just those people how too little state good very make world still own "
    "see men work long get here between both life being under never day same another know while last might "
    "us "
    "great old year off come since against go came right used take three upon once girl boy dog cat tree "
    "happy big small saw looked wanted play friend mom named lily tim ben sun sky home help said asked felt "
    "The He She It They I We There Once One But And Then When What This";
constexpr std::string_view kBuiltinSuffixes = "ing ed er ly tion s es est ment ness ful able 's n't";
constexpr std::string_view kBuiltinChars =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-:;()";

// The tokenizer algorithm named by tokenizer.ggml.model.
VocabKind read_kind(const GgufFile& f) {
  const std::optional<std::string> model = f.get_string_or("tokenizer.ggml.model");
  if (!model) fail(ErrorKind::InvalidInput, "{}: no tokenizer (tokenizer.ggml.model is missing)", f.source());
  if (*model == "llama") return VocabKind::Spm;
  if (*model == "gpt2") return VocabKind::Bpe;
  if (*model == "gemma4") return VocabKind::BpeSpm;
  fail(ErrorKind::InvalidInput,
       "{}: unsupported tokenizer model '{}' (tokenizer.ggml.model); supported: 'llama' (SentencePiece), "
       "'gpt2' (byte-level BPE), 'gemma4' (SentencePiece-style BPE)",
       f.source(), *model);
}

std::vector<std::string> read_tokens(const GgufFile& f) {
  const std::vector<GgufValue>* tokens = find_array(f, kTokens);
  if (!tokens || tokens->empty())
    fail(ErrorKind::InvalidInput, "{}: {} is missing or empty", f.source(), kTokens);
  if (tokens->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail(ErrorKind::InvalidInput, "{}: too many tokens ({})", kTokens, tokens->size());
  const size_t n = tokens->size();
  std::vector<std::string> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto* s = std::get_if<std::string>(&(*tokens)[i].data);
    if (!s) fail(ErrorKind::InvalidInput, "{}[{}] is not a string", kTokens, i);
    out.push_back(*s);
  }
  return out;
}

// The n tokens' scores; 0 without the key.
std::vector<float> read_scores(const GgufFile& f, size_t n) {
  std::vector<float> out(n, 0.0f);
  if (const std::vector<GgufValue>* scores = find_array(f, kScores)) {
    if (scores->size() != n)
      fail(ErrorKind::InvalidInput, "{} has {} entries but {} has {}", kScores, scores->size(), kTokens, n);
    for (size_t i = 0; i < n; ++i) {
      if (!(*scores)[i].is_number()) fail(ErrorKind::InvalidInput, "{}[{}] is not a number", kScores, i);
      out[i] = static_cast<float>((*scores)[i].as_float(kScores));
    }
  }
  return out;
}

// The n tokens' types; Normal without the key (and for type 0).
std::vector<TokenType> read_types(const GgufFile& f, size_t n) {
  std::vector<TokenType> out(n, TokenType::Normal);
  if (const std::vector<GgufValue>* types = find_array(f, kTypes)) {
    if (types->size() != n)
      fail(ErrorKind::InvalidInput, "{} has {} entries but {} has {}", kTypes, types->size(), kTokens, n);
    for (size_t i = 0; i < n; ++i) {
      if (!(*types)[i].is_integer()) fail(ErrorKind::InvalidInput, "{}[{}] is not an integer", kTypes, i);
      const int64_t t = (*types)[i].as_int(kTypes);
      if (t < 0 || t > 6)
        fail(ErrorKind::InvalidInput, "{}[{}] = {} is not a token type (1 normal .. 6 byte)", kTypes, i, t);
      out[i] = t == 0 ? TokenType::Normal : static_cast<TokenType>(t);
    }
  }
  return out;
}

// The BPE merges, split into their left and right parts; none without the key.
std::vector<std::pair<std::string, std::string>> read_merges(const GgufFile& f) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::vector<GgufValue>* merges = find_array(f, kMerges);
  if (!merges) return out;
  out.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const auto* s = std::get_if<std::string>(&(*merges)[i].data);
    if (!s) fail(ErrorKind::InvalidInput, "{}[{}] is not a string", kMerges, i);
    // The separator is the first space after position 0: a left part never starts with it.
    const size_t sp = s->size() > 1 ? s->find(' ', 1) : std::string::npos;
    if (sp == std::string::npos || sp + 1 >= s->size())
      fail(ErrorKind::InvalidInput, "{}[{}] = '{}' is not of the form 'left right'", kMerges, i, *s);
    out.emplace_back(s->substr(0, sp), s->substr(sp + 1));
  }
  return out;
}

}  // namespace

Vocab Vocab::from_gguf(const GgufFile& f) {
  Vocab v;
  v.kind = read_kind(f);
  v.pre = f.get_string_or("tokenizer.ggml.pre").value_or(v.kind == VocabKind::BpeSpm ? "gemma4" : "default");
  v.tokens = read_tokens(f);
  v.scores = read_scores(f, v.tokens.size());
  v.types = read_types(f, v.tokens.size());
  // SentencePiece files sometimes carry merges too; its algorithm uses scores instead.
  if (v.kind != VocabKind::Spm) v.merges = read_merges(f);

  v.bos = read_id(f, "tokenizer.ggml.bos_token_id");
  v.eos = read_id(f, "tokenizer.ggml.eos_token_id");
  v.unk = read_id(f, "tokenizer.ggml.unknown_token_id");
  v.pad = read_id(f, "tokenizer.ggml.padding_token_id");
  v.eot = read_id(f, "tokenizer.ggml.eot_token_id");
  const bool spm = v.kind == VocabKind::Spm;
  v.add_bos = read_bool(f, "tokenizer.ggml.add_bos_token", spm);
  v.add_eos = read_bool(f, "tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = read_bool(f, "tokenizer.ggml.add_space_prefix", spm);
  v.chat_template = f.get_string_or("tokenizer.chat_template").value_or("");
  v.validate();
  return v;
}

void Vocab::validate() const {
  const size_t n = tokens.size();
  if (n == 0) fail(ErrorKind::InvalidInput, "the vocab has no tokens");
  if (scores.size() != n)
    fail(ErrorKind::InvalidInput, "{} has {} entries but {} has {}", kScores, scores.size(), kTokens, n);
  if (types.size() != n)
    fail(ErrorKind::InvalidInput, "{} has {} entries but {} has {}", kTypes, types.size(), kTokens, n);
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(scores[i])) fail(ErrorKind::InvalidInput, "{}[{}] is not finite", kScores, i);
    const auto t = static_cast<int32_t>(types[i]);
    if (t < 1 || t > 6) fail(ErrorKind::InvalidInput, "{}[{}] = {} is not a token type", kTypes, i, t);
    if (types[i] == TokenType::Byte && parse_byte_token(tokens[i]) < 0)
      fail(ErrorKind::InvalidInput, "token {} '{}' has type byte but is not spelled <0xXX>", i, tokens[i]);
  }
  check_id(bos, "bos_token_id", n);
  check_id(eos, "eos_token_id", n);
  check_id(unk, "unknown_token_id", n);
  check_id(pad, "padding_token_id", n);
  check_id(eot, "eot_token_id", n);
  if (add_bos && bos < 0)
    fail(ErrorKind::InvalidInput, "tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
  if (add_eos && eos < 0)
    fail(ErrorKind::InvalidInput, "tokenizer.ggml.add_eos_token is true but there is no eos_token_id");

  if (!merges.empty()) {
    std::unordered_set<std::string_view> known;
    known.reserve(tokens.size());
    known.insert(tokens.begin(), tokens.end());
    std::string joined;
    for (size_t i = 0; i < merges.size(); ++i) {
      const auto& [left, right] = merges[i];
      if (left.empty() || right.empty())
        fail(ErrorKind::InvalidInput, "{}[{}] = '{} {}' has an empty side", kMerges, i, left, right);
      joined.assign(left).append(right);
      for (std::string_view part :
           {std::string_view(left), std::string_view(right), std::string_view(joined)})
        if (!known.count(part))
          fail(ErrorKind::InvalidInput, "{}[{}] = '{} {}': '{}' is not a token", kMerges, i, left, right,
               part);
    }
  }
}

Vocab Vocab::builtin_bytes() {
  Vocab v;
  v.kind = VocabKind::Spm;
  auto add = [&v](std::string text, float score, TokenType type) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, TokenType::Unknown);
  add("<s>", 0, TokenType::Control);
  add("</s>", 0, TokenType::Control);
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 0, TokenType::Byte);

  // Merge order follows insertion order: earlier pieces get higher scores.
  std::unordered_set<std::string> seen;
  auto piece = [&](const std::string& text) {
    if (seen.insert(text).second) add(text, -static_cast<float>(seen.size()), TokenType::Normal);
  };
  piece(std::string(kSpaceMark));
  for (char c : kBuiltinChars) piece(std::string(1, c));
  auto with_prefixes = [&](std::string_view head, std::string_view word) {
    for (size_t len = 1; len <= word.size(); ++len)
      piece(std::string(head) + std::string(word.substr(0, len)));
  };
  auto for_each_word = [](std::string_view list, auto&& fn) {
    size_t pos = 0;
    while (pos < list.size()) {
      size_t end = list.find(' ', pos);
      if (end == std::string_view::npos) end = list.size();
      if (end > pos) fn(list.substr(pos, end - pos));
      pos = end + 1;
    }
  };
  for_each_word(kBuiltinSuffixes, [&](std::string_view w) { with_prefixes("", w); });
  for_each_word(kBuiltinWords, [&](std::string_view w) { with_prefixes(kSpaceMark, w); });
  v.add_bos = true;
  v.add_eos = false;
  v.add_space_prefix = true;
  return v;
}

void Vocab::append_gguf_metadata(std::vector<std::pair<std::string, GgufValue>>& out) const {
  out.emplace_back("tokenizer.ggml.model", GgufValue::string(kind == VocabKind::Spm   ? "llama"
                                                             : kind == VocabKind::Bpe ? "gpt2"
                                                                                      : "gemma4"));
  out.emplace_back("tokenizer.ggml.pre", GgufValue::string(pre));
  std::vector<GgufValue> toks, scs, tys;
  toks.reserve(tokens.size());
  scs.reserve(tokens.size());
  tys.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    toks.push_back(GgufValue::string(tokens[i]));
    scs.push_back(GgufValue::f32(scores[i]));
    tys.push_back(GgufValue::i32(static_cast<int32_t>(types[i])));
  }
  out.emplace_back(std::string(kTokens), GgufValue::array(GgufType::String, std::move(toks)));
  out.emplace_back(std::string(kScores), GgufValue::array(GgufType::F32, std::move(scs)));
  out.emplace_back(std::string(kTypes), GgufValue::array(GgufType::I32, std::move(tys)));
  if (!merges.empty()) {
    std::vector<GgufValue> ms;
    ms.reserve(merges.size());
    for (const auto& [l, r] : merges) ms.push_back(GgufValue::string(l + " " + r));
    out.emplace_back(std::string(kMerges), GgufValue::array(GgufType::String, std::move(ms)));
  }
  const std::pair<const char*, int32_t> ids[] = {{"tokenizer.ggml.bos_token_id", bos},
                                                 {"tokenizer.ggml.eos_token_id", eos},
                                                 {"tokenizer.ggml.unknown_token_id", unk},
                                                 {"tokenizer.ggml.padding_token_id", pad},
                                                 {"tokenizer.ggml.eot_token_id", eot}};
  for (const auto& [key, id] : ids)
    if (id >= 0) out.emplace_back(key, GgufValue::u32(static_cast<uint32_t>(id)));
  out.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::boolean(add_bos));
  out.emplace_back("tokenizer.ggml.add_eos_token", GgufValue::boolean(add_eos));
  out.emplace_back("tokenizer.ggml.add_space_prefix", GgufValue::boolean(add_space_prefix));
  if (!chat_template.empty()) out.emplace_back("tokenizer.chat_template", GgufValue::string(chat_template));
}

}  // namespace depcache

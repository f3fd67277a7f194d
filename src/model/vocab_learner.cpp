#include "model/vocab_learner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <unordered_map>

#include "util/error.h"
#include "util/utf8.h"

namespace depcache {
namespace {

// <unk>, <s>, </s> and the byte tokens.
constexpr int32_t kFixedTokens = 3 + 256;

struct Word {
  std::vector<int32_t> symbols;  // indices into the learner's pieces
  int64_t count = 0;
};

// Punctuation that ends a sentence or clause.
bool is_sentence_punctuation(char c) { return std::string_view(".,;:!?").find(c) != std::string_view::npos; }

// The words of one normalised fragment: each starts at a space mark (or the
// fragment's start); a newline is a word of its own, and so is the sentence
// punctuation ending a word, so that no piece joins a word to it: a name is
// the same tokens whether a sentence ends after it or not, and a model that
// reads "is Tirsa." can answer " Tirsa" by copying. Characters as the
// tokenizer splits them (a malformed byte stands alone).
void split_words(const std::string& s, const VocabLearnOptions& o, std::map<std::string, int64_t>& words) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::string word;
  // With split_scripts: the class of the word's last character (0 none or a
  // space mark, 1 digit, 2 anything else).
  int last_class = 0;
  const auto flush = [&] {
    size_t head = word.size();
    while (head > 0 && is_sentence_punctuation(word[head - 1])) --head;
    if (head > 0 && head < word.size()) {
      ++words[word.substr(0, head)];
      ++words[word.substr(head)];
    } else if (!word.empty()) {
      ++words[word];
    }
    word.clear();
    last_class = 0;
  };
  for (size_t i = 0; i < s.size();) {
    const size_t len = std::max<size_t>(1, utf8_char_len(p + i, s.size() - i));
    const std::string_view c(s.data() + i, len);
    i += len;
    if (c == kSpaceMark) {
      flush();
      if (o.split_spaces) {
        ++words[std::string(c)];
        continue;
      }
    }
    if (c == "\n") {
      flush();
      ++words["\n"];
      continue;
    }
    if (o.split_scripts && c != kSpaceMark) {
      const unsigned char b = static_cast<unsigned char>(c[0]);
      if (len == 1 && std::ispunct(b)) {
        flush();
        ++words[std::string(c)];
        continue;
      }
      const int cls = len == 1 && std::isdigit(b) ? 1 : 2;
      if (last_class != 0 && cls != last_class) flush();
      last_class = cls;
    }
    word.append(c);
  }
  flush();
}

std::vector<std::string> chars_of(const std::string& word) {
  std::vector<std::string> out;
  const auto* p = reinterpret_cast<const unsigned char*>(word.data());
  for (size_t i = 0; i < word.size();) {
    const size_t len = std::max<size_t>(1, utf8_char_len(p + i, word.size() - i));
    out.emplace_back(word.substr(i, len));
    i += len;
  }
  return out;
}

// Each word as its characters, with its count.
using CharSplit = std::vector<std::pair<std::vector<std::string>, int64_t>>;

// The learner's pieces (characters first, then merges) and the words over them.
struct BpeState {
  std::vector<std::string> pieces;
  std::vector<int32_t> piece_chars;
  std::unordered_map<std::string, int32_t> piece_id;
  std::vector<Word> words;
  std::vector<int32_t> merge_tokens;  // pieces made by merges, in rank order
};

// Characters, most frequent first, at most `room` of them.
std::vector<std::pair<std::string, int64_t>> ranked_chars(const CharSplit& split, int64_t room) {
  std::unordered_map<std::string, int64_t> char_counts;
  for (const auto& [cs, n] : split)
    for (const std::string& c : cs) char_counts[c] += n;
  std::vector<std::pair<std::string, int64_t>> ranked(char_counts.begin(), char_counts.end());
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  // A malformed byte is no character: byte fallback covers it.
  std::erase_if(ranked, [](const auto& c) {
    return utf8_char_len(reinterpret_cast<const unsigned char*>(c.first.data()), c.first.size()) == 0;
  });
  if (static_cast<int64_t>(ranked.size()) > room) ranked.resize(room);
  return ranked;
}

// Words over pieces; a character without a piece splits its word (it
// will be bytes) and is left out, so no merge spans it.
std::vector<Word> words_over_pieces(const CharSplit& split,
                                    const std::unordered_map<std::string, int32_t>& piece_id) {
  std::vector<Word> words;
  for (const auto& [cs, n] : split) {
    Word w{{}, n};
    const auto end_word = [&] {
      if (w.symbols.size() > 1) words.push_back(w);
      w.symbols.clear();
    };
    for (const std::string& c : cs) {
      const auto it = piece_id.find(c);
      if (it == piece_id.end())
        end_word();
      else
        w.symbols.push_back(it->second);
    }
    end_word();
  }
  return words;
}

struct BestPair {
  uint64_t key = 0;  // left piece << 32 | right piece
  int64_t count = 0;
  std::string text;
};

// The most frequent adjacent pair (ties: the smaller concatenation), counted
// afresh; the words are few enough for that. A count of 0: none qualifies.
BestPair best_pair(const BpeState& st, const VocabLearnOptions& o) {
  std::unordered_map<uint64_t, int64_t> pair_counts;
  for (const Word& w : st.words)
    for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
      const int32_t a = w.symbols[i], b = w.symbols[i + 1];
      if (st.piece_chars[a] + st.piece_chars[b] > o.max_piece_chars) continue;
      pair_counts[(static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b)] += w.count;
    }
  BestPair best;
  for (const auto& [key, n] : pair_counts) {
    if (n < best.count || n < o.min_pair_count) continue;
    std::string text = st.pieces[key >> 32] + st.pieces[key & 0xFFFFFFFFu];
    if (n > best.count || text < best.text) {
      best.key = key, best.count = n;
      best.text = std::move(text);
    }
  }
  return best;
}

// Replaces each adjacent (a, b) in the words by `merged`; drops words left
// with a single symbol.
void apply_merge(std::vector<Word>& words, int32_t a, int32_t b, int32_t merged) {
  for (Word& w : words) {
    std::vector<int32_t>& s = w.symbols;
    size_t out = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        s[out++] = merged;
        ++i;
      } else {
        s[out++] = s[i];
      }
    }
    s.resize(out);
  }
  std::erase_if(words, [](const Word& w) { return w.symbols.size() < 2; });
}

// One merge round; false when no pair qualifies.
bool merge_best_pair(BpeState& st, const VocabLearnOptions& o) {
  const BestPair best = best_pair(st, o);
  if (best.count == 0) return false;
  const auto a = static_cast<int32_t>(best.key >> 32), b = static_cast<int32_t>(best.key & 0xFFFFFFFFu);
  int32_t merged;
  if (const auto it = st.piece_id.find(best.text); it != st.piece_id.end()) {
    merged = it->second;  // made before from another split of the same text
  } else {
    merged = static_cast<int32_t>(st.pieces.size());
    st.piece_id.emplace(best.text, merged);
    st.pieces.push_back(best.text);
    st.piece_chars.push_back(st.piece_chars[a] + st.piece_chars[b]);
    st.merge_tokens.push_back(merged);
  }
  apply_merge(st.words, a, b, merged);
  return true;
}

// The fixed tokens, then the characters, then the merges in rank order.
Vocab vocab_of(const BpeState& st, int32_t n_chars) {
  Vocab v;
  v.kind = VocabKind::Spm;
  const auto add = [&v](std::string text, float score, TokenType type) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  add("<unk>", 0, TokenType::Unknown);
  add("<s>", 0, TokenType::Control);
  add("</s>", 0, TokenType::Control);
  v.unk = 0, v.bos = 1, v.eos = 2;
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 0, TokenType::Byte);
  // Characters are never the result of a merge: their score is not used.
  for (int32_t i = 0; i < n_chars; ++i) add(st.pieces[i], 0, TokenType::Normal);
  for (size_t r = 0; r < st.merge_tokens.size(); ++r)
    add(st.pieces[st.merge_tokens[r]], -static_cast<float>(r + 1), TokenType::Normal);
  v.add_bos = true;
  v.add_eos = false;
  v.add_space_prefix = true;
  v.validate();
  return v;
}

}  // namespace

Vocab learn_bpe_vocab(const std::vector<std::string>& fragments, const VocabLearnOptions& o,
                      VocabLearnReport* report) {
  if (o.size <= kFixedTokens)
    fail(ErrorKind::InvalidInput,
         "a vocabulary of {} tokens leaves no room: {} are fixed (<unk>, <s>, </s>, bytes)", o.size,
         kFixedTokens);
  VocabLearnReport rep;
  std::map<std::string, int64_t> word_counts;  // ordered: the result does not depend on hashing
  for (const std::string& f : fragments) {
    split_words(spm_normalized(f, /*prefix=*/true), o, word_counts);
    ++rep.n_fragments;
  }
  CharSplit split;
  for (const auto& [w, n] : word_counts) {
    auto cs = chars_of(w);
    rep.n_chars_seen += n * static_cast<int64_t>(cs.size());
    split.emplace_back(std::move(cs), n);
  }

  BpeState st;
  for (const auto& [c, n] : ranked_chars(split, o.size - kFixedTokens)) {
    st.piece_id.emplace(c, static_cast<int32_t>(st.pieces.size()));
    st.pieces.push_back(c);
    st.piece_chars.push_back(1);
  }
  rep.n_chars = static_cast<int32_t>(st.pieces.size());
  st.words = words_over_pieces(split, st.piece_id);
  while (kFixedTokens + static_cast<int32_t>(st.pieces.size()) < o.size)
    if (!merge_best_pair(st, o)) break;
  rep.n_merges = static_cast<int32_t>(st.merge_tokens.size());

  Vocab v = vocab_of(st, rep.n_chars);
  if (report) *report = rep;
  return v;
}

}  // namespace depcache

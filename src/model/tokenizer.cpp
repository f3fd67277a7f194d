#include "model/tokenizer.h"

#include <algorithm>
#include <array>
#include <optional>
#include <queue>
#include <unordered_map>

#include "model/pre_tokenizer.h"
#include "util/error.h"
#include "util/utf8.h"

namespace depcache {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

struct Tokenizer::Impl {
  Vocab v;
  std::unordered_map<std::string_view, int32_t> piece_id;  // normal tokens only (first wins)
  std::array<int32_t, 256> byte_id{};                      // <0xXX> tokens, -1 if absent
  std::array<std::vector<int32_t>, 256> specials;          // by first byte, longest first
  std::vector<bool> eog;
  // Byte-level BPE.
  std::optional<PreTokenizer> pre;
  std::array<std::string, 256> byte_chars;  // byte -> its GPT-2 stand-in character
  std::array<int16_t, 512> char_byte{};     // stand-in code point -> byte, -1 if none
  std::array<int32_t, 256> byte_char_id{};  // byte -> token of its stand-in, -1 if none
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge;  // (left, right) -> (rank, result)

  int32_t find_piece(std::string_view s) const {
    const auto it = piece_id.find(s);
    return it == piece_id.end() ? -1 : it->second;
  }
  void spm_fragment(std::string_view text, bool prefix, std::vector<int32_t>& out) const;
  void bpe_fragment(std::string_view text, bool prefix, std::vector<int32_t>& out) const;
  void bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void emit_unknown(std::string_view what, std::vector<int32_t>& out) const;
};

Tokenizer::Tokenizer(Vocab vocab) {
  vocab.validate();
  auto impl = std::make_shared<Impl>();
  impl->v = std::move(vocab);
  const Vocab& v = impl->v;
  impl->byte_id.fill(-1);
  impl->eog.assign(v.tokens.size(), false);
  // Control tokens that end a turn in common chat vocabularies, besides eos/eot.
  const std::string_view end_of_turn[] = {"<|endoftext|>", "<|eot_id|>", "<|im_end|>", "<|end|>",
                                          "<end_of_turn>"};
  impl->piece_id.reserve(v.tokens.size());
  for (int32_t id = 0; id < v.n_tokens(); ++id) {
    const std::string& text = v.tokens[id];
    switch (v.type(id)) {
      case TokenType::Normal:
        impl->piece_id.emplace(text, id);
        break;
      case TokenType::Byte: {
        const int b = std::stoi(text.substr(3, 2), nullptr, 16);  // validate() checked <0xXX>
        if (impl->byte_id[b] < 0) impl->byte_id[b] = id;
        break;
      }
      case TokenType::Control:
        if (std::find(std::begin(end_of_turn), std::end(end_of_turn), text) != std::end(end_of_turn))
          impl->eog[id] = true;
        [[fallthrough]];
      case TokenType::UserDefined:
      case TokenType::Unknown:
        if (!text.empty()) impl->specials[static_cast<unsigned char>(text[0])].push_back(id);
        break;
      case TokenType::Unused:
        break;
    }
  }
  for (auto& list : impl->specials)
    std::stable_sort(list.begin(), list.end(),
                     [&v](int32_t a, int32_t b) { return v.tokens[a].size() > v.tokens[b].size(); });
  if (v.eos >= 0) impl->eog[v.eos] = true;
  if (v.eot >= 0) impl->eog[v.eot] = true;

  if (v.kind != VocabKind::Spm) {
    impl->pre.emplace(v.pre);

    // GPT-2 maps every byte to a printable character: printable Latin-1 bytes
    // stand for themselves, the others take code points 256, 257, ... in order.
    impl->char_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      append_utf8(impl->byte_chars[b], cp);
      impl->char_byte[cp] = static_cast<int16_t>(b);
      impl->byte_char_id[b] = impl->find_piece(impl->byte_chars[b]);
    }
    impl->merge.reserve(v.merges.size());
    std::string joined;
    for (size_t rank = 0; rank < v.merges.size(); ++rank) {
      const auto& [l, r] = v.merges[rank];
      joined.assign(l).append(r);
      const int32_t a = impl->find_piece(l), b = impl->find_piece(r), c = impl->find_piece(joined);
      if (a < 0 || b < 0 || c < 0) continue;  // involves a non-normal token: never reachable
      const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
      impl->merge.emplace(key, std::pair<int32_t, int32_t>(static_cast<int32_t>(rank), c));
    }
  }
  impl_ = std::move(impl);
}

int32_t Tokenizer::n_vocab() const { return impl_->v.n_tokens(); }
int32_t Tokenizer::bos() const { return impl_->v.bos; }
int32_t Tokenizer::eos() const { return impl_->v.eos; }
const Vocab& Tokenizer::vocab() const { return impl_->v; }
bool Tokenizer::is_eog(int32_t id) const { return id >= 0 && id < n_vocab() && impl_->eog[id]; }

std::vector<int32_t> Tokenizer::eog_ids() const {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < n_vocab(); ++id)
    if (impl_->eog[id]) ids.push_back(id);
  return ids;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special,
                                       std::span<const std::pair<size_t, size_t>> plain_ranges) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && m.v.bos >= 0) out.push_back(m.v.bos);
  bool after_special = true;  // the text start counts as a boundary for the space prefix
  auto raw = [&](std::string_view frag) {
    if (frag.empty()) return;
    const bool prefix = m.v.add_space_prefix && after_special;
    if (m.v.kind == VocabKind::Spm)
      m.spm_fragment(frag, prefix, out);
    else
      m.bpe_fragment(frag, prefix, out);
    after_special = false;
  };
  size_t start = 0;
  if (parse_special) {
    size_t r = 0;  // the first plain range not wholly before i
    for (size_t i = 0; i < text.size();) {
      while (r < plain_ranges.size() && plain_ranges[r].second <= i) ++r;
      if (r < plain_ranges.size() && plain_ranges[r].first <= i) {
        i = plain_ranges[r].second;
        continue;
      }
      // A special token must end before the next plain range begins.
      const size_t limit =
          r < plain_ranges.size() ? std::min(plain_ranges[r].first, text.size()) : text.size();
      int32_t hit = -1;
      for (int32_t id : m.specials[static_cast<unsigned char>(text[i])])
        if (m.v.tokens[id].size() <= limit - i && text.substr(i).starts_with(m.v.tokens[id])) {
          hit = id;  // lists are sorted longest first
          break;
        }
      if (hit < 0) {
        ++i;
        continue;
      }
      raw(text.substr(start, i - start));
      out.push_back(hit);
      after_special = true;
      i += m.v.tokens[hit].size();
      start = i;
    }
  }
  raw(text.substr(start));
  if (add_bos && m.v.add_eos && m.v.eos >= 0) out.push_back(m.v.eos);
  return out;
}

void Tokenizer::Impl::emit_unknown(std::string_view what, std::vector<int32_t>& out) const {
  if (v.unk < 0)
    fail(ErrorKind::InvalidInput,
         "cannot encode {} bytes starting 0x{:02X}: no matching, byte or unknown token", what.size(),
         static_cast<unsigned char>(what[0]));
  out.push_back(v.unk);
}

// SentencePiece BPE: start from single characters and repeatedly merge the
// adjacent pair whose concatenation is the highest-scoring token (leftmost on
// ties). A heap of candidate pairs keeps this O(n log n); entries made stale
// by an earlier merge are recognised by their length and skipped.
void Tokenizer::Impl::spm_fragment(std::string_view text, bool prefix, std::vector<int32_t>& out) const {
  const std::string s = spm_normalized(text, prefix);
  struct Sym {
    int32_t start, len, prev, next;
  };
  std::vector<Sym> sym;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const size_t len = std::max<size_t>(1, utf8_char_len(p + i, s.size() - i));  // a bad byte stands alone
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({static_cast<int32_t>(i), static_cast<int32_t>(len), n - 1, n + 1});
    i += len;
  }
  sym.back().next = -1;

  struct Pair {
    float score;
    int32_t left, right, len;
    bool operator<(const Pair& o) const { return score < o.score || (score == o.score && left > o.left); }
  };
  std::priority_queue<Pair> heap;
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const int32_t len = sym[l].len + sym[r].len;
    const int32_t id = find_piece(std::string_view(s).substr(sym[l].start, len));
    if (id >= 0) heap.push({v.scores[id], l, r, len});
  };
  for (size_t i = 1; i < sym.size(); ++i) consider(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Pair top = heap.top();
    heap.pop();
    Sym& l = sym[top.left];
    Sym& r = sym[top.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != top.len) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (l.next >= 0) sym[l.next].prev = top.left;
    consider(l.prev, top.left);
    consider(top.left, l.next);
  }

  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = std::string_view(s).substr(sym[i].start, sym[i].len);
    if (const int32_t id = find_piece(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // Byte fallback: one <0xXX> token per UTF-8 byte, or <unk> if any is missing.
    const bool all_bytes = std::all_of(
        piece.begin(), piece.end(), [this](char c) { return byte_id[static_cast<unsigned char>(c)] >= 0; });
    if (!all_bytes)
      emit_unknown(piece, out);
    else
      for (char c : piece) out.push_back(byte_id[static_cast<unsigned char>(c)]);
  }
}

void Tokenizer::Impl::bpe_fragment(std::string_view text, bool prefix, std::vector<int32_t>& out) const {
  std::string s;
  if (prefix) s = " ";
  s.append(text);
  if (v.kind == VocabKind::BpeSpm) s = replace_all(s, " ", kSpaceMark);
  pre->split(s, [&](std::string_view word) { bpe_word(word, out); });
}

// BPE on one pre-token. Byte-level: each byte starts as its stand-in
// token; SentencePiece-style: each UTF-8 character as its token. The adjacent
// pair with the lowest merge rank merges first (leftmost on ties).
void Tokenizer::Impl::bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool byte_level = v.kind == VocabKind::Bpe;
  if (pre->spec().ignore_merges || (!byte_level && word.find_first_not_of('\n') == std::string_view::npos)) {
    std::string mapped;
    if (byte_level)
      for (char c : word) mapped += byte_chars[static_cast<unsigned char>(c)];
    else
      mapped = word;
    if (const int32_t id = find_piece(mapped); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  struct Sym {
    int32_t id, prev, next, start, len;  // [start, start + len): its bytes in `word`
  };
  std::vector<Sym> sym;
  sym.reserve(word.size());
  const auto* p = reinterpret_cast<const unsigned char*>(word.data());
  for (size_t i = 0; i < word.size();) {
    const size_t len = byte_level ? 1 : std::max<size_t>(1, utf8_char_len(p + i, word.size() - i));
    const int32_t id = byte_level ? byte_char_id[p[i]] : find_piece(word.substr(i, len));
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, n + 1, static_cast<int32_t>(i), static_cast<int32_t>(len)});
    i += len;
  }
  sym.back().next = -1;
  struct Pair {
    int32_t rank, left, right, left_id, right_id, result;
    bool operator<(const Pair& o) const { return rank > o.rank || (rank == o.rank && left > o.left); }
  };
  std::priority_queue<Pair> heap;
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
    const auto it = merge.find((uint64_t(uint32_t(sym[l].id)) << 32) | uint32_t(sym[r].id));
    if (it != merge.end()) heap.push({it->second.first, l, r, sym[l].id, sym[r].id, it->second.second});
  };
  for (size_t i = 1; i < sym.size(); ++i) consider(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Pair top = heap.top();
    heap.pop();
    Sym& l = sym[top.left];
    if (l.next != top.right || l.id != top.left_id || sym[top.right].id != top.right_id) continue;  // stale
    Sym& r = sym[top.right];
    l.id = top.result;
    l.len += r.len;
    l.next = r.next;
    r.id = -2;  // merged away
    if (l.next >= 0) sym[l.next].prev = top.left;
    consider(l.prev, top.left);
    consider(top.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    if (sym[i].id >= 0) {
      out.push_back(sym[i].id);
      continue;
    }
    const std::string_view bytes = word.substr(sym[i].start, sym[i].len);
    const bool all_bytes = !byte_level && std::all_of(bytes.begin(), bytes.end(), [this](char c) {
      return byte_id[static_cast<unsigned char>(c)] >= 0;
    });
    if (!all_bytes)
      emit_unknown(bytes, out);  // a byte without a token
    else
      for (char c : bytes) out.push_back(byte_id[static_cast<unsigned char>(c)]);
  }
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
  const Vocab& v = impl_->v;
  if (id < 0 || id >= v.n_tokens())
    fail(ErrorKind::InvalidInput, "token id {} is out of range (the vocab has {} tokens)", id, v.n_tokens());
  const std::string& text = v.tokens[id];
  switch (v.type(id)) {
    case TokenType::Control:
    case TokenType::Unused:
      return render_special ? text : std::string();
    case TokenType::Unknown:
      return render_special ? text : std::string(kReplacement);
    case TokenType::Byte:
      return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
    case TokenType::UserDefined:
    case TokenType::Normal:
      break;
  }
  if (v.kind != VocabKind::Bpe) return replace_all(text, kSpaceMark, " ");
  if (v.type(id) == TokenType::UserDefined) return text;  // added tokens are stored as plain text
  // Undo the GPT-2 byte mapping; a character outside it is kept as it is.
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    const size_t len = std::max<size_t>(1, utf8_char_len(p + i, text.size() - i));
    uint32_t cp = 0x110000;
    if (len == 1)
      cp = p[i];
    else if (len == 2)
      cp = ((p[i] & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
    if (cp < impl_->char_byte.size() && impl_->char_byte[cp] >= 0)
      out += static_cast<char>(impl_->char_byte[cp]);
    else
      out.append(text, i, len);
    i += len;
  }
  return out;
}

void Tokenizer::append_decoded(int32_t id, bool render_special, bool& strip_space, std::string& out) const {
  const Vocab& v = impl_->v;
  std::string piece = token_to_piece(id, render_special);
  const TokenType t = v.type(id);  // token_to_piece checked the range
  if (t == TokenType::Control || t == TokenType::UserDefined || (t == TokenType::Unknown && render_special)) {
    // encode() prefixes a space after a special token it parsed from the text,
    // whether or not that token is shown now.
    strip_space = v.add_space_prefix;
  } else if (t != TokenType::Unused) {
    if (strip_space && t == TokenType::Normal && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    strip_space = false;
  }
  out += piece;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  bool strip_space = impl_->v.add_space_prefix;
  for (int32_t id : ids) append_decoded(id, render_special, strip_space, out);
  return out;
}

void drain_utf8(std::string& bytes, std::string& out, bool final) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    size_t prefix = 1;
    bool incomplete = false;
    const size_t len = utf8_char_len(p + i, n - i, &prefix, &incomplete);
    if (len > 0) {
      out.append(bytes, i, len);
      i += len;
      continue;
    }
    if (incomplete && !final) break;  // the next token may complete it
    out += kReplacement;              // one U+FFFD per maximal invalid subpart
    i += prefix;
  }
  bytes.erase(0, i);
}

StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool render_special, bool starts_text)
    : tok_(std::move(tokenizer)), render_special_(render_special), starts_text_(starts_text) {
  reset();
}

void StreamDecoder::reset() {
  strip_space_ = starts_text_ && tok_.vocab().add_space_prefix;
  pending_.clear();
}

std::string StreamDecoder::push(int32_t id) {
  tok_.append_decoded(id, render_special_, strip_space_, pending_);
  std::string out;
  drain_utf8(pending_, out, false);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  drain_utf8(pending_, out, true);
  return out;
}

}  // namespace depcache

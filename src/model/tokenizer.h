#pragma once
// Text <-> token ids for the two GGUF tokenizer families: SentencePiece BPE
// ("llama": score-ordered bigram merges with byte fallback) and GPT-2 style
// byte-level BPE ("gpt2": regex pre-tokenizer, rank-ordered merges).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/vocab.h"

namespace depcache {

class Tokenizer {
 public:
  // Builds lookup tables and compiles the pre-tokenizer regex once. Throws
  // depcache::Error for an invalid vocab or an unsupported pre-tokenizer name.
  explicit Tokenizer(Vocab vocab);

  // add_bos: prepend BOS (if the vocab has one) and, when the vocab's add_eos
  // flag is set, append EOS; vocab().add_bos says what the model expects.
  // parse_special: exact occurrences of control / user-defined / unknown token
  // strings become those tokens (leftmost, longest first); otherwise they are
  // plain text. For SentencePiece, a space is prefixed (add_space_prefix) to the
  // text at the start and after each special token.
  // plain_ranges: with parse_special, byte ranges [begin, end) (ascending,
  // disjoint) where nothing is parsed as special, e.g. a client's text inside
  // a chat format whose own markers are: a special token is matched only
  // where it lies wholly outside them. The text is otherwise encoded as
  // without them.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special,
                              std::span<const std::pair<size_t, size_t>> plain_ranges = {}) const;

  // The bytes a token stands for. Control and unused tokens give "" unless
  // render_special; unknown tokens give U+FFFD unless render_special. Throws
  // depcache::Error for an id outside the vocab.
  std::string token_to_piece(int32_t id, bool render_special = false) const;

  // Concatenated pieces (raw bytes, not sanitised) of ids that begin a text.
  // The space that encode() prefixed is removed again, so decode(encode(x)) == x
  // for lossless input (byte fallback or byte-level BPE);
  // with render_special, special tokens are rendered too and that also holds
  // for encode(x, false, true).
  std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

  int32_t n_vocab() const;
  int32_t bos() const;                   // -1 if none
  int32_t eos() const;                   // -1 if none
  bool is_eog(int32_t id) const;         // end of generation: eos, eot or a known end-of-turn control token
  std::vector<int32_t> eog_ids() const;  // every id is_eog holds for
  const Vocab& vocab() const;

 private:
  friend class StreamDecoder;
  struct Impl;
  // Appends one token's text, removing the prefixed space where encode() added one.
  void append_decoded(int32_t id, bool render_special, bool& strip_space, std::string& out) const;
  std::shared_ptr<const Impl> impl_;  // immutable, so copies are cheap and thread-safe
};

// Turns a stream of token ids into complete UTF-8 text: bytes of a multi-byte
// character split across tokens are held back until the character is
// complete; bytes that can never become valid are emitted as U+FFFD.
// starts_text: the first token begins the text, so the space that encode()
// prefixed is dropped as in decode(); pass false when continuing after a
// prompt (e.g. generated tokens), where a leading space is real.
class StreamDecoder {
 public:
  explicit StreamDecoder(Tokenizer tokenizer, bool render_special = false, bool starts_text = true);
  std::string push(int32_t id);  // text that became complete with this token
  std::string flush();           // the rest; an unfinished character becomes U+FFFD
  void reset();                  // start a new text

 private:
  Tokenizer tok_;
  bool render_special_;
  bool starts_text_;
  bool strip_space_ = true;
  std::string pending_;
};

// The valid UTF-8 prefix of `bytes` (invalid parts replaced by U+FFFD) is
// appended to `out` and removed from `bytes`; an incomplete but possibly valid
// tail is kept unless `final`.
void drain_utf8(std::string& bytes, std::string& out, bool final);

}  // namespace depcache

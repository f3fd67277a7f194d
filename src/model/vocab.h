#pragma once
// A tokenizer vocabulary as stored in GGUF metadata (tokenizer.ggml.*), checked
// on load so the tokenizer itself can trust every id and string it holds.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/gguf.h"

namespace depcache {

// "llama": SentencePiece BPE (score-ordered merges, byte fallback);
// "gpt2": byte-level BPE (regex pre-tokenizer, rank-ordered merges);
// "gemma4": SentencePiece-style BPE (U+2581 for spaces, rank-ordered merges
// over UTF-8 characters, <0xXX> byte fallback, words split at newlines).
enum class VocabKind { Spm, Bpe, BpeSpm };

// Values as stored in tokenizer.ggml.token_type (0, "undefined", is read as Normal).
enum class TokenType : int32_t {
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

struct Vocab {
  VocabKind kind = VocabKind::Spm;
  std::string pre = "default";  // tokenizer.ggml.pre: which pre-tokenizer regex (BPE)
  std::vector<std::string> tokens;
  std::vector<float> scores;     // same length as tokens; 0 when the file has none
  std::vector<TokenType> types;  // same length as tokens; Normal when the file has none
  std::vector<std::pair<std::string, std::string>> merges;   // BPE, rank = index
  int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1;  // -1: absent
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;
  std::string chat_template;  // tokenizer.chat_template (Jinja), empty when the file has none

  // Reads and validates the tokenizer.ggml.* keys. Throws depcache::Error
  // (InvalidInput) naming the key and the offending entry.
  static Vocab from_gguf(const GgufFile& file);

  // A small SentencePiece-style vocabulary built into the binary: <unk>, <s>,
  // </s>, 256 byte tokens and a few hundred English pieces. Any text encodes
  // (byte fallback) and decodes losslessly, so random-weight models need no file.
  static Vocab builtin_bytes();

  // Throws depcache::Error if the fields are inconsistent (from_gguf calls it).
  void validate() const;

  // The tokenizer.ggml.* keys describing this vocab, for writing a GGUF file.
  void append_gguf_metadata(std::vector<std::pair<std::string, GgufValue>>& out) const;

  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  TokenType type(int32_t id) const { return types[static_cast<size_t>(id)]; }
};

}  // namespace depcache

#pragma once
// Learns a SentencePiece-style BPE vocabulary (tokenizer.ggml.model "llama")
// from text, for models trained here: <unk>, <s>, </s>, the 256 byte-fallback
// tokens, the characters seen, then one token per merge, most frequent pair
// first. A merge's score is minus its rank, so the engine's tokenizer (which
// merges the best-scored adjacent pair first) segments text the way the
// merges were learned, and any text still encodes through byte fallback.
#include <cstdint>
#include <string>
#include <vector>

#include "model/vocab.h"

namespace depcache {

struct VocabLearnOptions {
  int32_t size = 1024;           // tokens in all; fewer if the text runs out of pairs
  int64_t min_pair_count = 2;    // a pair seen fewer times is not merged
  int32_t max_piece_chars = 24;  // no token longer than this (in characters)
  // No piece joins letters to digits, and every ASCII punctuation mark stands
  // alone (SentencePiece's split by script and by number): in "15,author,8"
  // the ids and the words are tokens of their own.
  bool split_scripts = false;
  // The space mark is a token of its own, joined to nothing: a word is the
  // same token after a space as after a comma or a line's start (a name in a
  // CSV row, in a question and in the answer), so a model can match and copy
  // it as it is.
  bool split_spaces = false;
};

struct VocabLearnReport {
  int32_t n_chars = 0;   // character tokens
  int32_t n_merges = 0;  // merged tokens
  int64_t n_fragments = 0;
  int64_t n_chars_seen = 0;  // characters of input
};

// Each fragment is learned from as the tokenizer encodes it on its own: a
// space prefixed, spaces as U+2581, merges inside a word (a piece starts at a
// space mark; a newline stands alone, and so does the sentence punctuation
// ". , ; : ! ?" ending a word; with split_scripts, at every punctuation mark
// and between digits and the rest; with split_spaces, the space mark alone).
// InvalidInput if `size` leaves no room beyond the fixed tokens.
Vocab learn_bpe_vocab(const std::vector<std::string>& fragments, const VocabLearnOptions& options,
                      VocabLearnReport* report = nullptr);

}  // namespace depcache

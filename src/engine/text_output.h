#pragma once
// A request's generated text as it streams: tokens in, UTF-8 text out,
// ending at the first stop string, which is not part of the text (as in the
// OpenAI API). Text that could still turn out to begin a stop string is
// held back until it is known not to, so a streaming client never sees a
// piece of one.
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace depcache {

class TextOutput {
 public:
  // Empty stop strings are ignored.
  TextOutput(const Tokenizer& tok, std::vector<std::string> stop);
  // The text that became final with this token ("" once stopped).
  std::string push(int32_t token);
  // The held-back rest, when generation ends without a stop string.
  std::string finish();
  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }  // all emitted so far
  // Bytes decoded so far, emitted or held back: where the next token's text
  // begins.
  size_t decoded_size() const { return text_.size() + pending_.size(); }

 private:
  std::string take(bool all);  // what of pending_ is final (all: generation ended)
  std::string emit(size_t n);  // moves pending_[0, n) to the text

  StreamDecoder decoder_;
  std::vector<std::string> stop_;
  std::string pending_;  // decoded, not emitted yet
  std::string text_;
  bool stopped_ = false;
};

}  // namespace depcache

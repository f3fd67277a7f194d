// Any byte string encodes with the built-in vocabulary, every id is in
// range, and decoding gives the input back (byte fallback makes it lossless),
// unless it holds U+2581, which SentencePiece reads as its space mark.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "model/tokenizer.h"
#include "model/vocab.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const depcache::Tokenizer tok(depcache::Vocab::builtin_bytes());
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto ids = tok.encode(text, false, false);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.n_vocab()) std::abort();
  if (text.find("\xE2\x96\x81") == std::string_view::npos && tok.decode(ids) != text) std::abort();
  return 0;
}

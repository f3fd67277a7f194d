// Byte-level BPE under each pre-tokenizer family the engine supports, on the real GPT-2 vocabulary from
// ../shared/tokenizers, and SentencePiece on the real llama vocabulary: any text encodes to ids in range and
// decodes back to itself, with special tokens parsed or not, and streamed decoding gives the same text as
// decoding at once. The first input byte picks the tokenizer, the rest is the text.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "model/gguf.h"
#include "model/pre_tokenizer.h"
#include "model/tokenizer.h"
#include "model/vocab.h"

namespace {

using depcache::fuzz::violated;

std::vector<depcache::Tokenizer> load_tokenizers() {
  std::vector<depcache::Tokenizer> out;
  const depcache::Vocab gpt2 = depcache::Vocab::from_gguf(
      depcache::GgufFile::open(depcache::fuzz::shared_file("tokenizers/ggml-vocab-gpt-2.gguf")));
  // Every byte-level family (its first name).
  for (const depcache::PreTokenizerSpec& spec : depcache::pre_tokenizer_specs()) {
    if (spec.names[0] == "gemma4") continue;  // not byte-level: needs its own vocabulary
    depcache::Vocab v = gpt2;
    v.pre = spec.names[0];
    out.emplace_back(std::move(v));
  }
  out.emplace_back(depcache::Vocab::from_gguf(
      depcache::GgufFile::open(depcache::fuzz::shared_file("tokenizers/ggml-vocab-llama-spm.gguf"))));
  return out;
}

void check(const depcache::Tokenizer& tok, std::string_view text) {
  // SentencePiece reads U+2581 as its space mark: such text is not lossless.
  const bool lossless =
      tok.vocab().kind == depcache::VocabKind::Bpe || text.find("\xE2\x96\x81") == std::string_view::npos;
  for (const bool special : {false, true}) {
    const std::vector<int32_t> ids = tok.encode(text, false, special);
    for (int32_t id : ids)
      if (id < 0 || id >= tok.n_vocab()) violated("token id out of range");
    const std::string back = tok.decode(ids, special);
    if (lossless && back != text)
      violated(special ? "decode(encode(x, special), special) != x" : "decode(encode(x)) != x");
    if (special) continue;
    // Streamed: the same text, made valid UTF-8.
    depcache::StreamDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    std::string bytes = back, whole;
    depcache::drain_utf8(bytes, whole, true);
    if (streamed != whole) violated("streamed decoding differs from decoding at once");
  }
}

const std::vector<depcache::Tokenizer>& loaded_tokenizers() {
  static const std::vector<depcache::Tokenizer> tokenizers = load_tokenizers();
  return tokenizers;
}

}  // namespace

// The real vocabularies load here, before the first input: libFuzzer's
// per-input timeout would otherwise count their loading (seconds under
// ASan) against the first input.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loaded_tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<depcache::Tokenizer>& tokenizers = loaded_tokenizers();
  if (size == 0) return 0;
  const depcache::Tokenizer& tok = tokenizers[data[0] % tokenizers.size()];
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    check(tok, text);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer (%s, pre '%s') threw: %s\n",
                 tok.vocab().kind == depcache::VocabKind::Spm ? "spm" : "bpe", tok.vocab().pre.c_str(),
                 e.what());
    violated("encoding or decoding threw");
  }
  return 0;
}

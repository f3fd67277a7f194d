// A conversation decoded from the input is rendered by a chat family's
// template and the prompt tokenized with real vocabularies (GPT-2 byte-level
// BPE and SentencePiece llama, from ../shared/tokenizers). The render either
// rejects the conversation with InvalidInput or gives a prompt whose special
// tokens parse, whose ids are in range, and which decodes back exactly.
//
// Input: a flags byte (which family's prompt to tokenize, with which
// vocabulary, with its own BOS/EOS text or the defaults), then messages
// separated by 0x00; a message's first
// byte picks its role (system, user, assistant, or the rest of a short
// string as a role of its own), the remaining bytes are its content.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/chat_template.h"
#include "util/error.h"

namespace {

using depcache::fuzz::violated;

struct Target {
  depcache::Tokenizer tok;
  std::string bos, eos;
  bool spm;
};

std::vector<Target> load_targets() {
  std::vector<Target> out;
  for (const char* file : {"tokenizers/ggml-vocab-gpt-2.gguf", "tokenizers/ggml-vocab-llama-spm.gguf"}) {
    depcache::Tokenizer tok(
        depcache::Vocab::from_gguf(depcache::GgufFile::open(depcache::fuzz::shared_file(file))));
    std::string bos = tok.bos() >= 0 ? tok.token_to_piece(tok.bos(), true) : "<s>";
    std::string eos = tok.eos() >= 0 ? tok.token_to_piece(tok.eos(), true) : "</s>";
    const bool spm = tok.vocab().kind == depcache::VocabKind::Spm;
    out.push_back({std::move(tok), std::move(bos), std::move(eos), spm});
  }
  return out;
}

void check_tokens(const Target& t, const std::string& prompt) {
  const std::vector<int32_t> ids = t.tok.encode(prompt, false, true);
  for (int32_t id : ids)
    if (id < 0 || id >= t.tok.n_vocab()) violated("token id out of range");
  // SentencePiece reads U+2581 as its space mark: such text is not lossless.
  if (t.spm && prompt.find("\xE2\x96\x81") != std::string::npos) return;
  if (t.tok.decode(ids, true) != prompt) violated("decode(encode(prompt)) differs from the prompt");
}

const std::vector<Target>& loaded_targets() {
  static const std::vector<Target> targets = load_targets();
  return targets;
}

}  // namespace

// The real vocabularies load here, before the first input: libFuzzer's
// per-input timeout would otherwise count their loading (seconds under
// ASan) against the first input.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loaded_targets();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<Target>& targets = loaded_targets();
  depcache::fuzz::Bytes in(data, size);
  const uint8_t flags = in.u8();
  std::vector<depcache::ChatMessage> messages;
  while (!in.empty()) {
    const std::string_view raw = in.until(0);
    depcache::ChatMessage m;
    const uint8_t role = raw.empty() ? 1 : static_cast<uint8_t>(raw[0]) % 8;
    std::string_view content = raw.empty() ? raw : raw.substr(1);
    if (role < 3) {
      m.role = role == 0 ? "system" : role == 1 ? "user" : "assistant";
    } else if (role == 3) {  // an unknown role: up to the first newline
      const size_t nl = content.find('\n');
      m.role = std::string(content.substr(0, nl));
      content = nl == std::string_view::npos ? std::string_view() : content.substr(nl + 1);
    } else {
      m.role = "user";
    }
    m.content = std::string(content);
    messages.push_back(std::move(m));
  }
  // One family's template, picked by the flags, renders the conversation
  // (or refuses it as invalid input) and its prompt is tokenized with one
  // vocabulary.
  const std::vector<std::string> names = depcache::chat_family_names();
  const std::optional<depcache::ChatFamily> family =
      depcache::chat_family_from_name(names[flags % names.size()]);
  if (!family) violated("a listed chat family has no enum value");
  const Target& t = targets[(flags / names.size()) % targets.size()];
  const bool own_markers = (flags / names.size() / targets.size()) % 2;
  std::string prompt;
  try {
    const depcache::ChatFormat format(*family);
    prompt = (own_markers ? format.render(messages, t.bos, t.eos) : format.render(messages)).text;
  } catch (const depcache::Error& e) {
    if (e.kind() != depcache::ErrorKind::InvalidInput) {
      std::fprintf(stderr, "chat render failed: %s\n", e.what());
      violated("a chat render failed other than InvalidInput");
    }
    return 0;
  }
  if (prompt.empty()) violated("empty prompt for a valid conversation");
  try {
    check_tokens(t, prompt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizing a rendered chat threw: %s\n", e.what());
    violated("tokenizing a rendered chat threw");
  }
  return 0;
}

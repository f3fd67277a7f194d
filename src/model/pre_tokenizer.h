#pragma once
// Byte-level BPE pre-tokenizers: how a text is cut into words before merges.
// Each family is a sequence of regexes; every regex splits every piece the
// previous ones left into its matches and the gaps between them (the
// "isolated" split of the families' tokenizer definitions).
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace depcache {

struct PreTokenizerSpec {
  std::vector<std::string_view> names;     // tokenizer.ggml.pre values that mean this family
  std::vector<std::string_view> patterns;  // applied in order
  bool ignore_merges = false;              // a word that is itself a token is taken whole
};

// Every family, in a fixed order.
const std::vector<PreTokenizerSpec>& pre_tokenizer_specs();
// The family a tokenizer.ggml.pre value names, or nullptr.
const PreTokenizerSpec* find_pre_tokenizer(std::string_view name);
// Every supported name, for error messages and `model info`.
std::string supported_pre_tokenizers();

class PreTokenizer {
 public:
  // Throws depcache::Error (InvalidInput) naming `name` when it is not supported.
  explicit PreTokenizer(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  const PreTokenizerSpec& spec() const { return *spec_; }
  // Calls `word` for each piece of `text`, in order; the pieces concatenate to `text`.
  void split(std::string_view text, const std::function<void(std::string_view)>& word) const;

 private:
  struct Compiled;
  const PreTokenizerSpec* spec_;
  std::vector<std::unique_ptr<Compiled>> regexes_;
};

}  // namespace depcache

#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/pre_tokenizer.h"

#include <pcre2.h>

#include "util/error.h"

namespace depcache {
namespace {

// The families' published split patterns (from their tokenizer definitions).
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen3.5: combining marks stay with their letters.
constexpr std::string_view kQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Mistral's Tekken and GPT-4o: words split at case changes.
constexpr std::string_view kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kSeedCoder =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kBloom = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";
constexpr std::string_view kCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
constexpr std::string_view kDeepseekV3Words =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM's cased letters (code points, not characters: editors and tools
// normalize look-alikes such as the Kelvin sign).
constexpr std::string_view kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";

}  // namespace

const std::vector<PreTokenizerSpec>& pre_tokenizer_specs() {
  static const std::vector<PreTokenizerSpec> specs = {
      // No name: the generic byte-level split with punctuation and digit runs apart.
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"gpt-2",       "gpt2",        "phi-2",           "mpt",     "olmo",       "jais",
        "exaone4",     "trillion",    "granite-docling", "mellum",  "a.x-4.0",    "gigachat",
        "modern-bert", "roberta-bpe", "jina-es",         "jina-de", "jina-v2-es", "jina-v2-de",
        "jina-v1-en",  "jina-v2-code"},
       {kGpt2}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       {kLlama3},
       /*ignore_merges=*/true},
      {{"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"}, {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "grok-2"}, {kQwen2}},
      {{"qwen35"}, {kQwen35}},
      {{"tekken"}, {kTekken}, /*ignore_merges=*/true},
      {{"gpt-4o", "minimax-m2"}, {kGpt4o}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"}, {R"(\p{N})", kGpt2}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {{"deepseek-llm"},
       {"[\r\n]", kDeepseekLetters,
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)", R"(\s+$)",
        kCjk, R"(\p{N}+)"}},
      {{"deepseek-coder"}, {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"}},
      {{"deepseek-v3", "hunyuan-dense"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)", kDeepseekV3Words}},
      {{"seed-coder"}, {kSeedCoder}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kBloom}},
      {{"viking"}, {kBloom, R"(\p{N})"}},
      // SentencePiece-style BPE (tokenizer model gemma4): merges run over whole lines.
      {{"gemma4"}, {R"([^\n]+|[\n]+)"}},
  };
  return specs;
}

const PreTokenizerSpec* find_pre_tokenizer(std::string_view name) {
  for (const PreTokenizerSpec& s : pre_tokenizer_specs())
    for (std::string_view n : s.names)
      if (n == name) return &s;
  return nullptr;
}

std::string supported_pre_tokenizers() {
  std::string out;
  for (const PreTokenizerSpec& s : pre_tokenizer_specs())
    for (std::string_view n : s.names) {
      if (!out.empty()) out += ", ";
      out += n;
    }
  return out;
}

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::string_view name) : spec_(find_pre_tokenizer(name)) {
  if (!spec_)
    fail(ErrorKind::InvalidInput, "unsupported BPE pre-tokenizer '{}' (tokenizer.ggml.pre); supported: {}",
         name, supported_pre_tokenizers());
  for (std::string_view pattern : spec_->patterns) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto c = std::make_unique<Compiled>();
    // MATCH_INVALID_UTF: invalid bytes never match and fall into the gaps between matches.
    c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &err,
                            &err_off, nullptr);
    if (!c->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail(ErrorKind::Internal, "pre-tokenizer regex of '{}' does not compile at {}: {}", name, err_off,
           reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE);  // optional: the interpreter is the fallback
    regexes_.push_back(std::move(c));
  }
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& word) const {
  struct MatchData {
    pcre2_match_data* md = nullptr;
    ~MatchData() { pcre2_match_data_free(md); }
  };
  std::vector<MatchData> data(regexes_.size());
  for (size_t i = 0; i < regexes_.size(); ++i) {
    data[i].md = pcre2_match_data_create_from_pattern(regexes_[i]->code, nullptr);
    if (!data[i].md) fail(ErrorKind::Internal, "out of memory for regex match data");
  }
  // Each regex refines the pieces of the one before; the last one's pieces go out.
  std::function<void(size_t, std::string_view)> apply = [&](size_t level, std::string_view piece) {
    if (piece.empty()) return;
    if (level == regexes_.size()) return word(piece);
    pcre2_code* re = regexes_[level]->code;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
    size_t pos = 0;
    while (pos < piece.size()) {
      const int rc = pcre2_match(re, subject, piece.size(), pos, PCRE2_NOTEMPTY, data[level].md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) fail(ErrorKind::Internal, "pre-tokenizer regex failed with PCRE2 error {}", rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data[level].md);
      const size_t begin = ov[0], end = ov[1];
      if (begin > pos) apply(level + 1, piece.substr(pos, begin - pos));
      apply(level + 1, piece.substr(begin, end - begin));
      pos = end;
    }
    if (pos < piece.size()) apply(level + 1, piece.substr(pos));
  };
  apply(0, text);
}

}  // namespace depcache

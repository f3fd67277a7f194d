#pragma once
// Random-weight Llama-family models written as GGUF v3, for tests and
// benchmarks that must not depend on downloaded weights.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compute/dtype.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/rag_wrapper.h"

namespace depcache {

struct ModelShape {
  std::string preset;
  Arch arch = Arch::Llama;
  int n_layer = 2;
  int n_embd = 64;
  int n_head = 4;
  int n_head_kv = 2;
  int n_ff = 160;
  int n_ctx = 512;
  int n_vocab = 0;  // 0: the vocabulary's own size; larger pads with unused tokens
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  int head_dim = 0;  // 0: n_embd / n_head; otherwise written as key_length (Qwen3's differs)
  int n_rot = 0;     // rotary dimensions of a head (0: all; fewer: partial rotary)
  bool tied_embeddings = false;
  // RoPE scaling: per-pair frequency divisors written as the
  // rope_freqs.weight tensor (empty: none); Llama 3's parameters, from which
  // they are computed for the head size the model ends up with (when no
  // divisors are given); linear scaling's factor (1: none).
  std::vector<float> rope_freq_factors;
  struct Llama3Rope {
    float factor = 32, low_freq_factor = 1, high_freq_factor = 4;
    int original_context = 8192;
  };
  std::optional<Llama3Rope> llama3_rope;
  float rope_linear_factor = 1.0f;
  // YaRN (0: none): the factor and the context the model was trained for.
  float yarn_factor = 0;
  int yarn_original_context = 0;
  float yarn_log_multiplier = 0;  // Mistral 3's mscale_all_dim (0: not written)
  // Phi-3's LongRoPE (empty: none): per-pair divisors up to the original
  // context and beyond it, and that context; the attention factor
  // sqrt(1 + ln(n_ctx / original) / ln(original)) is written with them.
  std::vector<float> longrope_short, longrope_long;
  int longrope_original_context = 0;
  float attn_temp_scale = 0;  // Mistral 3's attention temperature (0: none)
  // Sliding-window attention (0: none); the pattern's period (0: the
  // architecture's: Gemma 2 two, Gemma 3 six, others every layer); Gemma 3's
  // local RoPE base.
  int sliding_window = 0;
  int sliding_window_pattern = 0;
  float rope_base_local = 0;
  // Gemma 2's soft caps on attention scores and on the logits (0: none).
  float attn_softcap = 0;
  float final_softcap = 0;
};

// Llama 3's RoPE frequency divisors (what its rope_freqs.weight holds): pairs
// whose wavelength is shorter than original_context / high_freq_factor keep
// their frequency, those longer than original_context / low_freq_factor are
// divided by `factor`, and those between are interpolated smoothly.
std::vector<float> llama3_rope_factors(int n_rot, float base, float factor, float low_freq_factor,
                                       float high_freq_factor, int original_context);

// Names: see model_preset_names(). nullopt for an unknown name.
std::optional<ModelShape> model_preset(const std::string& name);
// The width of one head.
inline int head_dim_of(const ModelShape& s) { return s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head; }
std::vector<std::string> model_preset_names();

struct RandomModelOptions {
  ModelShape shape;
  DType type = DType::F32;  // type of the 2-D weights; norms and biases stay F32
  uint64_t seed = 42;
  float stddev = 0.02f;
  // The query and key projections' std (0: stddev): larger makes attention
  // less uniform at the start of training.
  float qk_stddev = 0;
  std::optional<std::filesystem::path> vocab_from;  // GGUF whose inherited keys are copied
  std::string position_scheme;                      // written as depcache.position_scheme when set
  std::string tree_context;                         // written as depcache.tree_context when set
  std::string chat_template;                        // tokenizer.chat_template (Jinja) when set
  // Written as depcache.prompt.*; unset: the --vocab-from file's keys, if any.
  std::optional<RagWrapper> prompt;
  int n_threads = 0;
};

struct RandomModelReport {
  int64_t n_params = 0;
  size_t file_bytes = 0;
  int n_vocab = 0;
  std::vector<std::string> notes;  // e.g. tensors written in a fallback type
};

RandomModelReport write_random_model(const std::filesystem::path& path, const RandomModelOptions& opts);

// Metadata a model made from a file takes over from it: the tokenizer
// (tokenizer.*) and the prompt template (depcache.prompt.*).
bool inherited_metadata_key(std::string_view key);

// A tensor of a Llama-family model of some shape, in file order: 2-D weights
// are (n_out rows of n_in), vectors (norms, biases) one row of n_in.
struct ModelTensor {
  std::string name;
  int64_t n_in = 0, n_out = 1;
  bool matrix = false;
  bool norm = false;  // an RMSNorm gain (ones when fresh)
  int64_t size() const { return n_in * n_out; }
};
// Every tensor a model of this shape holds (n_vocab: the token count).
std::vector<ModelTensor> model_tensors(const ModelShape& shape, int n_vocab);

struct ModelFileSpec {
  ModelShape shape;         // n_vocab: the vocabulary's size, as `metadata` holds it
  DType type = DType::F32;  // 2-D weights; vectors stay F32
  std::string name;         // general.name
  // tokenizer.* and any further keys (written after the architecture's).
  std::vector<std::pair<std::string, GgufValue>> metadata;
  int n_threads = 0;
};
// Fills one row (n_in floats) of tensor `index` (into model_tensors()).
using TensorRowSource = std::function<void(size_t index, const ModelTensor& t, int64_t row, float* dst)>;

// Writes a GGUF v3 model of spec.shape whose values come from `rows`.
RandomModelReport write_model(const std::filesystem::path& path, const ModelFileSpec& spec,
                              const TensorRowSource& rows);

struct QuantizeReport {
  int n_converted = 0;             // matrices written in the new type
  std::vector<std::string> notes;  // matrices kept in a fallback type
  size_t file_bytes = 0;
};

// Rewrites a model with its 2-D weight matrices (attention, feed-forward,
// embedding, output) in `type`, as GGUF v3: every value dequantized to fp32
// and quantized again, rows that do not fit the type's blocks in the closest
// type that fits. Metadata and every other tensor are copied unchanged.
QuantizeReport quantize_model(const std::filesystem::path& in, const std::filesystem::path& out, DType type,
                              int n_threads = 0);

}  // namespace depcache

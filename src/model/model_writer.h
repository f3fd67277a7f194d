#pragma once
// Random-weight Llama-family models written as GGUF v3, for tests and
// benchmarks that must not depend on downloaded weights.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "compute/dtype.h"
#include "model/model_config.h"

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
  bool tied_embeddings = false;
};

// Names: tiny, tiny-qwen2, qwen2-0.5b, llama-1b. nullopt for an unknown name.
std::optional<ModelShape> model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

struct RandomModelOptions {
  ModelShape shape;
  DType type = DType::F32;  // type of the 2-D weights; norms and biases stay F32
  uint64_t seed = 42;
  float stddev = 0.02f;
  std::optional<std::filesystem::path> vocab_from;  // GGUF whose tokenizer.* keys are copied
  std::string position_scheme;                      // written as depcache.position_scheme when set
  std::string chat_template;                        // tokenizer.chat_template (Jinja) when set
  int n_threads = 0;
};

struct RandomModelReport {
  int64_t n_params = 0;
  size_t file_bytes = 0;
  int n_vocab = 0;
  std::vector<std::string> notes;  // e.g. tensors written in a fallback type
};

RandomModelReport write_random_model(const std::filesystem::path& path, const RandomModelOptions& opts);

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

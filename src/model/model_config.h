#pragma once
// Hyper-parameters of a Llama-family model, read from GGUF metadata.
#include <cstdint>
#include <string>

#include "model/prompt_template.h"

namespace depcache {

class GgufFile;

enum class Arch { Llama, Qwen2 };
// Normal rotates adjacent pairs (x0,x1),(x2,x3)...; Neox rotates (x_i, x_{i+n_rot/2}).
enum class RopeStyle { Normal, Neox };

// GGUF metadata key naming the position scheme a model was trained for.
inline constexpr const char* kPositionSchemeKey = "depcache.position_scheme";
// GGUF metadata key naming what a model's context trees see under dependency
// attention besides themselves (system or none).
inline constexpr const char* kTreeContextKey = "depcache.tree_context";

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_name;
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_ff = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  int n_rot = 0;  // rotary dimensions per head (<= head_dim)
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;
  RopeStyle rope_style = RopeStyle::Normal;
  bool qkv_bias = false;
  // depcache.position_scheme: the position scheme a model was fine-tuned for
  // under dependency attention (written by the trainer); empty when absent.
  std::string position_scheme;
  // depcache.tree_context: what trees saw when it was fine-tuned; empty when absent.
  std::string tree_context;
  // depcache.prompt.*: the RAG prompt's wrapping text (defaults when absent).
  PromptTemplate prompt;

  int n_embd_kv() const { return n_head_kv * head_dim; }

  // Validates everything the forward pass relies on; throws depcache::Error.
  static ModelConfig from_gguf(const GgufFile& f);
};

}  // namespace depcache

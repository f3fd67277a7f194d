#pragma once
// Hyper-parameters of a Llama-family model, read from GGUF metadata.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/rag_wrapper.h"

namespace depcache {

class GgufFile;

enum class Arch { Llama, Mistral3, Qwen2, Qwen3, Gemma2, Gemma3, Phi3, SmolLM3 };
// The GGUF general.architecture name of each, and back (nullopt: unknown).
const char* arch_name(Arch arch);

struct ModelConfig;
// The factor a query at RoPE position `pos` is multiplied by (1 without an
// attention temperature).
float attention_temperature(const ModelConfig& c, int64_t pos);

// YaRN's per-pair frequency divisors (rope.scaling.type yarn): pairs that turn
// more than beta_fast times over the original context keep their frequency,
// those turning fewer than beta_slow times are divided by `factor`, with a
// linear ramp between (by pair index). YaRN also scales Q and K by
// 1 + 0.1 ln(factor), which ModelConfig folds into q_scale.
std::vector<float> yarn_rope_divisors(int n_rot, float base, float factor, int original_context,
                                      float beta_fast, float beta_slow);
std::optional<Arch> parse_arch(std::string_view name);
// The GGUF names of the architectures, in declaration order.
std::vector<std::string> arch_names();
enum class Activation { Silu, GeluTanh };  // the FFN gate's: SwiGLU or GeGLU (tanh approximation)
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
  // Frequency scaling, per rotary pair: pair i turns at base^(-2i/n_rot) /
  // rope_divisors[i] (empty: 1). Linear scaling divides every pair by its
  // factor; Llama 3's rope_freqs.weight gives one divisor per pair (set by
  // Model::from_file); the two multiply.
  std::vector<float> rope_divisors;
  std::string rope_scaling = "none";  // none, linear or yarn (rope.scaling.type)
  bool qkv_bias = false;
  bool qk_norm = false;  // qwen3, gemma3: RMSNorm over each head of Q and K before RoPE
  // Gemma: token embeddings scaled by sqrt(n_embd); RMSNorm on the attention
  // and FFN outputs before each residual add; GeGLU; logits soft-capped
  // (cap * tanh(logit / cap)) when final_softcap > 0.
  float embd_scale = 1.0f;
  bool post_norms = false;
  Activation ffn_act = Activation::Silu;
  float final_softcap = 0.0f;
  // Gemma 2: each attention score s (after 1/sqrt(head_dim)) becomes
  // attn_softcap * tanh(s / attn_softcap) when attn_softcap > 0.
  float attn_softcap = 0.0f;
  // Mistral 3's (Llama 4's) attention temperature: a query at RoPE position
  // p is multiplied by 1 + attn_temp_scale * ln(floor(p / attn_temp_length) + 1)
  // when attn_temp_scale != 0 (attn_temp_length: the original context).
  float attn_temp_scale = 0.0f;
  int attn_temp_length = 0;
  // Queries are multiplied by this before attention (which scales by
  // 1/sqrt(head_dim)): Phi-3's LongRoPE attention factor (squared, as it
  // scales both Q and K), Gemma 3 27B's other query scale.
  float q_scale = 1.0f;
  bool fused_qkv = false;  // phi3: Q, K, V (and gate, up) stored as one matrix each

  // Sliding-window attention: a windowed layer's query at position p sees,
  // of what it would see, only keys at positions > p - sliding_window.
  // layer_windowed[il] says which layers are windowed (empty: none).
  // Windowed layers rotate with rope_base_local and no frequency scaling
  // when rope_base_local > 0 (Gemma 3), else like the others.
  int sliding_window = 0;
  std::vector<uint8_t> layer_windowed;
  float rope_base_local = 0.0f;
  // Layers without RoPE (SmolLM3's every fourth): keys carry no position and
  // are never re-rotated. Empty: every layer rotates.
  std::vector<uint8_t> layer_no_rope;
  // depcache.position_scheme: the position scheme a model was fine-tuned for
  // under dependency attention (written by the trainer); empty when absent.
  std::string position_scheme;
  // depcache.tree_context: what trees saw when it was fine-tuned; empty when absent.
  std::string tree_context;
  // depcache.prompt.*: the RAG prompt's wrapping text (defaults when absent).
  RagWrapper prompt;

  int n_embd_kv() const { return n_head_kv * head_dim; }
  bool windowed(int il) const { return !layer_windowed.empty() && layer_windowed[il]; }
  bool rotates(int il) const { return layer_no_rope.empty() || !layer_no_rope[il]; }
  // The RoPE frequencies of layer il: base, and divisors (empty: none).
  float layer_rope_base(int il) const {
    return windowed(il) && rope_base_local > 0 ? rope_base_local : rope_base;
  }
  const std::vector<float>& layer_rope_divisors(int il) const;

  // Validates everything the forward pass relies on; throws depcache::Error.
  // Strict: a key of the architecture's that the engine does not read, or a
  // value it does not implement, is refused by name (it would change what
  // the model computes).
  static ModelConfig from_gguf(const GgufFile& f);
};

}  // namespace depcache

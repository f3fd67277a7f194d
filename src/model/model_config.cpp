#include "model/model_config.h"

#include "model/gguf.h"
#include "util/error.h"

namespace depcache {

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.get_string("general.architecture");
  if (c.arch_name == "llama") {
    c.arch = Arch::Llama;
    c.rope_style = RopeStyle::Normal;
  } else if (c.arch_name == "qwen2") {
    c.arch = Arch::Qwen2;
    c.rope_style = RopeStyle::Neox;
    c.qkv_bias = true;
  } else {
    fail(ErrorKind::InvalidInput, "{}: architecture '{}' is not supported (supported: llama, qwen2)",
         f.source(), c.arch_name);
  }
  const std::string& a = c.arch_name;
  auto positive = [&](const std::string& key) {
    const int64_t v = f.get_int(key);
    if (v <= 0 || v > (int64_t{1} << 24))
      fail(ErrorKind::InvalidInput, "{}: {} = {} is out of range", f.source(), key, v);
    return static_cast<int>(v);
  };
  c.n_layer = positive(a + ".block_count");
  c.n_embd = positive(a + ".embedding_length");
  c.n_ff = positive(a + ".feed_forward_length");
  c.n_head = positive(a + ".attention.head_count");
  c.n_head_kv = f.find(a + ".attention.head_count_kv") ? positive(a + ".attention.head_count_kv") : c.n_head;
  c.n_ctx_train = positive(a + ".context_length");
  if (c.n_embd % c.n_head != 0)
    fail(ErrorKind::InvalidInput, "{}: embedding length {} is not divisible by {} heads", f.source(),
         c.n_embd, c.n_head);
  c.head_dim = c.n_embd / c.n_head;
  if (f.find(a + ".attention.key_length")) {
    const int64_t kl = f.get_int(a + ".attention.key_length");
    if (kl != c.head_dim)
      fail(ErrorKind::InvalidInput, "{}: key_length {} differs from embedding/heads {} (not supported)",
           f.source(), kl, c.head_dim);
  }
  if (c.n_head % c.n_head_kv != 0)
    fail(ErrorKind::InvalidInput, "{}: {} heads are not a multiple of {} KV heads", f.source(), c.n_head,
         c.n_head_kv);
  c.n_rot = f.find(a + ".rope.dimension_count") ? positive(a + ".rope.dimension_count") : c.head_dim;
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0)
    fail(ErrorKind::InvalidInput, "{}: rope dimension count {} must be even and at most the head size {}",
         f.source(), c.n_rot, c.head_dim);
  c.position_scheme = f.get_string_or(kPositionSchemeKey).value_or("");
  c.tree_context = f.get_string_or(kTreeContextKey).value_or("");
  c.prompt = PromptTemplate::from_gguf(f);
  c.rms_eps = static_cast<float>(f.get_float_or(a + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(c.rms_eps > 0)) fail(ErrorKind::InvalidInput, "{}: RMSNorm epsilon must be positive", f.source());
  c.rope_base = static_cast<float>(f.get_float_or(a + ".rope.freq_base").value_or(10000.0));
  if (!(c.rope_base > 1))
    fail(ErrorKind::InvalidInput, "{}: rope.freq_base {} is invalid", f.source(), c.rope_base);
  // Only plain RoPE is implemented; scaled variants would silently change outputs.
  if (auto scaling = f.get_string_or(a + ".rope.scaling.type"); scaling && *scaling != "none")
    fail(ErrorKind::InvalidInput, "{}: rope scaling type '{}' is not supported", f.source(), *scaling);
  if (auto factor = f.get_float_or(a + ".rope.scale_linear"); factor && *factor != 1.0)
    fail(ErrorKind::InvalidInput, "{}: linear rope scaling ({}) is not supported", f.source(), *factor);
  return c;
}

}  // namespace depcache

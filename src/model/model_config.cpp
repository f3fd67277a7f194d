#include "model/model_config.h"

#include <cmath>
#include <set>

#include "model/gguf.h"
#include "util/error.h"

namespace depcache {

const char* arch_name(Arch arch) {
  switch (arch) {
    case Arch::Llama:
      return "llama";
    case Arch::Qwen2:
      return "qwen2";
    case Arch::Qwen3:
      return "qwen3";
  }
  return "?";
}

std::optional<Arch> parse_arch(std::string_view name) {
  for (Arch a : {Arch::Llama, Arch::Qwen2, Arch::Qwen3})
    if (name == arch_name(a)) return a;
  return std::nullopt;
}

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.get_string("general.architecture");
  const std::optional<Arch> arch = parse_arch(c.arch_name);
  if (!arch)
    fail(ErrorKind::InvalidInput, "{}: architecture '{}' is not supported (supported: llama, qwen2, qwen3)",
         f.source(), c.arch_name);
  c.arch = *arch;
  // Llama rotates adjacent pairs; the Qwen models NeoX halves. Qwen2 adds
  // biases to Q, K and V; Qwen3 instead normalizes each head of Q and K.
  c.rope_style = c.arch == Arch::Llama ? RopeStyle::Normal : RopeStyle::Neox;
  c.qkv_bias = c.arch == Arch::Qwen2;
  c.qk_norm = c.arch == Arch::Qwen3;
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
  // The head width: key_length when given (Qwen3's differs from
  // embedding/heads), else embedding/heads.
  if (f.find(a + ".attention.key_length")) {
    c.head_dim = positive(a + ".attention.key_length");
  } else {
    if (c.n_embd % c.n_head != 0)
      fail(ErrorKind::InvalidInput, "{}: embedding length {} is not divisible by {} heads", f.source(),
           c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
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
  // RoPE scaling: linear is implemented (every frequency divided by the
  // factor); any other type would silently change outputs.
  c.rope_scaling = f.get_string_or(a + ".rope.scaling.type").value_or("none");
  double linear = 1.0;
  if (c.rope_scaling == "linear") {
    if (!f.find(a + ".rope.scaling.factor"))
      fail(ErrorKind::InvalidInput, "{}: linear rope scaling without {}.rope.scaling.factor", f.source(), a);
    linear = f.get_float_or(a + ".rope.scaling.factor").value_or(1.0);
  } else if (c.rope_scaling != "none") {
    fail(ErrorKind::InvalidInput, "{}: rope scaling type '{}' is not supported (supported: none, linear)",
         f.source(), c.rope_scaling);
  }
  if (auto legacy = f.get_float_or(a + ".rope.scale_linear"); legacy && *legacy != 1.0) {
    c.rope_scaling = "linear";
    linear *= *legacy;
  }
  if (!(linear >= 1.0) || !std::isfinite(linear))
    fail(ErrorKind::InvalidInput, "{}: linear rope scaling factor {} must be at least 1", f.source(), linear);
  if (linear != 1.0) c.rope_divisors.assign(static_cast<size_t>(c.n_rot / 2), static_cast<float>(linear));
  // Keys the forward pass implements or that do not change it; any other key
  // of the architecture's (sliding windows, soft-capping, experts, other
  // attention widths...) is refused by name.
  // (tensor_data_layout: how a converter laid out the weights it wrote; not
  // read at inference.)
  static const std::set<std::string> known = {"tensor_data_layout",
                                              "context_length",
                                              "embedding_length",
                                              "block_count",
                                              "feed_forward_length",
                                              "attention.head_count",
                                              "attention.head_count_kv",
                                              "attention.key_length",
                                              "attention.value_length",
                                              "attention.layer_norm_rms_epsilon",
                                              "rope.dimension_count",
                                              "rope.freq_base",
                                              "rope.scaling.type",
                                              "rope.scaling.factor",
                                              "rope.scale_linear",
                                              "rope.scaling.original_context_length",
                                              "rope.scaling.finetuned",
                                              "vocab_size",
                                              "expert_count",
                                              "expert_used_count"};
  for (const auto& [key, value] : f.metadata()) {
    if (!key.starts_with(a + ".")) continue;
    if (!known.count(key.substr(a.size() + 1)))
      fail(
          ErrorKind::InvalidInput,
          "{}: metadata key '{}' is not implemented by this engine (it would change what the model computes)",
          f.source(), key);
  }
  if (f.find(a + ".attention.value_length") && f.get_int(a + ".attention.value_length") != c.head_dim)
    fail(ErrorKind::InvalidInput, "{}: value_length {} differs from the key width {} (not supported)",
         f.source(), f.get_int(a + ".attention.value_length"), c.head_dim);
  for (const char* experts : {".expert_count", ".expert_used_count"})
    if (f.find(a + experts) && f.get_int(a + experts) != 0)
      fail(ErrorKind::InvalidInput, "{}: {}{} = {}: mixture-of-experts models are not supported", f.source(),
           a, experts, f.get_int(a + experts));
  if (f.find("split.count") && f.get_int("split.count") > 1)
    fail(ErrorKind::InvalidInput, "{}: a model split over {} files is not supported (merge it first)",
         f.source(), f.get_int("split.count"));
  return c;
}

}  // namespace depcache

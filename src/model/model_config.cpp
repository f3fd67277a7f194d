#include "model/model_config.h"

#include <fmt/ranges.h>

#include <cmath>
#include <set>

#include "model/gguf.h"
#include "util/error.h"

namespace depcache {

namespace {
// The architectures the engine computes, with their GGUF names: the one list.
constexpr std::pair<Arch, const char*> kArchs[] = {{Arch::Llama, "llama"},   {Arch::Mistral3, "mistral3"},
                                                   {Arch::Qwen2, "qwen2"},   {Arch::Qwen3, "qwen3"},
                                                   {Arch::Gemma2, "gemma2"}, {Arch::Gemma3, "gemma3"},
                                                   {Arch::Phi3, "phi3"},     {Arch::SmolLM3, "smollm3"}};
}  // namespace

const char* arch_name(Arch arch) {
  for (const auto& [a, name] : kArchs)
    if (a == arch) return name;
  return "?";
}

std::optional<Arch> parse_arch(std::string_view name) {
  for (const auto& [a, n] : kArchs)
    if (name == n) return a;
  return std::nullopt;
}

std::vector<std::string> arch_names() {
  std::vector<std::string> out;
  for (const auto& [a, name] : kArchs) out.emplace_back(name);
  return out;
}

float attention_temperature(const ModelConfig& c, int64_t pos) {
  if (c.attn_temp_scale == 0) return 1.0f;
  const double buckets = std::floor(double(std::max<int64_t>(pos, 0)) / c.attn_temp_length);
  return static_cast<float>(1.0 + c.attn_temp_scale * std::log(buckets + 1.0));
}

std::vector<float> yarn_rope_divisors(int n_rot, float base, float factor, int original_context,
                                      float beta_fast, float beta_slow) {
  // The pair index at which a frequency turns `turns` times over the
  // original context; pairs below `low` keep their frequency, pairs above
  // `high` are divided by the factor, a linear ramp between.
  const auto pair_at = [&](float turns) {
    return float(n_rot) * std::log(float(original_context) / (turns * 2.0f * 3.14159265358979f)) /
           (2.0f * std::log(base));
  };
  const float low = std::max(0.0f, std::floor(pair_at(beta_fast)));
  const float high = std::min(float(n_rot - 1), std::ceil(pair_at(beta_slow)));
  std::vector<float> out;
  for (int i = 0; i < n_rot / 2; ++i) {
    const float y = (float(i) - low) / std::max(0.001f, high - low);
    const float keep = 1.0f - std::min(1.0f, std::max(0.0f, y));  // 1: the frequency as trained
    out.push_back(1.0f / ((1.0f - keep) / factor + keep));
  }
  return out;
}

const std::vector<float>& ModelConfig::layer_rope_divisors(int il) const {
  static const std::vector<float> none;
  return windowed(il) && rope_base_local > 0 ? none : rope_divisors;
}

namespace {

// A count a GGUF key holds: positive and at most 2^24.
int positive_int(const GgufFile& f, const std::string& key) {
  const int64_t v = f.get_int(key);
  if (v <= 0 || v > (int64_t{1} << 24))
    fail(ErrorKind::InvalidInput, "{}: {} = {} is out of range", f.source(), key, v);
  return static_cast<int>(v);
}

// Layers, widths, heads, the training context and the rotated width.
void read_shape(const GgufFile& f, ModelConfig& c) {
  const std::string& a = c.arch_name;
  c.n_layer = positive_int(f, a + ".block_count");
  c.n_embd = positive_int(f, a + ".embedding_length");
  c.n_ff = positive_int(f, a + ".feed_forward_length");
  c.n_head = positive_int(f, a + ".attention.head_count");
  c.n_head_kv =
      f.find(a + ".attention.head_count_kv") ? positive_int(f, a + ".attention.head_count_kv") : c.n_head;
  c.n_ctx_train = positive_int(f, a + ".context_length");
  // The head width: key_length when given (Qwen3's differs from
  // embedding/heads), else embedding/heads.
  if (f.find(a + ".attention.key_length")) {
    c.head_dim = positive_int(f, a + ".attention.key_length");
  } else {
    if (c.n_embd % c.n_head != 0)
      fail(ErrorKind::InvalidInput, "{}: embedding length {} is not divisible by {} heads", f.source(),
           c.n_embd, c.n_head);
    c.head_dim = c.n_embd / c.n_head;
  }
  if (c.n_head % c.n_head_kv != 0)
    fail(ErrorKind::InvalidInput, "{}: {} heads are not a multiple of {} KV heads", f.source(), c.n_head,
         c.n_head_kv);
  c.n_rot = f.find(a + ".rope.dimension_count") ? positive_int(f, a + ".rope.dimension_count") : c.head_dim;
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0)
    fail(ErrorKind::InvalidInput, "{}: rope dimension count {} must be even and at most the head size {}",
         f.source(), c.n_rot, c.head_dim);
}

// RoPE's base and scaling (linear, YaRN); returns the factor YaRN scales
// queries by (1 without it).
float read_rope(const GgufFile& f, ModelConfig& c) {
  const std::string& a = c.arch_name;
  c.rope_base = static_cast<float>(f.get_float_or(a + ".rope.freq_base").value_or(10000.0));
  if (!(c.rope_base > 1))
    fail(ErrorKind::InvalidInput, "{}: rope.freq_base {} is invalid", f.source(), c.rope_base);
  // RoPE scaling: linear (every frequency divided by the factor) and YaRN
  // are implemented; any other type would silently change outputs.
  c.rope_scaling = f.get_string_or(a + ".rope.scaling.type").value_or("none");
  double linear = 1.0;
  float yarn_query_scale = 1.0f;
  if (c.rope_scaling == "linear" || c.rope_scaling == "yarn") {
    if (!f.find(a + ".rope.scaling.factor"))
      fail(ErrorKind::InvalidInput, "{}: {} rope scaling without {}.rope.scaling.factor", f.source(),
           c.rope_scaling, a);
  }
  if (c.rope_scaling == "linear") {
    linear = f.get_float_or(a + ".rope.scaling.factor").value_or(1.0);
  } else if (c.rope_scaling == "yarn") {
    if (c.arch == Arch::Phi3 || c.arch == Arch::Gemma3 || c.arch == Arch::Gemma2)
      fail(ErrorKind::InvalidInput, "{}: YaRN rope scaling on a {} model is not supported", f.source(), a);
    const double factor = f.get_float_or(a + ".rope.scaling.factor").value_or(1.0);
    const auto original = f.get_int_or(a + ".rope.scaling.original_context_length").value_or(c.n_ctx_train);
    const double beta_fast = f.get_float_or(a + ".rope.scaling.yarn_beta_fast").value_or(32.0);
    const double beta_slow = f.get_float_or(a + ".rope.scaling.yarn_beta_slow").value_or(1.0);
    if (!(factor >= 1.0) || !std::isfinite(factor) || original <= 0 || !(beta_fast > 0) || !(beta_slow > 0) ||
        !std::isfinite(beta_fast) || !std::isfinite(beta_slow))
      fail(ErrorKind::InvalidInput,
           "{}: YaRN parameters out of range (factor {}, original context {}, beta fast {}, slow {})",
           f.source(), factor, original, beta_fast, beta_slow);
    c.rope_divisors = yarn_rope_divisors(c.n_rot, c.rope_base, static_cast<float>(factor),
                                         static_cast<int>(std::min<int64_t>(original, int64_t{1} << 30)),
                                         static_cast<float>(beta_fast), static_cast<float>(beta_slow));
    // YaRN scales cos and sin, so both Q and K, by 1 + 0.1 ln(factor);
    // Mistral 3 divides that by its value for mscale_all_dim
    // (yarn_log_multiplier), as Transformers does.
    const auto mscale = [&](double all_dim) { return 1.0 + 0.1 * all_dim * std::log(factor); };
    double m = mscale(1.0);
    if (const auto log_mul = f.get_float_or(a + ".rope.scaling.yarn_log_multiplier")) {
      if (c.arch != Arch::Mistral3 || !(*log_mul >= 0) || !std::isfinite(*log_mul))
        fail(ErrorKind::InvalidInput,
             "{}: {}.rope.scaling.yarn_log_multiplier = {:g} is not implemented here", f.source(), a,
             *log_mul);
      m /= mscale(*log_mul);
    }
    yarn_query_scale = static_cast<float>(m * m);
  } else if (c.rope_scaling != "none") {
    fail(ErrorKind::InvalidInput,
         "{}: rope scaling type '{}' is not supported (supported: none, linear, yarn)", f.source(),
         c.rope_scaling);
  }
  if (auto legacy = f.get_float_or(a + ".rope.scale_linear"); legacy && *legacy != 1.0) {
    c.rope_scaling = "linear";
    linear *= *legacy;
  }
  if (!(linear >= 1.0) || !std::isfinite(linear))
    fail(ErrorKind::InvalidInput, "{}: linear rope scaling factor {} must be at least 1", f.source(), linear);
  if (linear != 1.0) c.rope_divisors.assign(static_cast<size_t>(c.n_rot / 2), static_cast<float>(linear));
  return yarn_query_scale;
}

// What scales queries, embeddings and logits: Gemma's embedding and 27B
// query scales, YaRN's, Mistral 3's attention temperature, soft-capping,
// Phi-3's LongRoPE magnitude.
void read_scales(const GgufFile& f, ModelConfig& c, float yarn_query_scale) {
  const std::string& a = c.arch_name;
  const bool gemma = c.arch == Arch::Gemma2 || c.arch == Arch::Gemma3;
  if (gemma) {
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    // The 27B models (Gemma 2: 46 layers, Gemma 3: 62) scale queries by
    // 1/sqrt(n_embd / n_head), not 1/sqrt(head_dim).
    if (c.n_layer == (c.arch == Arch::Gemma2 ? 46 : 62))
      c.q_scale = std::sqrt(float(c.head_dim) / float(c.n_embd / c.n_head));
  }
  c.q_scale *= yarn_query_scale;
  if (auto t = f.get_float_or(a + ".attention.temperature_scale"); t && *t != 0) {
    if (c.arch != Arch::Mistral3 || !std::isfinite(*t))
      fail(ErrorKind::InvalidInput, "{}: {}.attention.temperature_scale = {:g} is not implemented here",
           f.source(), a, *t);
    c.attn_temp_scale = static_cast<float>(*t);
    const auto length = f.get_int_or(a + ".rope.scaling.original_context_length").value_or(c.n_ctx_train);
    if (length <= 0 || length > (int64_t{1} << 30))
      fail(ErrorKind::InvalidInput, "{}: the attention temperature's length {} is out of range", f.source(),
           length);
    c.attn_temp_length = static_cast<int>(length);
  }
  c.attn_softcap = static_cast<float>(f.get_float_or(a + ".attn_logit_softcapping").value_or(0.0));
  if (!(c.attn_softcap >= 0) || !std::isfinite(c.attn_softcap))
    fail(ErrorKind::InvalidInput, "{}: attn_logit_softcapping {} is invalid", f.source(), c.attn_softcap);
  c.final_softcap = static_cast<float>(f.get_float_or(a + ".final_logit_softcapping").value_or(0.0));
  if (!(c.final_softcap >= 0) || !std::isfinite(c.final_softcap))
    fail(ErrorKind::InvalidInput, "{}: final_logit_softcapping {} is invalid", f.source(), c.final_softcap);
  // Phi-3's LongRoPE magnitude factor scales both Q and K.
  if (auto af = f.get_float_or(a + ".rope.scaling.attn_factor")) {
    if (c.arch != Arch::Phi3 || !(*af > 0) || !std::isfinite(*af))
      fail(ErrorKind::InvalidInput, "{}: {}.rope.scaling.attn_factor = {} is not implemented here",
           f.source(), a, *af);
    c.q_scale *= static_cast<float>(*af * *af);
  }
}

// Which layers attend through a sliding window, and which skip RoPE.
void read_layer_kinds(const GgufFile& f, ModelConfig& c) {
  const std::string& a = c.arch_name;
  // Sliding windows: every layer, or the pattern's (Gemma 3: five windowed
  // layers, then one global; or one flag per layer).
  if (f.find(a + ".attention.sliding_window")) {
    const int64_t w = f.get_int(a + ".attention.sliding_window");
    if (w < 0 || w > (int64_t{1} << 30))
      fail(ErrorKind::InvalidInput, "{}: attention.sliding_window = {} is out of range", f.source(), w);
    c.sliding_window = static_cast<int>(w);
  }
  if (c.sliding_window > 0) {
    c.layer_windowed.assign(c.n_layer, 1);
    const std::string pattern_key = a + ".attention.sliding_window_pattern";
    const GgufValue* pattern = f.find(pattern_key);
    // Gemma 2 alternates windowed and global layers; Gemma 3 has five windowed, then one global.
    int64_t period = c.arch == Arch::Gemma3 ? 6 : c.arch == Arch::Gemma2 ? 2 : 1;
    if (pattern && pattern->type == GgufType::Array) {
      const auto& flags = std::get<std::vector<GgufValue>>(pattern->data);
      if (flags.size() != static_cast<size_t>(c.n_layer) || pattern->elem_type != GgufType::Bool)
        fail(ErrorKind::InvalidInput, "{}: {} must hold one bool per layer ({})", f.source(), pattern_key,
             c.n_layer);
      for (int il = 0; il < c.n_layer; ++il) c.layer_windowed[il] = std::get<bool>(flags[il].data);
      period = 0;
    } else if (pattern) {
      period = pattern->as_int(pattern_key);
      if (period < 0 || period > c.n_layer + 1)
        fail(ErrorKind::InvalidInput, "{}: {} = {} is out of range", f.source(), pattern_key, period);
    }
    // Period n: layers il with il % n < n - 1 are windowed (n = 0 or 1: all).
    if (period > 1)
      for (int il = 0; il < c.n_layer; ++il) c.layer_windowed[il] = il % period < period - 1;
    if (c.arch == Arch::Gemma3)
      c.rope_base_local = static_cast<float>(f.get_float_or(a + ".rope.freq_base_swa").value_or(10000.0));
  }
  if (c.arch == Arch::SmolLM3) {  // no RoPE in every fourth layer
    c.layer_no_rope.assign(c.n_layer, 0);
    for (int il = 3; il < c.n_layer; il += 4) c.layer_no_rope[il] = 1;
  }
}

// Refuses any key of the architecture the forward pass does not implement,
// and the model shapes it does not compute (other value widths, experts,
// split files).
void refuse_unimplemented(const GgufFile& f, const ModelConfig& c) {
  const std::string& a = c.arch_name;
  // Keys the forward pass implements or that do not change it; any other key
  // of the architecture's (attention soft-capping, experts, other attention
  // widths...) is refused by name.
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
                                              "expert_used_count",
                                              "attention.sliding_window",
                                              "attention.sliding_window_pattern",
                                              "rope.freq_base_swa",
                                              "rope.scaling.attn_factor",
                                              "rope.scaling.yarn_beta_fast",
                                              "rope.scaling.yarn_log_multiplier",
                                              "attention.temperature_scale",
                                              "rope.scaling.yarn_beta_slow",
                                              "final_logit_softcapping",
                                              "attn_logit_softcapping"};
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
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch_name = f.get_string("general.architecture");
  const std::optional<Arch> arch = parse_arch(c.arch_name);
  if (!arch)
    fail(ErrorKind::InvalidInput, "{}: architecture '{}' is not supported (supported: {})", f.source(),
         c.arch_name, fmt::join(arch_names(), ", "));
  c.arch = *arch;
  // Llama and SmolLM3 rotate adjacent pairs; the others NeoX halves. Qwen2
  // adds biases to Q, K and V; Qwen3 and Gemma 3 normalize each head of Q and K.
  c.rope_style = c.arch == Arch::Llama || c.arch == Arch::Mistral3 || c.arch == Arch::SmolLM3
                     ? RopeStyle::Normal
                     : RopeStyle::Neox;
  c.qkv_bias = c.arch == Arch::Qwen2;
  c.qk_norm = c.arch == Arch::Qwen3 || c.arch == Arch::Gemma3;
  c.fused_qkv = c.arch == Arch::Phi3;
  const bool gemma = c.arch == Arch::Gemma2 || c.arch == Arch::Gemma3;
  if (gemma) {
    c.post_norms = true;
    c.ffn_act = Activation::GeluTanh;
  }
  const std::string& a = c.arch_name;
  read_shape(f, c);
  c.position_scheme = f.get_string_or(kPositionSchemeKey).value_or("");
  c.tree_context = f.get_string_or(kTreeContextKey).value_or("");
  c.prompt = RagWrapper::from_gguf(f);
  c.rms_eps = static_cast<float>(f.get_float_or(a + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(c.rms_eps > 0)) fail(ErrorKind::InvalidInput, "{}: RMSNorm epsilon must be positive", f.source());
  const float yarn_query_scale = read_rope(f, c);
  read_scales(f, c, yarn_query_scale);
  read_layer_kinds(f, c);
  refuse_unimplemented(f, c);
  return c;
}

}  // namespace depcache

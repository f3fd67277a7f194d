#include "model/model_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compute/quant.h"
#include "model/gguf.h"
#include "model/vocab.h"
#include "util/error.h"
#include "util/random.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

uint32_t file_type_code(DType t) {
  switch (t) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::Q4_0:
      return 2;
    case DType::Q8_0:
      return 7;
    case DType::Q4_K:
      return 15;
    case DType::Q6_K:
      return 18;
    case DType::BF16:
      return 32;
    default:
      fail(ErrorKind::InvalidInput, "cannot write models of type {}", dtype_info(t).name);
  }
}

// The type a matrix with rows of n_in elements is stored in: the requested
// one when the row fits its blocks, else the closest that does.
DType storable_type(DType wanted, int64_t n_in) {
  if (n_in % dtype_info(wanted).block_size == 0) return wanted;
  if (n_in % kQ32 == 0) return DType::Q8_0;
  return DType::F16;
}

// The note for a matrix written in a fallback type.
std::string fallback_note(const std::string& name, int64_t n_in, DType wanted, DType written) {
  return fmt::format("{}: rows of {} do not fit {} blocks, written as {}", name, n_in,
                     dtype_info(wanted).name, dtype_info(written).name);
}

}  // namespace

bool inherited_metadata_key(std::string_view key) {
  return key.starts_with("tokenizer.") || key.starts_with(kPromptKeyPrefix);
}

namespace {

std::vector<std::pair<std::string, GgufValue>> tokenizer_metadata(const RandomModelOptions& o) {
  std::vector<std::pair<std::string, GgufValue>> md;
  if (o.vocab_from) {
    const GgufFile src = GgufFile::open(*o.vocab_from);
    Vocab::from_gguf(src);  // validates before copying
    for (const auto& [k, v] : src.metadata())
      if (inherited_metadata_key(k)) md.emplace_back(k, v);
  } else {
    Vocab::builtin_bytes().append_gguf_metadata(md);
  }
  return md;
}

GgufValue* find_key(std::vector<std::pair<std::string, GgufValue>>& md, std::string_view key) {
  for (auto& [k, v] : md)
    if (k == key) return &v;
  return nullptr;
}

void set_key(std::vector<std::pair<std::string, GgufValue>>& md, const std::string& key, GgufValue value) {
  if (GgufValue* old = find_key(md, key))
    *old = std::move(value);
  else
    md.emplace_back(key, std::move(value));
}

// Pads the token list (and its parallel arrays) with unused tokens up to n.
void pad_vocab(std::vector<std::pair<std::string, GgufValue>>& md, int n) {
  auto& tokens = std::get<std::vector<GgufValue>>(find_key(md, "tokenizer.ggml.tokens")->data);
  const int have = static_cast<int>(tokens.size());
  for (int i = have; i < n; ++i) tokens.push_back(GgufValue::string(fmt::format("<unused{}>", i - have)));
  if (GgufValue* scores = find_key(md, "tokenizer.ggml.scores")) {
    auto& a = std::get<std::vector<GgufValue>>(scores->data);
    while (static_cast<int>(a.size()) < n) a.push_back(GgufValue::f32(0.0f));
  }
  if (GgufValue* types = find_key(md, "tokenizer.ggml.token_type")) {
    auto& a = std::get<std::vector<GgufValue>>(types->data);
    while (static_cast<int>(a.size()) < n) a.push_back(GgufValue::i32(5));  // unused
  }
}

}  // namespace

namespace {

// A named preset: how it changes the default (tiny) shape.
struct Preset {
  std::string_view name;
  void (*apply)(ModelShape& s);
};

// In the order model_preset_names() lists them.
const Preset kPresets[] = {
    {"tiny", [](ModelShape&) {}},
    {"tiny-qwen2",
     [](ModelShape& s) {
       s.arch = Arch::Qwen2;
       s.rope_base = 1e6f;
       s.rms_eps = 1e-6f;
     }},
    // Qwen2.5's YaRN configuration, scaled down: the original context 64
    // stretched four times, so the ramp between kept and divided frequencies
    // falls inside the tiny model's 16 rotary pairs.
    {"tiny-qwen2-yarn",
     [](ModelShape& s) {
       s.arch = Arch::Qwen2;
       s.rope_base = 1e6f, s.rms_eps = 1e-6f, s.n_ctx = 256;
       s.yarn_factor = 4.0f, s.yarn_original_context = 64;
     }},
    // Ministral 3's YaRN (mscale_all_dim 1) and attention temperature,
    // scaled down: an original context of 8, so that a short prompt's later
    // queries are sharpened.
    {"tiny-ministral3",
     [](ModelShape& s) {
       s.arch = Arch::Mistral3;
       s.n_ctx = 256;
       s.rope_base = 1e6f;
       s.yarn_factor = 4.0f, s.yarn_original_context = 8, s.yarn_log_multiplier = 1.0f;
       s.attn_temp_scale = 0.5f;
     }},
    // Partial rotary: half of each head rotates, the other half carries no
    // position (the engine and the float64 reference both read
    // rope.dimension_count; the other engine asserts full rotary for llama).
    {"tiny-partial-rope", [](ModelShape& s) { s.n_rot = 8; }},
    // Tiny with Llama 3's RoPE scaling, its context scaled to the tiny one's.
    {"tiny-llama3",
     [](ModelShape& s) {
       s.llama3_rope = ModelShape::Llama3Rope{8.0f, 1.0f, 4.0f, 64};
     }},
    // Tiny with Qwen3's per-head Q/K norms and heads wider than embd/heads.
    {"tiny-qwen3",
     [](ModelShape& s) {
       s.arch = Arch::Qwen3;
       s.head_dim = 32;
       s.rope_base = 1e6f;
       s.rms_eps = 1e-6f;
     }},
    // Four layers: windowed (8 positions) and global in turn. Caps low enough
    // to bend the tiny model's scores and logits, so a test sees whether they
    // are applied.
    {"tiny-gemma2",
     [](ModelShape& s) {
       s.arch = Arch::Gemma2;
       s.n_layer = 4, s.n_head_kv = 1, s.head_dim = 32;
       s.rms_eps = 1e-6f;
       s.sliding_window = 8;
       s.attn_softcap = 0.5f, s.final_softcap = 3.0f;
       s.tied_embeddings = true;
     }},
    // Six layers: five windowed (8 positions), one global.
    {"tiny-gemma3",
     [](ModelShape& s) {
       s.arch = Arch::Gemma3;
       s.n_layer = 6, s.n_head_kv = 1, s.head_dim = 32;
       s.rope_base = 1e6f, s.rope_base_local = 10000.0f, s.rms_eps = 1e-6f;
       s.sliding_window = 8;
       s.tied_embeddings = true;
     }},
    // Fused QKV and gate-up, a window of 16 positions on every layer.
    {"tiny-phi3",
     [](ModelShape& s) {
       s.arch = Arch::Phi3;
       s.sliding_window = 16;
     }},
    // Phi-3.5's LongRoPE, scaled down: short factors up to 32 positions, long
    // ones (each pair turning up to 8 times slower) beyond.
    {"tiny-phi3-longrope",
     [](ModelShape& s) {
       s.arch = Arch::Phi3;
       s.n_ctx = 256;
       s.longrope_original_context = 32;
       for (int i = 0; i < head_dim_of(s) / 2; ++i) {
         s.longrope_short.push_back(1.0f + 0.05f * i);
         s.longrope_long.push_back(1.0f + 7.0f * i / (head_dim_of(s) / 2 - 1));
       }
     }},
    // Four layers: the fourth without RoPE.
    {"tiny-smollm3",
     [](ModelShape& s) {
       s.arch = Arch::SmolLM3;
       s.n_layer = 4;
     }},
    {"qwen2-0.5b",
     [](ModelShape& s) {
       s.arch = Arch::Qwen2;
       s.n_layer = 24, s.n_embd = 896, s.n_head = 14, s.n_head_kv = 2, s.n_ff = 4864;
       s.n_ctx = 32768, s.n_vocab = 32000, s.rope_base = 1e6f, s.rms_eps = 1e-6f;
       s.tied_embeddings = true;  // as the released Qwen2-0.5B
     }},
    // Qwen3-0.6B.
    {"qwen3-0.6b",
     [](ModelShape& s) {
       s.arch = Arch::Qwen3;
       s.n_layer = 28, s.n_embd = 1024, s.n_head = 16, s.n_head_kv = 8, s.head_dim = 128, s.n_ff = 3072;
       s.n_ctx = 40960, s.n_vocab = 151936, s.rope_base = 1e6f, s.rms_eps = 1e-6f;
       s.tied_embeddings = true;
     }},
    {"llama-1b",
     [](ModelShape& s) {
       s.n_layer = 16, s.n_embd = 2048, s.n_head = 32, s.n_head_kv = 8, s.n_ff = 8192;
       s.n_ctx = 8192, s.n_vocab = 32000, s.rope_base = 500000.0f;
     }},
    // Llama-3.2-1B: tied embeddings, Llama 3 RoPE scaling.
    {"llama3.2-1b",
     [](ModelShape& s) {
       s.n_layer = 16, s.n_embd = 2048, s.n_head = 32, s.n_head_kv = 8, s.n_ff = 8192;
       s.n_ctx = 131072, s.n_vocab = 128256, s.rope_base = 500000.0f;
       s.tied_embeddings = true;
       s.llama3_rope = ModelShape::Llama3Rope{32.0f, 1.0f, 4.0f, 8192};
     }},
    // Ministral-3-3B.
    {"ministral3-3b",
     [](ModelShape& s) {
       s.arch = Arch::Mistral3;
       s.n_layer = 26, s.n_embd = 3072, s.n_head = 32, s.n_head_kv = 8, s.head_dim = 128, s.n_ff = 9216;
       s.n_ctx = 262144, s.n_vocab = 131072, s.rope_base = 1e6f, s.rms_eps = 1e-5f;
       s.yarn_factor = 16.0f, s.yarn_original_context = 16384, s.yarn_log_multiplier = 1.0f;
       s.attn_temp_scale = 0.1f;
       s.tied_embeddings = true;
     }},
    // Gemma-2-2B.
    {"gemma2-2b",
     [](ModelShape& s) {
       s.arch = Arch::Gemma2;
       s.n_layer = 26, s.n_embd = 2304, s.n_head = 8, s.n_head_kv = 4, s.head_dim = 256, s.n_ff = 9216;
       s.n_ctx = 8192, s.n_vocab = 256000, s.rms_eps = 1e-6f;
       s.sliding_window = 4096;
       s.attn_softcap = 50.0f, s.final_softcap = 30.0f;
       s.tied_embeddings = true;
     }},
    // Gemma-3-1B.
    {"gemma3-1b",
     [](ModelShape& s) {
       s.arch = Arch::Gemma3;
       s.n_layer = 26, s.n_embd = 1152, s.n_head = 4, s.n_head_kv = 1, s.head_dim = 256, s.n_ff = 6912;
       s.n_ctx = 32768, s.n_vocab = 262144, s.rope_base = 1e6f, s.rope_base_local = 10000.0f,
       s.rms_eps = 1e-6f;
       s.sliding_window = 512;
       s.tied_embeddings = true;
     }},
    // Phi-3.5-mini's width, 8 of its 32 layers, its 4k context.
    {"phi3.5-mini-8l",
     [](ModelShape& s) {
       s.arch = Arch::Phi3;
       s.n_layer = 8, s.n_embd = 3072, s.n_head = 32, s.n_head_kv = 32, s.n_ff = 8192;
       s.n_ctx = 4096, s.n_vocab = 32064, s.sliding_window = 262144;
     }},
    // SmolLM3-3B's width, 12 of its 36 layers.
    {"smollm3-3b-12l",
     [](ModelShape& s) {
       s.arch = Arch::SmolLM3;
       s.n_layer = 12, s.n_embd = 2048, s.n_head = 16, s.n_head_kv = 4, s.n_ff = 11008;
       s.n_ctx = 65536, s.n_vocab = 128256, s.rope_base = 5e6f, s.rms_eps = 1e-6f;
       s.tied_embeddings = true;
     }},
};

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

std::vector<float> llama3_rope_factors(int n_rot, float base, float factor, float low_freq_factor,
                                       float high_freq_factor, int original_context) {
  const double pi = 3.14159265358979323846;
  const double low_wavelen = original_context / double(low_freq_factor);
  const double high_wavelen = original_context / double(high_freq_factor);
  std::vector<float> out;
  for (int i = 0; i < n_rot / 2; ++i) {
    const double wavelen = 2 * pi / std::pow(double(base), -2.0 * i / n_rot);
    if (wavelen < high_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      out.push_back(factor);
    } else {
      const double smooth =
          (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      out.push_back(static_cast<float>(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return out;
}

std::optional<ModelShape> model_preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (p.name != name) continue;
    ModelShape s;
    s.preset = name;
    p.apply(s);
    return s;
  }
  return std::nullopt;
}

std::vector<ModelTensor> model_tensors(const ModelShape& s, int n_vocab) {
  const int64_t head_dim = head_dim_of(s);
  const int64_t n_q = s.n_head * head_dim, n_kv = s.n_head_kv * head_dim;
  std::vector<ModelTensor> out;
  const auto matrix = [&](std::string name, int64_t n_in, int64_t n_out) {
    out.push_back({std::move(name), n_in, n_out, true, false});
  };
  const auto vector = [&](std::string name, int64_t n, bool norm) {
    out.push_back({std::move(name), n, 1, false, norm});
  };
  matrix("token_embd.weight", s.n_embd, n_vocab);
  for (int il = 0; il < s.n_layer; ++il) {
    const std::string p = fmt::format("blk.{}.", il);
    vector(p + "attn_norm.weight", s.n_embd, true);
    if (s.arch == Arch::Phi3) {
      matrix(p + "attn_qkv.weight", s.n_embd, n_q + 2 * n_kv);
    } else {
      matrix(p + "attn_q.weight", s.n_embd, n_q);
      matrix(p + "attn_k.weight", s.n_embd, n_kv);
      matrix(p + "attn_v.weight", s.n_embd, n_kv);
    }
    if (s.arch == Arch::Qwen2) {
      vector(p + "attn_q.bias", n_q, false);
      vector(p + "attn_k.bias", n_kv, false);
      vector(p + "attn_v.bias", n_kv, false);
    }
    if (s.arch == Arch::Qwen3 || s.arch == Arch::Gemma3) {
      vector(p + "attn_q_norm.weight", head_dim, true);
      vector(p + "attn_k_norm.weight", head_dim, true);
    }
    matrix(p + "attn_output.weight", n_q, s.n_embd);
    const bool gemma = s.arch == Arch::Gemma2 || s.arch == Arch::Gemma3;
    if (gemma) vector(p + "post_attention_norm.weight", s.n_embd, true);
    vector(p + "ffn_norm.weight", s.n_embd, true);
    if (s.arch == Arch::Phi3) {
      matrix(p + "ffn_up.weight", s.n_embd, 2 * s.n_ff);  // gate rows, then up rows
    } else {
      matrix(p + "ffn_gate.weight", s.n_embd, s.n_ff);
      matrix(p + "ffn_up.weight", s.n_embd, s.n_ff);
    }
    matrix(p + "ffn_down.weight", s.n_ff, s.n_embd);
    if (gemma) vector(p + "post_ffw_norm.weight", s.n_embd, true);
  }
  vector("output_norm.weight", s.n_embd, true);
  if (!s.tied_embeddings) matrix("output.weight", s.n_embd, n_vocab);
  return out;
}

namespace {

void check_shape(const ModelShape& s) {
  if (s.n_layer <= 0 || s.n_embd <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_ff <= 0 || s.n_ctx <= 0)
    fail(ErrorKind::InvalidInput, "model shape sizes must be positive");
  if ((s.head_dim == 0 && s.n_embd % s.n_head != 0) || s.n_head % s.n_head_kv != 0)
    fail(ErrorKind::InvalidInput, "embedding {} must divide into {} heads, and heads into {} KV heads",
         s.n_embd, s.n_head, s.n_head_kv);
  if (s.n_rot < 0 || s.n_rot > head_dim_of(s) || s.n_rot % 2 != 0)
    fail(ErrorKind::InvalidInput, "{} rotary dimensions: at most the head width {}, and even", s.n_rot,
         head_dim_of(s));
  if (s.head_dim < 0 || head_dim_of(s) % 2 != 0)
    fail(ErrorKind::InvalidInput, "head size must be even for RoPE");
}

// The shape's sizes, norms, windows and caps under the architecture's keys.
void set_shape_metadata(GgufWriter& w, const ModelShape& s, const std::string& arch) {
  w.set(arch + ".context_length", GgufValue::u32(s.n_ctx));
  w.set(arch + ".embedding_length", GgufValue::u32(s.n_embd));
  w.set(arch + ".block_count", GgufValue::u32(s.n_layer));
  w.set(arch + ".feed_forward_length", GgufValue::u32(s.n_ff));
  w.set(arch + ".attention.head_count", GgufValue::u32(s.n_head));
  w.set(arch + ".attention.head_count_kv", GgufValue::u32(s.n_head_kv));
  w.set(arch + ".attention.layer_norm_rms_epsilon", GgufValue::f32(s.rms_eps));
  w.set(arch + ".rope.freq_base", GgufValue::f32(s.rope_base));
  w.set(arch + ".rope.dimension_count", GgufValue::u32(s.n_rot > 0 ? s.n_rot : head_dim_of(s)));
  if (s.head_dim > 0) {
    w.set(arch + ".attention.key_length", GgufValue::u32(s.head_dim));
    w.set(arch + ".attention.value_length", GgufValue::u32(s.head_dim));
  }
  w.set(arch + ".vocab_size", GgufValue::u32(s.n_vocab));
  if (s.sliding_window > 0) {
    w.set(arch + ".attention.sliding_window", GgufValue::u32(s.sliding_window));
    if (s.sliding_window_pattern > 0)
      w.set(arch + ".attention.sliding_window_pattern", GgufValue::u32(s.sliding_window_pattern));
    if (s.rope_base_local > 0) w.set(arch + ".rope.freq_base_swa", GgufValue::f32(s.rope_base_local));
  }
  if (s.attn_softcap > 0) w.set(arch + ".attn_logit_softcapping", GgufValue::f32(s.attn_softcap));
  if (s.final_softcap > 0) w.set(arch + ".final_logit_softcapping", GgufValue::f32(s.final_softcap));
}

// YaRN, the attention temperature and linear RoPE scaling.
void set_rope_scaling_metadata(GgufWriter& w, const ModelShape& s, const std::string& arch) {
  if (s.yarn_factor > 0) {
    w.set(arch + ".rope.scaling.type", GgufValue::string("yarn"));
    w.set(arch + ".rope.scaling.factor", GgufValue::f32(s.yarn_factor));
    w.set(arch + ".rope.scaling.original_context_length", GgufValue::u32(s.yarn_original_context));
    if (s.yarn_log_multiplier > 0)
      w.set(arch + ".rope.scaling.yarn_log_multiplier", GgufValue::f32(s.yarn_log_multiplier));
  }
  if (s.attn_temp_scale != 0) w.set(arch + ".attention.temperature_scale", GgufValue::f32(s.attn_temp_scale));
  if (s.rope_linear_factor != 1.0f) {
    w.set(arch + ".rope.scaling.type", GgufValue::string("linear"));
    w.set(arch + ".rope.scaling.factor", GgufValue::f32(s.rope_linear_factor));
  }
}

// rope_freqs.weight: the shape's own factors, else Llama 3's computed ones.
void add_rope_freqs_tensor(GgufWriter& w, const ModelShape& s) {
  std::vector<float> freq_factors = s.rope_freq_factors;
  if (freq_factors.empty() && s.llama3_rope) {
    const ModelShape::Llama3Rope& l = *s.llama3_rope;
    freq_factors = llama3_rope_factors(head_dim_of(s), s.rope_base, l.factor, l.low_freq_factor,
                                       l.high_freq_factor, l.original_context);
  }
  if (freq_factors.empty()) return;
  const int half = head_dim_of(s) / 2;
  if ((s.arch != Arch::Llama && s.arch != Arch::Mistral3) || static_cast<int>(freq_factors.size()) != half)
    fail(ErrorKind::InvalidInput,
         "rope frequency factors: a Llama model with {} of them (one per rotary pair)", half);
  w.add_tensor("rope_freqs.weight", DType::F32, {half}, [f = freq_factors](uint8_t* dst, size_t) {
    std::memcpy(dst, f.data(), f.size() * sizeof(float));
  });
}

// Phi-3's LongRoPE factor tensors and the keys that go with them.
void add_longrope_tensors(GgufWriter& w, const ModelShape& s, const std::string& arch) {
  if (s.longrope_short.empty()) return;
  const int half = head_dim_of(s) / 2;
  if (s.arch != Arch::Phi3 || static_cast<int>(s.longrope_short.size()) != half ||
      s.longrope_long.size() != s.longrope_short.size() || s.longrope_original_context <= 0)
    fail(ErrorKind::InvalidInput, "LongRoPE factors: a Phi-3 model with {} short and {} long ones", half,
         half);
  for (const auto& named : {std::pair{"rope_factors_short.weight", &s.longrope_short},
                            std::pair{"rope_factors_long.weight", &s.longrope_long}}) {
    const std::vector<float>* f = named.second;
    w.add_tensor(named.first, DType::F32, {half},
                 [f](uint8_t* dst, size_t) { std::memcpy(dst, f->data(), f->size() * sizeof(float)); });
  }
  w.set(arch + ".rope.scaling.original_context_length", GgufValue::u32(s.longrope_original_context));
  const double ratio = double(s.n_ctx) / s.longrope_original_context;
  w.set(arch + ".rope.scaling.attn_factor",
        GgufValue::f32(
            static_cast<float>(std::sqrt(1 + std::log(ratio) / std::log(s.longrope_original_context)))));
}

// The model's weights, their values from `rows`; matrices in spec.type where
// their rows fit its blocks.
void add_weight_tensors(GgufWriter& w, const ModelFileSpec& spec, const TensorRowSource& rows,
                        RandomModelReport& report) {
  auto pool = std::make_shared<ThreadPool>(spec.n_threads);
  const std::vector<ModelTensor> tensors = model_tensors(spec.shape, spec.shape.n_vocab);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ModelTensor& t = tensors[i];
    report.n_params += t.size();
    if (!t.matrix) {
      w.add_tensor(t.name, DType::F32, {t.n_in}, [&rows, i, t](uint8_t* dst, size_t) {
        std::vector<float> v(t.n_in);
        rows(i, t, 0, v.data());
        std::memcpy(dst, v.data(), v.size() * sizeof(float));
      });
      continue;
    }
    const DType type = storable_type(spec.type, t.n_in);
    if (type != spec.type) report.notes.push_back(fallback_note(t.name, t.n_in, spec.type, type));
    w.add_tensor(t.name, type, {t.n_in, t.n_out}, [&rows, pool, i, t, type](uint8_t* dst, size_t) {
      const size_t rb = row_bytes(type, t.n_in);
      pool->parallel_for(t.n_out, [&](int64_t r, int) {
        std::vector<float> row(t.n_in);
        rows(i, t, r, row.data());
        quantize_row(type, row.data(), dst + r * rb, t.n_in);
      });
    });
  }
}

}  // namespace

RandomModelReport write_model(const std::filesystem::path& path, const ModelFileSpec& spec,
                              const TensorRowSource& rows) {
  const ModelShape& s = spec.shape;
  check_shape(s);
  file_type_code(spec.type);
  RandomModelReport report;
  report.n_vocab = s.n_vocab;
  const std::string arch = arch_name(s.arch);
  GgufWriter w;
  w.set("general.architecture", GgufValue::string(arch));
  w.set("general.name", GgufValue::string(spec.name));
  w.set("general.file_type", GgufValue::u32(file_type_code(spec.type)));
  w.set("general.quantization_version", GgufValue::u32(2));
  w.set("general.alignment", GgufValue::u32(32));
  set_shape_metadata(w, s, arch);
  set_rope_scaling_metadata(w, s, arch);
  add_rope_freqs_tensor(w, s);
  add_longrope_tensors(w, s, arch);
  for (const auto& [k, v] : spec.metadata) w.set(k, v);
  add_weight_tensors(w, spec, rows, report);
  w.write(path);
  report.file_bytes = std::filesystem::file_size(path);
  return report;
}

RandomModelReport write_random_model(const std::filesystem::path& path, const RandomModelOptions& o) {
  check_shape(o.shape);
  file_type_code(o.type);
  ModelFileSpec spec;
  spec.shape = o.shape;
  spec.type = o.type;
  spec.n_threads = o.n_threads;
  spec.metadata = tokenizer_metadata(o);
  auto& md = spec.metadata;
  if (!o.chat_template.empty()) set_key(md, "tokenizer.chat_template", GgufValue::string(o.chat_template));
  const int own_vocab =
      static_cast<int>(find_key(md, "tokenizer.ggml.tokens")->as_array("tokenizer.ggml.tokens").size());
  if (o.shape.n_vocab > own_vocab) {
    if (o.vocab_from)
      fail(ErrorKind::InvalidInput, "--vocab-size {} exceeds the {} tokens of {}", o.shape.n_vocab, own_vocab,
           o.vocab_from->string());
    pad_vocab(md, o.shape.n_vocab);
  }
  spec.shape.n_vocab = std::max(own_vocab, o.shape.n_vocab);
  if (!o.position_scheme.empty())
    md.insert(md.begin(), {kPositionSchemeKey, GgufValue::string(o.position_scheme)});
  if (!o.tree_context.empty()) md.insert(md.begin(), {kTreeContextKey, GgufValue::string(o.tree_context)});
  if (o.prompt)
    for (auto& [k, v] : o.prompt->metadata()) set_key(md, k, std::move(v));
  const std::string arch = arch_name(o.shape.arch);
  spec.name = fmt::format("depcache-random-{}", o.shape.preset.empty() ? arch : o.shape.preset);
  // Each tensor (numbered from 1 in file order) and each of its rows has its
  // own stream: the values do not depend on the number of threads.
  const uint64_t seed = o.seed;
  const float stddev = o.stddev, qk_stddev = o.qk_stddev > 0 ? o.qk_stddev : o.stddev;
  const int64_t qk_rows = int64_t{o.shape.n_head + o.shape.n_head_kv} * head_dim_of(o.shape);
  return write_model(path, spec, [=](size_t index, const ModelTensor& t, int64_t row, float* dst) {
    const uint64_t tseed = seed * 0x100000001B3ull + (static_cast<uint64_t>(index + 1) << 32);
    if (t.norm) {
      std::fill(dst, dst + t.n_in, 1.0f);
      // Per-head and post norms vary around 1, so a test sees them applied
      // element by element.
      if (t.name.ends_with("attn_q_norm.weight") || t.name.ends_with("attn_k_norm.weight") ||
          t.name.ends_with("post_attention_norm.weight") || t.name.ends_with("post_ffw_norm.weight")) {
        std::vector<float> jitter(t.n_in);
        fill_normal(jitter.data(), t.n_in, tseed, 0.2f);
        for (int64_t i = 0; i < t.n_in; ++i) dst[i] += jitter[i];
      }
      return;
    }
    // (A fused QKV matrix's query and key rows count as query and key.)
    const bool qk = t.name.ends_with("attn_q.weight") || t.name.ends_with("attn_k.weight") ||
                    (t.name.ends_with("attn_qkv.weight") && row < qk_rows);
    fill_normal(dst, t.n_in, tseed + static_cast<uint64_t>(row), qk ? qk_stddev : stddev);
  });
}

QuantizeReport quantize_model(const std::filesystem::path& in, const std::filesystem::path& out, DType type,
                              int n_threads) {
  file_type_code(type);  // rejects types we cannot write
  const GgufFile src = GgufFile::open(in);
  GgufWriter w;
  for (const auto& [k, v] : src.metadata())
    if (k != "general.alignment") w.set(k, v);
  w.set("general.file_type", GgufValue::u32(file_type_code(type)));
  w.set("general.alignment", GgufValue::u32(32));
  QuantizeReport report;
  auto pool = std::make_shared<ThreadPool>(n_threads);
  for (const GgufTensor& t : src.tensors()) {
    const bool matrix = t.dims.size() == 2 && t.name.ends_with(".weight") && dtype_info(t.type).compute;
    const DType to = matrix ? storable_type(type, t.dims[0]) : t.type;
    if (matrix && to != type) report.notes.push_back(fallback_note(t.name, t.dims[0], type, to));
    report.n_converted += matrix && to == type;
    const GgufTensor* tp = &t;
    w.add_tensor(t.name, to, t.dims, [tp, to, pool](uint8_t* dst, size_t n_bytes) {
      if (to == tp->type) {
        std::memcpy(dst, tp->data, n_bytes);
        return;
      }
      const int64_t n_in = tp->dims[0];
      const size_t rb_in = row_bytes(tp->type, n_in), rb_out = row_bytes(to, n_in);
      pool->parallel_for(tp->n_rows(), [&](int64_t r, int) {
        std::vector<float> row(n_in);
        dequantize_row(tp->type, tp->data + r * rb_in, row.data(), n_in);
        quantize_row(to, row.data(), dst + r * rb_out, n_in);
      });
    });
  }
  w.write(out);
  report.file_bytes = std::filesystem::file_size(out);
  return report;
}

}  // namespace depcache

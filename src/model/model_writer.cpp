#include "model/model_writer.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "compute/quant.h"
#include "model/gguf.h"
#include "model/vocab.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Normal samples by Box-Muller; each row has its own stream, so the output
// does not depend on the number of threads.
void fill_normal(float* out, int64_t n, uint64_t seed, float stddev) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(splitmix64(s) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)) * stddev;
    out[i] = static_cast<float>(r * std::cos(2 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(2 * M_PI * u2));
  }
}

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

std::vector<std::pair<std::string, GgufValue>> tokenizer_metadata(const RandomModelOptions& o) {
  std::vector<std::pair<std::string, GgufValue>> md;
  if (o.vocab_from) {
    const GgufFile src = GgufFile::open(*o.vocab_from);
    Vocab::from_gguf(src);  // validates before copying
    for (const auto& [k, v] : src.metadata())
      if (k.starts_with("tokenizer.")) md.emplace_back(k, v);
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

std::vector<std::string> model_preset_names() { return {"tiny", "tiny-qwen2", "qwen2-0.5b", "llama-1b"}; }

std::optional<ModelShape> model_preset(const std::string& name) {
  ModelShape s;
  s.preset = name;
  if (name == "tiny") return s;
  if (name == "tiny-qwen2") {
    s.arch = Arch::Qwen2;
    s.rope_base = 1e6f;
    s.rms_eps = 1e-6f;
    return s;
  }
  if (name == "qwen2-0.5b") {
    s.arch = Arch::Qwen2;
    s.n_layer = 24, s.n_embd = 896, s.n_head = 14, s.n_head_kv = 2, s.n_ff = 4864;
    s.n_ctx = 32768, s.n_vocab = 32000, s.rope_base = 1e6f, s.rms_eps = 1e-6f;
    s.tied_embeddings = true;  // as the released Qwen2-0.5B
    return s;
  }
  if (name == "llama-1b") {
    s.n_layer = 16, s.n_embd = 2048, s.n_head = 32, s.n_head_kv = 8, s.n_ff = 8192;
    s.n_ctx = 8192, s.n_vocab = 32000, s.rope_base = 500000.0f;
    return s;
  }
  return std::nullopt;
}

RandomModelReport write_random_model(const std::filesystem::path& path, const RandomModelOptions& o) {
  const ModelShape& s = o.shape;
  if (s.n_layer <= 0 || s.n_embd <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_ff <= 0 || s.n_ctx <= 0)
    fail(ErrorKind::InvalidInput, "model shape sizes must be positive");
  if (s.n_embd % s.n_head != 0 || s.n_head % s.n_head_kv != 0)
    fail(ErrorKind::InvalidInput, "embedding {} must divide into {} heads, and heads into {} KV heads",
         s.n_embd, s.n_head, s.n_head_kv);
  if ((s.n_embd / s.n_head) % 2 != 0) fail(ErrorKind::InvalidInput, "head size must be even for RoPE");
  file_type_code(o.type);

  RandomModelReport report;
  auto md = tokenizer_metadata(o);
  if (!o.chat_template.empty()) {
    if (GgufValue* t = find_key(md, "tokenizer.chat_template"))
      *t = GgufValue::string(o.chat_template);
    else
      md.emplace_back("tokenizer.chat_template", GgufValue::string(o.chat_template));
  }
  const int own_vocab =
      static_cast<int>(find_key(md, "tokenizer.ggml.tokens")->as_array("tokenizer.ggml.tokens").size());
  if (s.n_vocab > own_vocab) {
    if (o.vocab_from)
      fail(ErrorKind::InvalidInput, "--vocab-size {} exceeds the {} tokens of {}", s.n_vocab, own_vocab,
           o.vocab_from->string());
    pad_vocab(md, s.n_vocab);
  }
  const int n_vocab = std::max(own_vocab, s.n_vocab);
  report.n_vocab = n_vocab;

  const std::string arch = s.arch == Arch::Qwen2 ? "qwen2" : "llama";
  GgufWriter w;
  w.set("general.architecture", GgufValue::string(arch));
  w.set("general.name",
        GgufValue::string(fmt::format("depcache-random-{}", s.preset.empty() ? arch : s.preset)));
  w.set("general.file_type", GgufValue::u32(file_type_code(o.type)));
  w.set("general.quantization_version", GgufValue::u32(2));
  w.set("general.alignment", GgufValue::u32(32));
  w.set(arch + ".context_length", GgufValue::u32(s.n_ctx));
  w.set(arch + ".embedding_length", GgufValue::u32(s.n_embd));
  w.set(arch + ".block_count", GgufValue::u32(s.n_layer));
  w.set(arch + ".feed_forward_length", GgufValue::u32(s.n_ff));
  w.set(arch + ".attention.head_count", GgufValue::u32(s.n_head));
  w.set(arch + ".attention.head_count_kv", GgufValue::u32(s.n_head_kv));
  w.set(arch + ".attention.layer_norm_rms_epsilon", GgufValue::f32(s.rms_eps));
  w.set(arch + ".rope.freq_base", GgufValue::f32(s.rope_base));
  w.set(arch + ".rope.dimension_count", GgufValue::u32(s.n_embd / s.n_head));
  w.set(arch + ".vocab_size", GgufValue::u32(n_vocab));
  if (!o.position_scheme.empty()) w.set(kPositionSchemeKey, GgufValue::string(o.position_scheme));
  for (auto& [k, v] : md) w.set(k, std::move(v));

  auto pool = std::make_shared<ThreadPool>(o.n_threads);
  uint64_t tensor_index = 0;
  auto add_matrix = [&](const std::string& name, int64_t n_in, int64_t n_out) {
    const DType t = storable_type(o.type, n_in);
    if (t != o.type) report.notes.push_back(fallback_note(name, n_in, o.type, t));
    const uint64_t tseed = o.seed * 0x100000001B3ull + (++tensor_index << 32);
    const float stddev = o.stddev;
    report.n_params += n_in * n_out;
    w.add_tensor(name, t, {n_in, n_out}, [=](uint8_t* dst, size_t) {
      const size_t rb = row_bytes(t, n_in);
      pool->parallel_for(n_out, [&](int64_t r, int) {
        std::vector<float> row(n_in);
        fill_normal(row.data(), n_in, tseed + static_cast<uint64_t>(r), stddev);
        quantize_row(t, row.data(), dst + r * rb, n_in);
      });
    });
  };
  auto add_vector = [&](const std::string& name, int64_t n, bool ones) {
    const uint64_t tseed = o.seed * 0x100000001B3ull + (++tensor_index << 32);
    const float stddev = o.stddev;
    report.n_params += n;
    w.add_tensor(name, DType::F32, {n}, [=](uint8_t* dst, size_t) {
      std::vector<float> v(n, 1.0f);
      if (!ones) fill_normal(v.data(), n, tseed, stddev);
      std::memcpy(dst, v.data(), n * sizeof(float));
    });
  };

  const int64_t head_dim = s.n_embd / s.n_head;
  const int64_t n_q = s.n_head * head_dim, n_kv = s.n_head_kv * head_dim;
  add_matrix("token_embd.weight", s.n_embd, n_vocab);
  for (int il = 0; il < s.n_layer; ++il) {
    const std::string p = fmt::format("blk.{}.", il);
    add_vector(p + "attn_norm.weight", s.n_embd, true);
    add_matrix(p + "attn_q.weight", s.n_embd, n_q);
    add_matrix(p + "attn_k.weight", s.n_embd, n_kv);
    add_matrix(p + "attn_v.weight", s.n_embd, n_kv);
    if (s.arch == Arch::Qwen2) {
      add_vector(p + "attn_q.bias", n_q, false);
      add_vector(p + "attn_k.bias", n_kv, false);
      add_vector(p + "attn_v.bias", n_kv, false);
    }
    add_matrix(p + "attn_output.weight", n_q, s.n_embd);
    add_vector(p + "ffn_norm.weight", s.n_embd, true);
    add_matrix(p + "ffn_gate.weight", s.n_embd, s.n_ff);
    add_matrix(p + "ffn_up.weight", s.n_embd, s.n_ff);
    add_matrix(p + "ffn_down.weight", s.n_ff, s.n_embd);
  }
  add_vector("output_norm.weight", s.n_embd, true);
  if (!s.tied_embeddings) add_matrix("output.weight", s.n_embd, n_vocab);
  w.write(path);
  report.file_bytes = std::filesystem::file_size(path);
  return report;
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

#include "train/params.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "compute/quant.h"
#include "util/error.h"
#include "util/random.h"

namespace depcache {

ParamSet::ParamSet(const ModelShape& shape) : shape_(shape) {
  if (shape.arch != Arch::Llama)
    fail(ErrorKind::InvalidInput, "the trainer trains Llama models (no QKV biases)");
  if (shape.n_vocab <= 0) fail(ErrorKind::InvalidInput, "the model's vocabulary size is not set");
  tensors_ = model_tensors(shape, shape.n_vocab);
  size_t total = 0;
  for (const ModelTensor& t : tensors_) {
    offsets_.push_back(total);
    total += static_cast<size_t>(t.size());
  }
  values_.assign(total, 0.0f);
  for (int il = 0; il < shape.n_layer; ++il) {
    const std::string p = fmt::format("blk.{}.", il);
    layers_.push_back(
        {index_of(p + "attn_norm.weight"), index_of(p + "attn_q.weight"), index_of(p + "attn_k.weight"),
         index_of(p + "attn_v.weight"), index_of(p + "attn_output.weight"), index_of(p + "ffn_norm.weight"),
         index_of(p + "ffn_gate.weight"), index_of(p + "ffn_up.weight"), index_of(p + "ffn_down.weight")});
  }
  output_norm_ = index_of("output_norm.weight");
  output_ = shape.tied_embeddings ? tok_embd() : index_of("output.weight");
}

size_t ParamSet::index_of(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return i;
  fail(ErrorKind::Internal, "no tensor {} in the model", name);
}

void ParamSet::init_random(uint64_t seed, float stddev) {
  const float residual = stddev / std::sqrt(2.0f * static_cast<float>(std::max(shape_.n_layer, 1)));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const ModelTensor& t = tensors_[i];
    float* dst = data(i);
    if (t.norm) {
      std::fill(dst, dst + t.size(), 1.0f);
      continue;
    }
    const bool projection = t.name.ends_with("attn_output.weight") || t.name.ends_with("ffn_down.weight");
    const uint64_t tseed = seed * 0x100000001B3ull + (static_cast<uint64_t>(i + 1) << 32);
    for (int64_t r = 0; r < t.n_out; ++r)
      fill_normal(dst + r * t.n_in, t.n_in, tseed + static_cast<uint64_t>(r), projection ? residual : stddev);
  }
}

ModelShape ParamSet::shape_of(const ModelConfig& c, bool tied) {
  ModelShape s;
  s.arch = c.arch;
  s.n_layer = c.n_layer;
  s.n_embd = c.n_embd;
  s.n_head = c.n_head;
  s.n_head_kv = c.n_head_kv;
  s.n_ff = c.n_ff;
  s.n_ctx = c.n_ctx_train;
  s.n_vocab = c.n_vocab;
  s.rope_base = c.rope_base;
  s.rms_eps = c.rms_eps;
  s.tied_embeddings = tied;
  return s;
}

ParamSet ParamSet::from_model(const Model& model) {
  const ModelConfig& c = model.config();
  if (c.arch != Arch::Llama || c.qkv_bias || c.rope_style != RopeStyle::Normal || c.n_rot != c.head_dim)
    fail(ErrorKind::InvalidInput, "the trainer takes Llama models with full-width RoPE and no biases");
  if (!c.rope_divisors.empty())
    fail(ErrorKind::InvalidInput,
         "the trainer does not implement RoPE scaling (rope_freqs or linear scaling)");
  const bool tied = model.output.data == model.tok_embd.data;
  ParamSet p(shape_of(c, tied));
  const auto matrix = [&](size_t index, const WeightMatrix& m) {
    for (int64_t r = 0; r < m.n_out; ++r)
      dequantize_row(m.type, m.row(r), p.data(index) + r * m.n_in, m.n_in);
  };
  const auto vector = [&](size_t index, const std::vector<float>& v) {
    std::memcpy(p.data(index), v.data(), v.size() * sizeof(float));
  };
  matrix(p.tok_embd(), model.tok_embd);
  for (int il = 0; il < c.n_layer; ++il) {
    const LayerWeights& w = model.layers[il];
    const LayerIndex& x = p.layer(il);
    vector(x.attn_norm, w.attn_norm);
    matrix(x.wq, w.wq);
    matrix(x.wk, w.wk);
    matrix(x.wv, w.wv);
    matrix(x.wo, w.wo);
    vector(x.ffn_norm, w.ffn_norm);
    matrix(x.w_gate, w.w_gate);
    matrix(x.w_up, w.w_up);
    matrix(x.w_down, w.w_down);
  }
  vector(p.output_norm(), model.output_norm);
  if (!tied) matrix(p.output(), model.output);
  return p;
}

RandomModelReport ParamSet::write_gguf(const std::filesystem::path& path, const std::string& name, DType type,
                                       std::vector<std::pair<std::string, GgufValue>> metadata) const {
  ModelFileSpec spec;
  spec.shape = shape_;
  spec.type = type;
  spec.name = name;
  spec.metadata = std::move(metadata);
  return write_model(path, spec, [this](size_t index, const ModelTensor& t, int64_t row, float* dst) {
    std::memcpy(dst, data(index) + row * t.n_in, t.n_in * sizeof(float));
  });
}

}  // namespace depcache

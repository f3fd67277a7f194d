#include "model/model.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "compute/packed_matrix.h"
#include "compute/quant.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

// Reads the tensors the forward pass uses and remembers which: a file with
// any other is refused (check_all_used), since a tensor the engine ignores
// would change what the model computes.
class TensorLoader {
 public:
  explicit TensorLoader(const GgufFile& f) : f_(f) {}

  void check_all_used() const {
    for (const GgufTensor& t : f_.tensors())
      if (!used_.count(t.name))
        fail(ErrorKind::InvalidInput,
             "{}: tensor '{}' is not implemented by this engine for architecture '{}' "
             "(it would change what the model computes)",
             f_.source(), t.name, f_.get_string_or("general.architecture").value_or("?"));
  }

  const GgufTensor& require(const std::string& name) const {
    const GgufTensor* t = f_.find_tensor(name);
    if (!t) fail(ErrorKind::InvalidInput, "{}: tensor '{}' is missing", f_.source(), name);
    used_.insert(name);
    if (!dtype_info(t->type).compute)
      fail(ErrorKind::InvalidInput, "{}: tensor '{}' has type {}, which the engine cannot compute with",
           f_.source(), name, dtype_info(t->type).name);
    return *t;
  }

  WeightMatrix matrix(const std::string& name, int64_t n_in, int64_t n_out) const {
    return view(require(name), n_in, n_out);
  }

  WeightMatrix view(const GgufTensor& t, int64_t n_in, int64_t n_out) const {
    used_.insert(t.name);
    if (t.dims.size() != 2 || t.dims[0] != n_in || t.dims[1] != n_out)
      fail(ErrorKind::InvalidInput, "{}: tensor '{}' has shape [{}], expected [{}, {}]", f_.source(), t.name,
           fmt::join(t.dims, ", "), n_in, n_out);
    return {t.type, n_in, n_out, t.data, row_bytes(t.type, n_in), nullptr};
  }

  // Output rows [first, first + count) of a fused matrix of n_out rows (Phi-3's QKV, gate-up).
  WeightMatrix rows(const std::string& name, int64_t n_in, int64_t n_out, int64_t first,
                    int64_t count) const {
    WeightMatrix w = matrix(name, n_in, n_out);
    w.data = w.row(first);
    w.n_out = count;
    return w;
  }

  std::vector<float> vector(const std::string& name, int64_t n) const {
    const GgufTensor& t = require(name);
    if (t.n_elements() != n)
      fail(ErrorKind::InvalidInput, "{}: tensor '{}' has {} elements, expected {}", f_.source(), name,
           t.n_elements(), n);
    std::vector<float> out(n);
    dequantize_row(t.type, t.data, out.data(), n);
    return out;
  }

 private:
  const GgufFile& f_;
  mutable std::set<std::string> used_;
};

// Layer il's weights; Phi-3's fused QKV and gate-up are viewed as row ranges.
void load_layer(const TensorLoader& ld, const GgufFile& f, const ModelConfig& c, int il, LayerWeights& l) {
  const int64_t n_q = int64_t{c.n_head} * c.head_dim;
  const int64_t n_kv = c.n_embd_kv();
  const std::string p = fmt::format("blk.{}.", il);
  l.attn_norm = ld.vector(p + "attn_norm.weight", c.n_embd);
  if (c.fused_qkv && f.find_tensor(p + "attn_qkv.weight")) {
    const std::string qkv = p + "attn_qkv.weight";
    l.wq = ld.rows(qkv, c.n_embd, n_q + 2 * n_kv, 0, n_q);
    l.wk = ld.rows(qkv, c.n_embd, n_q + 2 * n_kv, n_q, n_kv);
    l.wv = ld.rows(qkv, c.n_embd, n_q + 2 * n_kv, n_q + n_kv, n_kv);
  } else {
    l.wq = ld.matrix(p + "attn_q.weight", c.n_embd, n_q);
    l.wk = ld.matrix(p + "attn_k.weight", c.n_embd, n_kv);
    l.wv = ld.matrix(p + "attn_v.weight", c.n_embd, n_kv);
  }
  l.wo = ld.matrix(p + "attn_output.weight", n_q, c.n_embd);
  if (c.qkv_bias) {
    l.bq = ld.vector(p + "attn_q.bias", n_q);
    l.bk = ld.vector(p + "attn_k.bias", n_kv);
    l.bv = ld.vector(p + "attn_v.bias", n_kv);
  }
  if (c.qk_norm) {
    l.q_norm = ld.vector(p + "attn_q_norm.weight", c.head_dim);
    l.k_norm = ld.vector(p + "attn_k_norm.weight", c.head_dim);
  }
  if (c.post_norms) {
    l.attn_post_norm = ld.vector(p + "post_attention_norm.weight", c.n_embd);
    l.ffn_post_norm = ld.vector(p + "post_ffw_norm.weight", c.n_embd);
  }
  l.ffn_norm = ld.vector(p + "ffn_norm.weight", c.n_embd);
  if (c.fused_qkv && !f.find_tensor(p + "ffn_gate.weight")) {  // gate rows, then up rows
    l.w_gate = ld.rows(p + "ffn_up.weight", c.n_embd, 2 * c.n_ff, 0, c.n_ff);
    l.w_up = ld.rows(p + "ffn_up.weight", c.n_embd, 2 * c.n_ff, c.n_ff, c.n_ff);
  } else {
    l.w_gate = ld.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff);
    l.w_up = ld.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff);
  }
  l.w_down = ld.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd);
}

// Per-pair frequency divisors from a tensor, on top of linear scaling.
void divide_frequencies(const TensorLoader& ld, const GgufFile& f, ModelConfig& c, const std::string& name) {
  const std::vector<float> factors = ld.vector(name, c.n_rot / 2);
  if (c.rope_divisors.empty()) c.rope_divisors.assign(factors.size(), 1.0f);
  for (size_t i = 0; i < factors.size(); ++i) {
    if (!(factors[i] > 0) || !std::isfinite(factors[i]))
      fail(ErrorKind::InvalidInput, "{}: {}[{}] = {} must be a positive number", f.source(), name, i,
           factors[i]);
    c.rope_divisors[i] *= factors[i];
  }
}

// The RoPE frequency tensors: Llama 3's scaling and Phi-3's LongRoPE.
void load_rope_factors(const TensorLoader& ld, const GgufFile& f, ModelConfig& c, const ModelLoadOptions& o) {
  // Llama 3's RoPE scaling: one frequency divisor per rotary pair.
  if (f.find_tensor("rope_freqs.weight")) {
    if (c.arch != Arch::Llama && c.arch != Arch::Mistral3)
      fail(ErrorKind::InvalidInput, "{}: rope_freqs.weight in a '{}' model is not implemented", f.source(),
           c.arch_name);
    divide_frequencies(ld, f, c, "rope_freqs.weight");
  }
  // Phi-3's LongRoPE: short factors up to the original context, long ones
  // for a caller that runs longer contexts (ModelLoadOptions).
  if (f.find_tensor("rope_factors_short.weight") || f.find_tensor("rope_factors_long.weight")) {
    if (c.arch != Arch::Phi3)
      fail(ErrorKind::InvalidInput, "{}: rope_factors_short/long in a '{}' model is not implemented",
           f.source(), c.arch_name);
    const std::string key = c.arch_name + ".rope.scaling.original_context_length";
    const int64_t original = f.find(key) ? f.get_int(key) : c.n_ctx_train;
    if (original <= 0)
      fail(ErrorKind::InvalidInput, "{}: {} = {} is out of range", f.source(), key, original);
    const bool long_context = o.n_ctx > original;
    ld.vector(long_context ? "rope_factors_short.weight" : "rope_factors_long.weight",
              c.n_rot / 2);  // checked
    divide_frequencies(ld, f, c, long_context ? "rope_factors_long.weight" : "rope_factors_short.weight");
    if (!long_context) c.n_ctx_train = std::min<int>(c.n_ctx_train, static_cast<int>(original));
  }
}

// The matmul weights get their panel copy; the embedding table keeps rows
// (a lookup reads one row) in the file mapping.
// Packing touches every weight once; one matrix per task over all cores.
void pack_matmul_weights(std::vector<LayerWeights>& layers, WeightMatrix& output, ThreadPool& pool) {
  std::vector<WeightMatrix*> to_pack;
  for (LayerWeights& l : layers)
    for (WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      if (packable(w->type)) to_pack.push_back(w);
  if (packable(output.type)) to_pack.push_back(&output);
  pool.parallel_for(static_cast<int64_t>(to_pack.size()), [&](int64_t i, int) {
    to_pack[i]->packed = std::make_shared<const PackedMatrix>(*to_pack[i]);
  });
}

}  // namespace

uint64_t model_fingerprint(const GgufFile& file, const ModelConfig& c, ThreadPool& pool) {
  constexpr size_t kChunk = size_t{8} << 20;
  const std::vector<GgufTensor>& tensors = file.tensors();
  struct Chunk {
    size_t tensor;
    const uint8_t* data;
    size_t n;
  };
  std::vector<Chunk> chunks;  // in file order; an empty tensor is one empty chunk
  for (size_t ti = 0; ti < tensors.size(); ++ti)
    for (size_t at = 0; at < tensors[ti].n_bytes || at == 0; at += kChunk)
      chunks.push_back({ti, tensors[ti].data + at, std::min(kChunk, tensors[ti].n_bytes - at)});
  std::vector<uint64_t> sums(chunks.size());
  pool.parallel_for(static_cast<int64_t>(chunks.size()),
                    [&](int64_t i, int) { sums[i] = hash_bytes(chunks[i].data, chunks[i].n); });
  const int32_t shape[] = {static_cast<int32_t>(c.arch),
                           c.n_layer,
                           c.n_embd,
                           c.n_head,
                           c.n_head_kv,
                           c.head_dim,
                           c.n_ff,
                           c.n_vocab,
                           c.n_rot,
                           static_cast<int32_t>(c.rope_style),
                           c.qkv_bias};  // (qk_norm goes with the architecture)
  uint64_t h = hash_bytes(shape, sizeof shape);
  h = hash_bytes(&c.rope_base, sizeof c.rope_base, h);
  h = hash_bytes(&c.rms_eps, sizeof c.rms_eps, h);
  if (!c.rope_divisors.empty())  // RoPE scaling (rope_freqs is hashed with the tensors too)
    h = hash_bytes(c.rope_divisors.data(), c.rope_divisors.size() * sizeof(float), h);
  // What differs between layers and the Gemma/Phi extras, when present (so
  // the fingerprints of the earlier architectures stay as they were).
  if (c.sliding_window > 0 || !c.layer_no_rope.empty() || c.embd_scale != 1 || c.q_scale != 1 ||
      c.final_softcap != 0 || c.post_norms || c.ffn_act != Activation::Silu) {
    const float extras[] = {static_cast<float>(c.sliding_window),
                            c.rope_base_local,
                            c.embd_scale,
                            c.q_scale,
                            c.final_softcap,
                            static_cast<float>(c.post_norms),
                            static_cast<float>(c.ffn_act)};
    h = hash_bytes(extras, sizeof extras, h);
    h = hash_bytes(c.layer_windowed.data(), c.layer_windowed.size(), h);
    h = hash_bytes(c.layer_no_rope.data(), c.layer_no_rope.size(), h);
  }
  if (c.attn_softcap != 0) h = hash_bytes(&c.attn_softcap, sizeof c.attn_softcap, h);
  if (c.attn_temp_scale != 0) {
    h = hash_bytes(&c.attn_temp_scale, sizeof c.attn_temp_scale, h);
    h = hash_bytes(&c.attn_temp_length, sizeof c.attn_temp_length, h);
  }
  size_t next = 0;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const GgufTensor& t = tensors[ti];
    h = hash_string(t.name, h);
    const auto type = static_cast<int32_t>(t.type);
    h = hash_bytes(&type, sizeof type, h);
    h = hash_bytes(t.dims.data(), t.dims.size() * sizeof(int64_t), h);
    for (; next < chunks.size() && chunks[next].tensor == ti; ++next)
      h = hash_bytes(&sums[next], sizeof(uint64_t), h);
  }
  return h;
}

std::shared_ptr<const Model> Model::load(const std::filesystem::path& path, const ModelLoadOptions& o) {
  return from_file(GgufFile::open(path), o);
}

std::shared_ptr<const Model> Model::from_file(GgufFile file, const ModelLoadOptions& o) {
  auto m = std::make_shared<Model>();
  m->file_ = std::move(file);
  m->config_ = ModelConfig::from_gguf(m->file_);
  ModelConfig& c = m->config_;
  const TensorLoader ld(m->file_);

  const GgufTensor& embd = ld.require("token_embd.weight");
  if (embd.dims.size() != 2)
    fail(ErrorKind::InvalidInput, "{}: token_embd.weight must be 2-D", m->file_.source());
  c.n_vocab = static_cast<int>(embd.dims[1]);
  m->tok_embd = ld.view(embd, c.n_embd, c.n_vocab);

  // A layer's weights are 6 tensors or more (Phi-3's fused ones): a block
  // count the file cannot hold is refused before anything is allocated for it.
  if (static_cast<size_t>(c.n_layer) > m->file_.tensors().size() / 6)
    fail(ErrorKind::InvalidInput, "{}: block_count {} needs more tensors than the file's {}",
         m->file_.source(), c.n_layer, m->file_.tensors().size());
  m->layers.resize(c.n_layer);
  for (int il = 0; il < c.n_layer; ++il) load_layer(ld, m->file_, c, il, m->layers[il]);
  m->output_norm = ld.vector("output_norm.weight", c.n_embd);
  load_rope_factors(ld, m->file_, c, o);
  // Tied embeddings: models without output.weight reuse the token embedding.
  m->output =
      m->file_.find_tensor("output.weight") ? ld.matrix("output.weight", c.n_embd, c.n_vocab) : m->tok_embd;
  ld.check_all_used();
  ThreadPool pool(0);
  pack_matmul_weights(m->layers, m->output, pool);
  m->fingerprint_ = model_fingerprint(m->file_, c, pool);
  return m;
}

}  // namespace depcache

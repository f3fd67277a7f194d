#pragma once
// The trainable parameters of a Llama model in fp32, tensor after tensor in
// the order and shapes of its GGUF file (model_tensors), so that a trained
// model is written as the engine reads it. Gradients and optimizer moments
// use the same layout.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/model_writer.h"

namespace depcache {

class ParamSet {
 public:
  ParamSet() = default;
  // All zeros. shape.n_vocab must be set. Llama only (no QKV biases).
  explicit ParamSet(const ModelShape& shape);

  const ModelShape& shape() const { return shape_; }
  const std::vector<ModelTensor>& tensors() const { return tensors_; }
  size_t size() const { return values_.size(); }
  std::span<float> values() { return values_; }
  std::span<const float> values() const { return values_; }
  float* data(size_t tensor) { return values_.data() + offsets_[tensor]; }
  const float* data(size_t tensor) const { return values_.data() + offsets_[tensor]; }
  size_t offset(size_t tensor) const { return offsets_[tensor]; }
  // The tensor's index; throws Error(Internal) for an unknown name.
  size_t index_of(const std::string& name) const;

  // Tensors of layer `il` and the others, by index.
  struct LayerIndex {
    size_t attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
  };
  const LayerIndex& layer(int il) const { return layers_[il]; }
  size_t tok_embd() const { return 0; }
  size_t output_norm() const { return output_norm_; }
  size_t output() const { return output_; }  // tok_embd() when tied

  // Matrices normal(0, stddev), the residual projections (attention output,
  // FFN down) scaled by 1/sqrt(2 n_layer) so the residual stream does not grow
  // with depth; norm gains 1. Deterministic given the seed.
  void init_random(uint64_t seed, float stddev = 0.02f);

  // The weights of a loaded model of a Llama shape (to fine-tune it).
  static ParamSet from_model(const Model& model);
  // The model's shape as the trainer sees it.
  static ModelShape shape_of(const ModelConfig& config, bool tied);

  // Writes a GGUF model of these values (2-D weights as `type`) with the
  // given tokenizer and further metadata.
  RandomModelReport write_gguf(const std::filesystem::path& path, const std::string& name, DType type,
                               std::vector<std::pair<std::string, GgufValue>> metadata) const;

 private:
  ModelShape shape_;
  std::vector<ModelTensor> tensors_;
  std::vector<size_t> offsets_;
  std::vector<float> values_;
  std::vector<LayerIndex> layers_;
  size_t output_norm_ = 0, output_ = 0;
};

}  // namespace depcache

#pragma once
// A loaded model: its configuration and views of its weights inside the
// memory-mapped GGUF file. Weights stay in their file type; small vectors
// (norms, biases) are converted to float once at load.
#include <filesystem>
#include <memory>
#include <vector>

#include "compute/dtype.h"
#include "compute/matmul.h"
#include "model/gguf.h"
#include "model/model_config.h"

namespace depcache {

struct LayerWeights {
  std::vector<float> attn_norm;       // (n_embd)
  WeightMatrix wq;                    // (n_head*head_dim, n_embd)
  WeightMatrix wk;                    // (n_head_kv*head_dim, n_embd)
  WeightMatrix wv;                    // (n_head_kv*head_dim, n_embd)
  WeightMatrix wo;                    // (n_embd, n_head*head_dim)
  std::vector<float> bq, bk, bv;      // qwen2 only: (n_head*head_dim), (n_head_kv*head_dim) x2
  std::vector<float> q_norm, k_norm;  // qwen3, gemma3: (head_dim) each, applied per head
  std::vector<float> attn_post_norm;  // gemma3: (n_embd), on the attention output
  std::vector<float> ffn_post_norm;   // gemma3: (n_embd), on the FFN output
  std::vector<float> ffn_norm;        // (n_embd)
  WeightMatrix w_gate;                // (n_ff, n_embd)
  WeightMatrix w_up;                  // (n_ff, n_embd)
  WeightMatrix w_down;                // (n_embd, n_ff)
};

// What the caller will run a model with, where a file's computation depends
// on it.
struct ModelLoadOptions {
  // The longest context it will use (0: the default). Phi-3's LongRoPE
  // rotates with its long factors when this passes the original context and
  // with its short ones otherwise (then the context stops at the original),
  // as the leading C++ engine chooses by its context size. The choice is in
  // the fingerprint.
  int64_t n_ctx = 0;
};

class Model {
 public:
  static std::shared_ptr<const Model> load(const std::filesystem::path& path, const ModelLoadOptions& o = {});
  static std::shared_ptr<const Model> from_file(GgufFile file, const ModelLoadOptions& o = {});

  const ModelConfig& config() const { return config_; }
  const GgufFile& file() const { return file_; }
  // Identifies what the model computes, for cache keys: its configuration
  // and every byte of every tensor (with its name, type and shape), hashed
  // once at load. Two files that differ in one weight differ here.
  uint64_t fingerprint() const { return fingerprint_; }

  WeightMatrix tok_embd;             // (n_vocab, n_embd)
  std::vector<LayerWeights> layers;  // n_layer
  std::vector<float> output_norm;    // (n_embd)
  WeightMatrix output;               // (n_vocab, n_embd); tok_embd when tied

 private:
  GgufFile file_;
  ModelConfig config_;
  uint64_t fingerprint_ = 0;
};

class ThreadPool;

// The fingerprint of Model::fingerprint(): the configuration and every
// tensor's name, type, shape and bytes. The bytes are hashed in chunks over
// the pool, then the chunk hashes are combined in file order.
uint64_t model_fingerprint(const GgufFile& file, const ModelConfig& config, ThreadPool& pool);

}  // namespace depcache

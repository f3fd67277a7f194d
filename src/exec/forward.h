#pragma once
// The transformer forward pass of the Llama family (llama, qwen2): embed →
// per layer (norm, qkv, rope, attention, residual, norm, SwiGLU FFN,
// residual) → norm → logits. One pass, driven by a plan, serves full and
// sparse prefill over a KV assembly and decoding.
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "compute/attention.h"
#include "compute/ops.h"
#include "exec/kv_assembly.h"
#include "model/model.h"

namespace depcache {

class ThreadPool;

enum class Logits { Last, All };

// What a per-layer hook sees: the tokens active in this layer (batch
// indices, ascending), their freshly computed K/V (after RoPE, before they
// are written), and the assembly, whose rows still hold the cached K/V of
// those tokens when the plan placed any. The hook runs before the layer's
// attention, so it may also place rows of this layer the pass reads but
// does not compute (a span still arriving from disk).
// Attention mass [layer][statistics query][target], averaged over heads.
using AttentionMass = std::vector<std::vector<std::vector<double>>>;

struct LayerKv {
  int layer = 0;
  std::span<const int64_t> active;
  const float* k_fresh = nullptr;  // (active.size(), n_embd_kv)
  const float* v_fresh = nullptr;
  KvAssembly* kv = nullptr;
  std::span<const int64_t> rows;  // KV row of every batch token
  // The plan's attention statistics of the layers before this one (null
  // without statistics), for hooks that decide from where attention goes.
  const AttentionMass* mass = nullptr;
};

// Returns the tokens to keep computing after this layer (a subset of
// `active`, ascending). Tokens dropped here still write their fresh K/V for
// this layer; from the next layer on their rows keep what the plan placed.
using LayerHook = std::function<std::vector<int64_t>(const LayerKv&)>;

// One pass of the primitive. Token i of the batch sits at KV row rows[i] and
// RoPE position positions[i], and attends as `visibility` says (its query
// index is i). Every row a query sees must be written before the pass or by
// an earlier or the same batch token.
struct PrefillPlan {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int64_t> rows;
  Visibility visibility;
  std::vector<int64_t> logits_for;  // batch indices whose logits are returned
  // Optional: last layer each token is computed in (default: all layers).
  // A token that stops early must have its rows placed from the cache.
  std::vector<int> last_layer;
  LayerHook hook;  // optional, called at every layer
  // Optional attention statistics: mass from these queries (batch indices)
  // onto each target range (disjoint), per layer from
  // stats_from_layer on (earlier layers report nothing).
  std::vector<int64_t> stats_queries;
  std::vector<RowRange> stats_targets;
  int stats_from_layer = 0;
};

struct PrefillResult {
  std::vector<float> logits;              // (logits_for.size(), n_vocab)
  int64_t attention_pairs = 0;            // (query, key) pairs computed, summed over layers
  std::vector<int64_t> active_per_layer;  // tokens computed in each layer
  AttentionMass attention_mass;           // empty without statistics
};

class Forward {
 public:
  Forward(std::shared_ptr<const Model> model, ThreadPool& pool);

  const Model& model() const { return *model_; }

  // Runs the plan, writing K/V into `kv` (which must already hold every row
  // the plan reads but does not compute). Does not change kv.n_past().
  PrefillResult prefill(const PrefillPlan& plan, KvAssembly& kv);

  // Appends `tokens` after the assembly's rows at the next positions, each
  // seeing every earlier row (a causal continuation), and writes logits
  // ((1 or n_tokens) x n_vocab) to `logits`.
  void eval(std::span<const int32_t> tokens, KvAssembly& kv, Logits which, std::vector<float>& logits);

 private:
  void layer(int il, const PrefillPlan& plan, KvAssembly& kv, PrefillResult& result);
  // The phases of a layer, over the n active tokens (m after the layer drops
  // those that stop).
  void size_buffers(const PrefillPlan& plan, int64_t n);
  void project_qkv(int il, const LayerWeights& w, int64_t n);  // Q, K, V with biases, norms, RoPE, scale
  // Which tokens go on: the hook's choice, then the plan's last layers; in
  // the last layer only the tokens whose logits are wanted.
  std::vector<int64_t> tokens_going_on(int il, const PrefillPlan& plan, KvAssembly& kv,
                                       PrefillResult& result);
  void write_kv(int il, KvAssembly& kv, int64_t n);  // fresh K/V, in runs of consecutive rows
  void score_attention_mass(int il, const PrefillPlan& plan, const Visibility& vis, KvAssembly& kv,
                            PrefillResult& result);
  void attention_block(int il, const LayerWeights& w, const Visibility& vis, KvAssembly& kv, int64_t m);
  void feed_forward_block(const LayerWeights& w, int64_t m);  // SwiGLU or GeGLU
  // fn(r0, r1) over rows [0, n_rows) of `width` floats, on the pool when
  // the rows are many (forward.cpp).
  template <class F>
  void for_rows(int64_t n_rows, int64_t width, F&& fn);
  // x += proj (post-normed first where the model has post-norms), row-wise.
  void add_residual(const std::vector<float>& post_norm, int64_t m);

  std::shared_ptr<const Model> model_;
  ThreadPool& pool_;
  // Run state for the active tokens (compact rows), grown to the largest batch seen.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_, proj_, matmul_scratch_;
  MassKeys stats_keys_;               // a layer's keys, for the queries whose attention mass is scored
  std::vector<int64_t> active_;       // batch indices computed in the current layer
  std::vector<int64_t> active_rows_;  // their KV rows
  std::vector<int32_t> active_pos_;   // their positions
  RopeTable rope_;                    // angles of the active tokens' positions
  // The plan's visibility under the model's sliding window (nullopt: the
  // window cuts nothing); windowed layers attend with it.
  std::optional<Visibility> windowed_;
};

}  // namespace depcache

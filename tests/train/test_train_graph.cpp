// The trainer's passes: gradients of every kind of parameter against float64
// finite differences of an independent forward pass (causal and dependency
// attention with several trees, both position schemes); a saved model loaded
// by the engine gives the trainer's logits; a short run learns; runs are
// deterministic.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "exec/forward.h"
#include "exec/kv_assembly.h"
#include "exec/visibility.h"
#include "model/vocab.h"
#include "prompt/dep_prompt.h"
#include "reference_forward.h"
#include "strategy/dependency_visibility.h"
#include "test_support.h"
#include "train/optimizer.h"
#include "train/train_graph.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

ModelShape tiny_shape(int n_vocab) {
  ModelShape s;
  s.n_layer = 2;
  s.n_embd = 16;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 24;
  s.n_ctx = 128;
  s.n_vocab = n_vocab;
  s.tied_embeddings = true;
  return s;
}

// A DepPrompt: a system segment, three trees of relation-path-like token
// paths (shared prefixes merge), a task segment; every token predicts the
// next token of the pre-order where that lies in the same path or segment.
TrainSequence dependency_sequence(PositionScheme scheme, int n_vocab) {
  std::mt19937 rng(7);
  const auto tok = [&] { return static_cast<int32_t>(rng() % n_vocab); };
  DepPrompt p;
  const std::vector<int32_t> system = {tok(), tok(), tok()};
  p.add_linear("system", system);
  for (int tree = 0; tree < 3; ++tree) {
    const int32_t root = tok();
    std::vector<std::vector<int32_t>> paths;
    for (int k = 0; k < 3; ++k)
      paths.push_back({root, tok(), tok(), k == 2 ? tok() : static_cast<int32_t>(k)});
    p.add_tree("entity", paths);
  }
  const std::vector<int32_t> task = {tok(), tok(), tok(), tok()};
  p.add_linear("task", task);
  TrainSequence s;
  s.tokens = p.tokens();
  s.positions = p.positions(scheme);
  const auto n = static_cast<int64_t>(s.tokens.size());
  std::vector<int64_t> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = i;
  s.visibility = dependency_dag(p, rows);
  s.targets.assign(n, -1);
  for (int64_t i = 0; i + 1 < n; ++i)
    if (p.parents()[i + 1] == i) s.targets[i] = s.tokens[i + 1];
  return s;
}

test::ReferenceWeights::Matrix as_matrix(const ParamSet& p, size_t index) {
  const ModelTensor& t = p.tensors()[index];
  const float* d = p.data(index);
  return {t.n_out, t.n_in, std::vector<double>(d, d + t.size())};
}

std::vector<double> as_vector(const ParamSet& p, size_t index) {
  const float* d = p.data(index);
  return {d, d + p.tensors()[index].size()};
}

test::ReferenceWeights reference_weights(const ParamSet& p) {
  test::ReferenceWeights r;
  const ModelShape& s = p.shape();
  r.config.arch = Arch::Llama;
  r.config.n_layer = s.n_layer;
  r.config.n_embd = s.n_embd;
  r.config.n_head = s.n_head;
  r.config.n_head_kv = s.n_head_kv;
  r.config.head_dim = s.n_embd / s.n_head;
  r.config.n_rot = r.config.head_dim;
  r.config.n_ff = s.n_ff;
  r.config.n_vocab = s.n_vocab;
  r.config.rms_eps = s.rms_eps;
  r.config.rope_base = s.rope_base;
  r.tok_embd = as_matrix(p, p.tok_embd());
  for (int il = 0; il < s.n_layer; ++il) {
    const ParamSet::LayerIndex& x = p.layer(il);
    r.layers.push_back({as_vector(p, x.attn_norm),
                        as_vector(p, x.ffn_norm),
                        {},
                        {},
                        {},
                        {},
                        {},
                        {},
                        {},
                        as_matrix(p, x.wq),
                        as_matrix(p, x.wk),
                        as_matrix(p, x.wv),
                        as_matrix(p, x.wo),
                        as_matrix(p, x.w_gate),
                        as_matrix(p, x.w_up),
                        as_matrix(p, x.w_down)});
  }
  r.output_norm = as_vector(p, p.output_norm());
  r.output = as_matrix(p, p.output());
  return r;
}

// The mean cross-entropy of the batch in float64, by the reference forward.
double reference_loss(const test::ReferenceWeights& w, const std::vector<TrainSequence>& batch) {
  double sum = 0;
  int64_t n_targets = 0;
  const int V = w.config.n_vocab;
  for (const TrainSequence& s : batch) {
    const auto n = static_cast<int64_t>(s.tokens.size());
    std::vector<std::vector<bool>> sees(n, std::vector<bool>(n, false));
    for (int64_t q = 0; q < n; ++q)
      for (const RowRange& r : s.visibility.visible(q))
        for (int64_t k = r.begin; k < r.end; ++k) sees[q][k] = true;
    const auto pass =
        test::reference_forward(w, s.tokens, s.positions, [&](int64_t q, int64_t k) { return sees[q][k]; });
    for (int64_t i = 0; i < n; ++i) {
      if (s.targets[i] < 0) continue;
      const double* l = pass.logits.data() + i * V;
      const double m = *std::max_element(l, l + V);
      double z = 0;
      for (int v = 0; v < V; ++v) z += std::exp(l[v] - m);
      sum += m + std::log(z) - l[s.targets[i]];
      ++n_targets;
    }
  }
  return sum / static_cast<double>(n_targets);
}

// Sets one parameter of the float64 weights (both places when tied).
void set_weight(test::ReferenceWeights& w, const ParamSet& p, size_t tensor, int64_t i, double value) {
  const auto layer_of = [&](int il) -> test::ReferenceWeights::Layer& { return w.layers[il]; };
  if (tensor == p.tok_embd()) {
    w.tok_embd.w[i] = value;
    if (p.output() == p.tok_embd()) w.output.w[i] = value;
    return;
  }
  if (tensor == p.output_norm()) {
    w.output_norm[i] = value;
    return;
  }
  if (tensor == p.output()) {
    w.output.w[i] = value;
    return;
  }
  for (int il = 0; il < p.shape().n_layer; ++il) {
    const ParamSet::LayerIndex& x = p.layer(il);
    auto& l = layer_of(il);
    if (tensor == x.attn_norm)
      l.attn_norm[i] = value;
    else if (tensor == x.ffn_norm)
      l.ffn_norm[i] = value;
    else if (tensor == x.wq)
      l.wq.w[i] = value;
    else if (tensor == x.wk)
      l.wk.w[i] = value;
    else if (tensor == x.wv)
      l.wv.w[i] = value;
    else if (tensor == x.wo)
      l.wo.w[i] = value;
    else if (tensor == x.w_gate)
      l.w_gate.w[i] = value;
    else if (tensor == x.w_up)
      l.w_up.w[i] = value;
    else if (tensor == x.w_down)
      l.w_down.w[i] = value;
    else
      continue;
    return;
  }
  FAIL() << "tensor " << tensor << " not placed";
}

class TrainGradient : public ::testing::TestWithParam<PositionScheme> {};

TEST_P(TrainGradient, EveryParameterKindMatchesFloat64FiniteDifferences) {
  constexpr int kVocab = 23;
  ParamSet params(tiny_shape(kVocab));
  params.init_random(3, 0.4f);
  // Norm gains away from 1, so their gradients are not special.
  for (int il = 0; il < 2; ++il)
    for (size_t t : {params.layer(il).attn_norm, params.layer(il).ffn_norm})
      for (int64_t i = 0; i < params.tensors()[t].size(); ++i)
        params.data(t)[i] = 0.8f + 0.03f * static_cast<float>(i % 7);
  std::vector<TrainSequence> batch;
  batch.push_back(causal_sequence({1, 5, 9, 2, 2, 7, 13, 4}));
  batch.push_back(dependency_sequence(GetParam(), kVocab));
  ASSERT_GT(batch[1].visibility.groups().size(), 3u) << "several trees";

  ThreadPool pool(2);
  TrainGraph graph(pool);
  ParamSet grads(params.shape());
  const LossSum loss = graph.run(params, batch, &grads);
  test::ReferenceWeights w = reference_weights(params);
  const double ref_loss = reference_loss(w, batch);
  EXPECT_NEAR(loss.mean(), ref_loss, 1e-5 * std::abs(ref_loss)) << "the trainer's forward";

  std::mt19937 rng(11);
  int checked = 0;
  double worst = 0;
  for (size_t t = 0; t < params.tensors().size(); ++t) {
    const ModelTensor& info = params.tensors()[t];
    std::vector<int64_t> picks;
    for (int k = 0; k < 6; ++k) picks.push_back(static_cast<int64_t>(rng() % info.size()));
    if (t == params.tok_embd()) picks.push_back(int64_t{1} * params.shape().n_embd + 3);  // token 1 is used
    for (int64_t i : picks) {
      const double base = params.data(t)[i], h = 1e-5;
      set_weight(w, params, t, i, base + h);
      const double up = reference_loss(w, batch);
      set_weight(w, params, t, i, base - h);
      const double down = reference_loss(w, batch);
      set_weight(w, params, t, i, base);
      const double fd = (up - down) / (2 * h);
      const double got = grads.data(t)[i];
      const double err = std::abs(got - fd) / (std::abs(fd) + 1e-3);
      worst = std::max(worst, err);
      EXPECT_LT(err, 2e-3) << info.name << "[" << i << "]: analytic " << got << ", finite differences " << fd;
      ++checked;
    }
  }
  std::printf("[check] %d parameters, worst relative error %.2e\n", checked, worst);
}

INSTANTIATE_TEST_SUITE_P(Schemes, TrainGradient,
                         ::testing::Values(PositionScheme::Sequential, PositionScheme::Depth),
                         [](const auto& info) { return std::string(position_scheme_name(info.param)); });

// What the trainer computes is what the engine serves: the model written as
// GGUF and loaded gives the same logits under the same attention.
TEST(Train, ASavedModelGivesTheEngineTheTrainersLogits) {
  const Vocab vocab = Vocab::builtin_bytes();
  ParamSet params(tiny_shape(vocab.n_tokens()));
  params.init_random(5, 0.1f);
  const TrainSequence seq = dependency_sequence(PositionScheme::Depth, 200);
  ThreadPool pool(2);
  TrainGraph graph(pool);
  graph.run(params, std::vector<TrainSequence>{seq}, nullptr);
  const std::vector<float> trained = graph.logits();

  std::vector<std::pair<std::string, GgufValue>> md;
  vocab.append_gguf_metadata(md);
  const auto path = test::temp_path("trained.gguf");
  params.write_gguf(path, "trained", DType::F32, md);
  const auto model = Model::load(path);
  Forward fwd(model, pool);
  const auto n = static_cast<int64_t>(seq.tokens.size());
  KvAssembly kv(model->config(), n, DType::F32);
  PrefillPlan plan;
  plan.tokens = seq.tokens;
  plan.positions = seq.positions;
  for (int64_t i = 0; i < n; ++i) plan.rows.push_back(i), plan.logits_for.push_back(i);
  plan.visibility = seq.visibility;
  const PrefillResult served = fwd.prefill(plan, kv);
  ASSERT_EQ(served.logits.size(), trained.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < trained.size(); ++i) {
    ASSERT_TRUE(std::isfinite(served.logits[i]) && std::isfinite(trained[i]));
    worst = std::max(worst, double(std::abs(served.logits[i] - trained[i])));
    scale = std::max(scale, double(std::abs(trained[i])));
  }
  EXPECT_LT(worst, 1e-4 * scale) << "largest logit difference " << worst << " of " << scale;
  std::filesystem::remove(path);
}

// A few hundred steps memorise a handful of sequences; two runs from the
// same seed end bit for bit the same.
TEST(Train, AShortRunLearnsAndIsDeterministic) {
  const auto train = [](int steps) {
    ModelShape shape = tiny_shape(40);
    shape.n_embd = 32;
    ParamSet params(shape);
    params.init_random(9);
    std::vector<TrainSequence> batch;
    std::mt19937 rng(1);
    for (int s = 0; s < 4; ++s) {
      std::vector<int32_t> t(16);
      for (int32_t& x : t) x = static_cast<int32_t>(rng() % 40);
      batch.push_back(causal_sequence(t));
    }
    AdamWOptions o;
    o.lr = 1e-2;
    o.warmup_steps = 10;
    o.total_steps = steps;
    o.weight_decay = 0;
    AdamW opt(params, o);
    ThreadPool pool(2);
    TrainGraph graph(pool);
    double first = 0, last = 0;
    for (int step = 0; step < steps; ++step) {
      ParamSet grads(shape);
      const LossSum l = graph.run(params, batch, &grads);
      if (step == 0) first = l.mean();
      last = l.mean();
      opt.update(params, grads);
    }
    return std::make_tuple(first, last, std::vector<float>(params.values().begin(), params.values().end()));
  };
  const auto [first, last, values] = train(150);
  std::printf("[check] loss %.3f -> %.4f\n", first, last);
  EXPECT_GT(first, 3.0) << "about ln(40) at the start";
  EXPECT_LT(last, 0.1) << "memorised";
  const auto [first2, last2, values2] = train(150);
  EXPECT_EQ(values, values2) << "not deterministic";
}

TEST(Train, LearningRateWarmsUpThenDecays) {
  AdamWOptions o;
  o.lr = 1.0;
  o.min_lr_ratio = 0.1;
  o.warmup_steps = 10;
  o.total_steps = 110;
  EXPECT_DOUBLE_EQ(learning_rate(o, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(o, 9), 1.0);
  EXPECT_NEAR(learning_rate(o, 60), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate(o, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(o, 500), 0.1, 1e-12);
}

TEST(Train, BadSequencesAreRefused) {
  ParamSet params(tiny_shape(10));
  ThreadPool pool(1);
  TrainGraph graph(pool);
  TrainSequence bad = causal_sequence({1, 2, 3});
  bad.tokens[1] = 10;
  EXPECT_THROW(graph.run(params, std::vector<TrainSequence>{bad}, nullptr), Error);
  TrainSequence short_targets = causal_sequence({1, 2, 3});
  short_targets.targets.pop_back();
  EXPECT_THROW(graph.run(params, std::vector<TrainSequence>{short_targets}, nullptr), Error);
  EXPECT_THROW(ParamSet(ModelShape{}), Error) << "no vocabulary";
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// Reading a model file is strict: what the engine does not implement is
// refused by name, never ignored. Llama 3's RoPE scaling (rope_freqs.weight)
// and linear scaling are implemented: they change what the model computes,
// and the engine matches the float64 reference with them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "exec/forward.h"
#include "exec/kv_assembly.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/model_writer.h"
#include "reference_forward.h"
#include "test_support.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

std::filesystem::path write_tiny(const std::string& name, const ModelShape& shape) {
  RandomModelOptions o;
  o.shape = shape;
  o.seed = 11;
  o.stddev = 0.2f;
  o.n_threads = 2;
  const auto path = test::temp_path(name) += ".gguf";
  write_random_model(path, o);
  return path;
}

// `from` rewritten with extra metadata and, when `tensor` is set, an extra
// F32 tensor of n values `value`.
std::filesystem::path rewrite(const std::filesystem::path& from, const std::string& name,
                              const std::vector<std::pair<std::string, GgufValue>>& metadata,
                              const std::string& tensor = "", int64_t n = 4, float value = 0) {
  const GgufFile f = GgufFile::open(from);
  GgufWriter w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  for (const auto& [k, v] : metadata) w.set(k, v);
  for (const GgufTensor& t : f.tensors())
    w.add_tensor(t.name, t.type, t.dims,
                 [&t](uint8_t* dst, size_t n_bytes) { std::memcpy(dst, t.data, n_bytes); });
  if (!tensor.empty())
    w.add_tensor(tensor, DType::F32, {n}, [value](uint8_t* dst, size_t n_bytes) {
      for (size_t i = 0; i < n_bytes / sizeof(float); ++i)
        std::memcpy(dst + i * sizeof(float), &value, sizeof value);
    });
  const auto path = test::temp_path(name) += ".gguf";
  w.write(path);
  return path;
}

std::string load_error(const std::filesystem::path& path) {
  try {
    Model::load(path);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

std::vector<float> logits_of(const std::shared_ptr<const Model>& m, const std::vector<int32_t>& tokens) {
  ThreadPool pool(2);
  Forward fwd(m, pool);
  KvAssembly kv(m->config(), static_cast<int64_t>(tokens.size()), DType::F32);
  std::vector<float> logits;
  fwd.eval(tokens, kv, Logits::All, logits);
  return logits;
}

std::vector<int32_t> some_tokens(int n, int n_vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + 5) % n_vocab);
  return t;
}

// Our own model plus a rope_freqs.weight dividing half the frequencies by 8:
// it computes something else than the file without it, and both match the
// reference.
TEST(ModelStrict, RopeFreqsChangeTheComputationAndMatchTheReference) {
  ModelShape plain = *model_preset("tiny");
  ModelShape scaled = plain;
  scaled.rope_freq_factors.assign(8, 1.0f);
  std::fill(scaled.rope_freq_factors.begin() + 4, scaled.rope_freq_factors.end(), 8.0f);
  const auto a = Model::load(write_tiny("plain", plain));
  const auto b = Model::load(write_tiny("scaled", scaled));
  // The reference rotates by the divisors the loader parsed: they must be
  // the file's own numbers for the match below to mean anything.
  EXPECT_TRUE(a->config().rope_divisors.empty());
  EXPECT_EQ(b->config().rope_divisors, (std::vector<float>{1, 1, 1, 1, 8, 8, 8, 8}));
  EXPECT_NE(a->fingerprint(), b->fingerprint());
  const auto toks = some_tokens(24, a->config().n_vocab);
  const std::vector<float> la = logits_of(a, toks), lb = logits_of(b, toks);
  EXPECT_GT(test::max_abs_diff(la, lb, "with vs without rope_freqs"), 1e-2);
  EXPECT_LT(test::max_rel_diff(la, test::reference_logits(*a, toks), "plain"), 1e-4);
  EXPECT_LT(test::max_rel_diff(lb, test::reference_logits(*b, toks), "rope_freqs"), 1e-4);
}

TEST(ModelStrict, LinearRopeScalingMatchesTheReference) {
  ModelShape plain = *model_preset("tiny");
  ModelShape linear = plain;
  linear.rope_linear_factor = 4.0f;
  const auto a = Model::load(write_tiny("plain", plain));
  const auto b = Model::load(write_tiny("linear", linear));
  EXPECT_EQ(b->config().rope_scaling, "linear");
  EXPECT_EQ(b->config().rope_divisors, std::vector<float>(8, 4.0f));
  const auto toks = some_tokens(24, a->config().n_vocab);
  const std::vector<float> lb = logits_of(b, toks);
  EXPECT_GT(test::max_abs_diff(logits_of(a, toks), lb, "linear vs none"), 1e-2);
  EXPECT_LT(test::max_rel_diff(lb, test::reference_logits(*b, toks), "linear"), 1e-4);
}

// Llama 3's frequencies as Meta's reference and Transformers compute them
// (in float64 here): pairs of wavelength under original / high_freq_factor
// keep theirs, those over original / low_freq_factor are divided by the
// factor, and between the two the frequency blends from one to the other.
// The divisor of pair i is its trained frequency over the scaled one.
std::vector<double> published_llama3_divisors(int n_rot, double base, double factor, double low_freq_factor,
                                              double high_freq_factor, double original_context) {
  const double pi = 3.14159265358979323846;
  std::vector<double> divisors;
  for (int i = 0; i < n_rot / 2; ++i) {
    const double freq = 1 / std::pow(base, 2.0 * i / n_rot), wavelen = 2 * pi / freq;
    double scaled = freq;
    if (wavelen > original_context / low_freq_factor) {
      scaled = freq / factor;
    } else if (wavelen >= original_context / high_freq_factor) {
      const double smooth =
          (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      scaled = (1 - smooth) * freq / factor + smooth * freq;
    }
    divisors.push_back(freq / scaled);
  }
  return divisors;
}

// Llama-3.1/3.2's parameters: each divisor is the published formula's, from
// 1 for the fast pairs to the factor for the slow ones with some between;
// a model written with them reads those divisors back from rope_freqs.
TEST(ModelStrict, Llama3RopeFactorsFollowThePublishedFormula) {
  const std::vector<float> f = llama3_rope_factors(64, 500000.0f, 32.0f, 1.0f, 4.0f, 8192);
  const std::vector<double> want = published_llama3_divisors(64, 500000, 32, 1, 4, 8192);
  ASSERT_EQ(f.size(), want.size());
  int between = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_NEAR(f[i], want[i], 1e-5 * want[i]) << "pair " << i;
    between += want[i] > 1 && want[i] < 32;
  }
  EXPECT_EQ(want.front(), 1.0);
  EXPECT_EQ(want.back(), 32.0);
  EXPECT_GT(between, 0) << "the parameters leave no pair on the blend";
  const auto preset = model_preset("llama3.2-1b");
  ASSERT_TRUE(preset->llama3_rope.has_value());
  EXPECT_EQ(preset->llama3_rope->factor, 32.0f);
  EXPECT_EQ(preset->llama3_rope->original_context, 8192);
  // On the tiny shape (8 pairs, base 10000, wavelengths 6.3 to 19869) an
  // original context of 7000 leaves two pairs on the blend (wavelengths
  // 1750 to 7000); the loader's divisors are the formula's.
  ModelShape s = *model_preset("tiny");
  s.llama3_rope = ModelShape::Llama3Rope{8.0f, 1.0f, 4.0f, 7000};
  const auto path = write_tiny("llama3-rope", s);
  const auto m = Model::load(path);
  const std::vector<double> tiny = published_llama3_divisors(16, 10000, 8, 1, 4, 7000);
  ASSERT_EQ(m->config().rope_divisors.size(), tiny.size());
  int kept = 0, divided = 0;
  for (size_t i = 0; i < tiny.size(); ++i) {
    EXPECT_NEAR(m->config().rope_divisors[i], tiny[i], 1e-5 * tiny[i]) << "pair " << i;
    kept += tiny[i] == 1, divided += tiny[i] == 8;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_EQ(kept + divided + 2, static_cast<int>(tiny.size())) << "two pairs on the blend";
  std::filesystem::remove(path);
}

// Phi-3's LongRoPE: the short factors divide the frequencies up to the
// original context (where the context then stops), the long ones when the
// model is loaded for a longer context; the attention factor scales Q and K.
TEST(ModelStrict, Phi3LongRopeFactorsByContextAndAttentionFactor) {
  const auto base = write_tiny("phi3", *model_preset("tiny-phi3"));
  const auto shorter = rewrite(base, "phi3-short",
                               {{"phi3.rope.scaling.attn_factor", GgufValue::f32(1.1f)},
                                {"phi3.rope.scaling.original_context_length", GgufValue::u32(256)}},
                               "rope_factors_short.weight", 8, 2.0f);
  const auto both = rewrite(shorter, "phi3-both", {}, "rope_factors_long.weight", 8, 4.0f);
  EXPECT_THAT(load_error(shorter), ::testing::HasSubstr("tensor 'rope_factors_long.weight' is missing"));
  const auto plain = Model::load(base);
  const auto m = Model::load(both);
  EXPECT_EQ(m->config().rope_divisors, std::vector<float>(8, 2.0f));
  EXPECT_FLOAT_EQ(m->config().q_scale, 1.21f);
  EXPECT_EQ(m->config().n_ctx_train, 256);
  const auto toks = some_tokens(24, m->config().n_vocab);
  const std::vector<float> lm = logits_of(m, toks);
  EXPECT_GT(test::max_abs_diff(logits_of(plain, toks), lm, "LongRoPE vs none"), 1e-2);
  EXPECT_LT(test::max_rel_diff(lm, test::reference_logits(*m, toks), "LongRoPE"), 1e-4);
  // Loaded for a context past the original one: the long factors, the
  // file's whole context, and another fingerprint (caches keep them apart).
  const auto long_ctx = Model::load(both, {512});
  EXPECT_EQ(long_ctx->config().rope_divisors, std::vector<float>(8, 4.0f));
  EXPECT_EQ(long_ctx->config().n_ctx_train, 512);
  EXPECT_FLOAT_EQ(long_ctx->config().q_scale, 1.21f);
  EXPECT_NE(long_ctx->fingerprint(), m->fingerprint());
  EXPECT_EQ(Model::load(both, {256})->fingerprint(), m->fingerprint());  // up to the original: short
  const std::vector<float> ll = logits_of(long_ctx, toks);
  EXPECT_GT(test::max_abs_diff(ll, lm, "long vs short factors"), 1e-2);
  EXPECT_LT(test::max_rel_diff(ll, test::reference_logits(*long_ctx, toks), "LongRoPE long"), 1e-4);
  for (const auto& p : {base, shorter, both}) std::filesystem::remove(p);
}

// The window, the windowed layers and the layers without RoPE change what
// cached KV means: they are part of the fingerprint that keys every cache.
TEST(ModelStrict, WindowsAndRopeLayersAreInTheFingerprint) {
  ModelShape g = *model_preset("tiny-gemma3");
  const auto a = Model::load(write_tiny("window8", g));
  g.sliding_window = 16;
  const auto b = Model::load(write_tiny("window16", g));
  g.sliding_window_pattern = 2;
  const auto c = Model::load(write_tiny("pattern2", g));
  EXPECT_EQ(a->config().layer_windowed, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(c->config().layer_windowed, (std::vector<uint8_t>{1, 0, 1, 0, 1, 0}));
  EXPECT_NE(a->fingerprint(), b->fingerprint());
  EXPECT_NE(b->fingerprint(), c->fingerprint());
  const auto s = Model::load(write_tiny("smollm3", *model_preset("tiny-smollm3")));
  EXPECT_EQ(s->config().layer_no_rope, (std::vector<uint8_t>{0, 0, 0, 1}));
  // Gemma 2: windowed and global layers in turn; the attention soft-cap keys caches too.
  ModelShape g2 = *model_preset("tiny-gemma2");
  const auto d = Model::load(write_tiny("gemma2", g2));
  EXPECT_EQ(d->config().layer_windowed, (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_EQ(d->config().attn_softcap, 0.5f);
  g2.attn_softcap = 0;
  EXPECT_NE(d->fingerprint(), Model::load(write_tiny("gemma2-nocap", g2))->fingerprint());
}

// YaRN: each pair's frequency as Transformers computes it (in float64 here),
// and Q and K scaled by 1 + 0.1 ln(factor).
TEST(ModelStrict, YarnDividesFrequenciesAlongItsRampAndScalesAttention) {
  const auto m = Model::load(write_tiny("yarn", *model_preset("tiny-qwen2-yarn")));
  const ModelConfig& c = m->config();
  const double factor = 4, original = 64, base = c.rope_base, dim = c.n_rot;
  const double pi = 3.14159265358979323846;
  const auto correction = [&](double turns) {
    return dim * std::log(original / (turns * 2 * pi)) / (2 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(correction(32))),
               high = std::min(dim - 1, std::ceil(correction(1)));
  ASSERT_EQ(c.rope_divisors.size(), static_cast<size_t>(c.n_rot / 2));
  int kept = 0, divided = 0;
  for (int i = 0; i < c.n_rot / 2; ++i) {
    const double ramp = std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
    const double extrapolate = 1 - ramp;  // the share of the trained frequency
    const double inv_freq = std::pow(base, -2.0 * i / dim);
    const double scaled = inv_freq / factor * (1 - extrapolate) + inv_freq * extrapolate;
    EXPECT_NEAR(c.rope_divisors[i], inv_freq / scaled, 1e-5) << "pair " << i;
    kept += c.rope_divisors[i] == 1.0f;
    divided += std::abs(c.rope_divisors[i] - 4.0f) < 1e-6f;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);  // the ramp lies inside the pairs
  const double mscale = 1 + 0.1 * std::log(factor);
  EXPECT_NEAR(c.q_scale, mscale * mscale, 1e-6);
  // Its other keys change what the model computes and are refused by name;
  // YaRN where a layer rotates with its own base (Gemma) is refused.
  const auto base_file = write_tiny("yarn-base", *model_preset("tiny-qwen2-yarn"));
  const auto log_mul =
      rewrite(base_file, "yarn-logmul", {{"qwen2.rope.scaling.yarn_log_multiplier", GgufValue::f32(0.1f)}});
  EXPECT_NE(load_error(log_mul).find("qwen2.rope.scaling.yarn_log_multiplier = 0.1"), std::string::npos)
      << load_error(log_mul);
  ModelShape g = *model_preset("tiny-gemma3");
  g.yarn_factor = 4, g.yarn_original_context = 64;
  EXPECT_NE(
      load_error(write_tiny("yarn-gemma3", g)).find("YaRN rope scaling on a gemma3 model is not supported"),
      std::string::npos);
  // Mistral 3: YaRN's scale divided by its value at mscale_all_dim (1: none
  // left), and the attention temperature per original context.
  const auto mi = Model::load(write_tiny("ministral3", *model_preset("tiny-ministral3")));
  EXPECT_NEAR(mi->config().q_scale, 1.0, 1e-6);
  EXPECT_EQ(mi->config().attn_temp_length, 8);
  EXPECT_FLOAT_EQ(attention_temperature(mi->config(), 7), 1.0f);
  EXPECT_FLOAT_EQ(attention_temperature(mi->config(), 8), static_cast<float>(1 + 0.5 * std::log(2.0)));
  EXPECT_FLOAT_EQ(attention_temperature(mi->config(), 23), static_cast<float>(1 + 0.5 * std::log(3.0)));
  const auto temp_on_qwen =
      rewrite(base_file, "yarn-temp", {{"qwen2.attention.temperature_scale", GgufValue::f32(0.1f)}});
  EXPECT_NE(load_error(temp_on_qwen).find("qwen2.attention.temperature_scale = 0.1"), std::string::npos)
      << load_error(temp_on_qwen);
  std::filesystem::remove(temp_on_qwen);
  // The fingerprint sees the scaling.
  EXPECT_NE(m->fingerprint(), Model::load(write_tiny("no-yarn", *model_preset("tiny-qwen2")))->fingerprint());
  for (const auto& p : {base_file, log_mul}) std::filesystem::remove(p);
}

// What the engine does not implement is refused by name: a tensor it would
// ignore, a key of the architecture's it does not read, scaling types,
// experts, split files.
TEST(ModelStrict, WhatTheEngineDoesNotImplementIsRefusedByName) {
  const auto base = write_tiny("base", *model_preset("tiny"));
  ASSERT_EQ(load_error(base), "");
  const struct {
    std::vector<std::pair<std::string, GgufValue>> metadata;
    std::string tensor;
    std::string names;
  } cases[] = {
      {{}, "blk.0.attn_q_norm.weight", "tensor 'blk.0.attn_q_norm.weight' is not implemented"},
      // Gemma 2's attention soft-capping; Phi-3's LongRoPE factor elsewhere.
      {{{"llama.attention.q_lora_rank", GgufValue::u32(1536)}}, "", "'llama.attention.q_lora_rank'"},
      {{{"llama.rope.scaling.attn_factor", GgufValue::f32(1.2f)}}, "", "llama.rope.scaling.attn_factor"},
      {{{"llama.attention.sliding_window", GgufValue::u32(8)},
        {"llama.attention.sliding_window_pattern", GgufValue::u32(1000)}},
       "",
       "sliding_window_pattern = 1000 is out of range"},
      {{{"llama.rope.scaling.type", GgufValue::string("dynamic")}}, "", "rope scaling type 'dynamic'"},
      {{{"llama.rope.scaling.type", GgufValue::string("yarn")}},
       "",
       "yarn rope scaling without llama.rope.scaling.factor"},
      {{{"llama.rope.scaling.type", GgufValue::string("linear")}}, "", "without llama.rope.scaling.factor"},
      {{{"llama.expert_count", GgufValue::u32(8)}}, "", "mixture-of-experts"},
      {{{"llama.attention.value_length", GgufValue::u32(32)}}, "", "value_length 32"},
      {{{"split.count", GgufValue::u32(2)}}, "", "split over 2 files"},
      // Found by the gguf fuzz target: 16M layers were allocated before any was looked for.
      {{{"llama.block_count", GgufValue::u32(1 << 24)}}, "", "block_count 16777216 needs more tensors"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const auto path = rewrite(base, "strict-" + std::to_string(i++), c.metadata, c.tensor);
    const std::string error = load_error(path);
    EXPECT_NE(error.find(c.names), std::string::npos) << "expected \"" << c.names << "\", got: " << error;
    std::filesystem::remove(path);
  }
  // Harmless keys still load: scaling metadata of no effect, zero experts.
  const auto fine = rewrite(base, "strict-fine",
                            {{"llama.rope.scaling.type", GgufValue::string("none")},
                             {"llama.rope.scaling.original_context_length", GgufValue::u32(512)},
                             {"llama.expert_count", GgufValue::u32(0)},
                             {"llama.attention.key_length", GgufValue::u32(16)}});
  EXPECT_EQ(load_error(fine), "");
  // rope_freqs in an architecture that does not use it, or of the wrong size.
  const auto qwen = write_tiny("qwen", *model_preset("tiny-qwen2"));
  const auto qwen_freqs = rewrite(qwen, "qwen-freqs", {}, "rope_freqs.weight", 8);
  EXPECT_NE(load_error(qwen_freqs).find("rope_freqs.weight in a 'qwen2' model"), std::string::npos)
      << load_error(qwen_freqs);
  const auto short_freqs = rewrite(base, "short-freqs", {}, "rope_freqs.weight", 3);
  EXPECT_NE(load_error(short_freqs).find("rope_freqs.weight"), std::string::npos) << load_error(short_freqs);
  const auto zero_freqs = rewrite(base, "zero-freqs", {}, "rope_freqs.weight", 8);
  EXPECT_NE(load_error(zero_freqs).find("must be a positive number"), std::string::npos)
      << load_error(zero_freqs);
  for (const auto& p : {base, fine, qwen, qwen_freqs, short_freqs, zero_freqs}) std::filesystem::remove(p);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

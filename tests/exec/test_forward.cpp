// The forward pass against a float64 reference, against itself (prefill vs
// decode, batch splits) and against a real trained model's known output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "compute/dot.h"
#include "compute/packed_matrix.h"
#include "exec/forward.h"
#include "model/model.h"
#include "model/model_writer.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "reference_forward.h"
#include "test_support.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// n greedy tokens after `prompt`, one forward pass each (the pass alone, as
// these tests check it; front ends decode through the engine).
std::vector<int32_t> greedy(Forward& fwd, KvAssembly& kv, std::span<const int32_t> prompt, int n) {
  std::vector<float> logits;
  fwd.eval(prompt, kv, Logits::Last, logits);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    if (i + 1 < n) fwd.eval(std::span<const int32_t>(&out.back(), 1), kv, Logits::Last, logits);
  }
  return out;
}

std::shared_ptr<const Model> tiny_model(const std::string& preset, DType type, bool tied = false) {
  return test::random_model(preset, type, tied);
}

std::vector<int32_t> some_tokens(int n, int n_vocab, int salt = 0) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + 11 + salt * 101) % n_vocab;
  return t;
}

std::vector<float> eval_all(const std::shared_ptr<const Model>& m, const std::vector<int32_t>& toks,
                            DType kv_type, int threads = 2) {
  ThreadPool pool(threads);
  Forward fwd(m, pool);
  KvAssembly kv(m->config(), static_cast<int64_t>(toks.size()), kv_type);
  std::vector<float> logits;
  fwd.eval(toks, kv, Logits::All, logits);
  return logits;
}

// Logits of every token, fed one at a time (the decode path).
std::vector<float> decode_each(const std::shared_ptr<const Model>& m, const std::vector<int32_t>& toks) {
  ThreadPool pool(2);
  Forward fwd(m, pool);
  KvAssembly kv(m->config(), static_cast<int64_t>(toks.size()), DType::F32);
  std::vector<float> all, logits;
  for (int32_t t : toks) {
    fwd.eval(std::span(&t, 1), kv, Logits::Last, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

struct RefCase {
  std::string preset;
  DType type;
  bool tied;
};

class ReferenceForward : public ::testing::TestWithParam<RefCase> {};

// The engine keeps weights in their file type and dequantizes exactly, so
// against a float64 pass on the same dequantized weights the only error is
// float32 accumulation (and f16 rounding of cached K/V): a relative error of
// 1e-4 of the logit range is far above that and far below any real bug.
TEST_P(ReferenceForward, MatchesFloat64Reference) {
  const RefCase& rc = GetParam();
  auto m = tiny_model(rc.preset, rc.type, rc.tied);
  const auto toks = some_tokens(19, m->config().n_vocab);  // >= kGemmMinTokens: the GEMM path
  const auto ref = test::reference_logits(*m, toks);
  EXPECT_LT(test::max_rel_diff(eval_all(m, toks, DType::F32), ref, "kv f32"), 1e-4);
  // f16 K/V carry a relative rounding of 2^-11 (4.9e-4) per element, amplified
  // through the layers of a random model with wide (std 0.2) weights.
  EXPECT_LT(test::max_rel_diff(eval_all(m, toks, DType::F16), ref, "kv f16"), 5e-3);
  // Token by token: the decode path.
  EXPECT_LT(test::max_rel_diff(decode_each(m, toks), ref, "decode path"), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(
    Types, ReferenceForward,
    ::testing::Values(RefCase{"tiny", DType::F32, false}, RefCase{"tiny", DType::F16, false},
                      RefCase{"tiny", DType::BF16, false}, RefCase{"tiny", DType::Q8_0, false},
                      RefCase{"tiny", DType::Q4_0, false}, RefCase{"tiny", DType::F32, true},
                      RefCase{"tiny-qwen2", DType::F32, false}, RefCase{"tiny-qwen2", DType::Q8_0, true},
                      RefCase{"tiny-qwen2-yarn", DType::F32, false},
                      RefCase{"tiny-partial-rope", DType::F32, false},
                      RefCase{"tiny-ministral3", DType::F32, false},
                      RefCase{"tiny-ministral3", DType::Q8_0, true},
                      RefCase{"tiny-llama3", DType::F32, false}, RefCase{"tiny-llama3", DType::Q8_0, true},
                      RefCase{"tiny-qwen3", DType::F32, false}, RefCase{"tiny-qwen3", DType::Q8_0, true},
                      RefCase{"tiny-gemma2", DType::F32, true}, RefCase{"tiny-gemma2", DType::Q8_0, true},
                      RefCase{"tiny-gemma3", DType::F32, true}, RefCase{"tiny-gemma3", DType::Q8_0, true},
                      RefCase{"tiny-phi3", DType::F32, false}, RefCase{"tiny-phi3", DType::Q8_0, true},
                      RefCase{"tiny-smollm3", DType::F32, false}, RefCase{"tiny-smollm3", DType::Q8_0, true}),
    [](const auto& info) {
      std::string n = info.param.preset + "_" + std::string(dtype_info(info.param.type).name) +
                      (info.param.tied ? "_tied" : "");
      for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return n;
    });

TEST(Forward, KQuantModelMatchesReference) {
  // k-quant blocks are 256 wide: a model whose rows are multiples of 256.
  RandomModelOptions o;
  o.shape = *model_preset("tiny");
  o.shape.n_embd = 256, o.shape.n_ff = 512, o.shape.n_layer = 1;
  o.stddev = 0.2f;
  for (DType t : {DType::Q4_K, DType::Q6_K}) {
    o.type = t;
    const auto path = test::temp_path("kq") += ".gguf";
    write_random_model(path, o);
    auto m = Model::load(path);
    std::filesystem::remove(path);
    EXPECT_EQ(m->layers[0].wq.type, t);
    const auto toks = some_tokens(9, m->config().n_vocab);
    EXPECT_LT(test::max_rel_diff(eval_all(m, toks, DType::F32), test::reference_logits(*m, toks),
                                 dtype_info(t).name.data()),
              1e-4);
  }
}

// Int8 activations are approximate by design. Their quality metric, against
// the same weights with fp32 activations: teacher-forced top-1 agreement and
// the largest logit difference on the trained stories260K model requantized
// to Q8_0. Each token's matmuls depend on its own activations only, so a
// decode step gives what the same token gets inside a prefill.
class Int8Activations : public ::testing::Test {
 protected:
  // The best int8 kernels this CPU has: AVX-512 VNNI, else AVX2's.
  void SetUp() override {
    set_isa(best_isa());
    if (!has_int8_panels(DType::Q8_0)) set_isa(Isa::Avx2);
    ASSERT_TRUE(has_int8_panels(DType::Q8_0));
    std::printf("[check] int8 kernels: %s\n", std::string(isa_name(current_isa())).c_str());
  }
  void TearDown() override {
    set_int8_activations(false);
    set_isa(saved_);
  }
  std::vector<float> logits(const std::shared_ptr<const Model>& m, const std::vector<int32_t>& toks,
                            bool int8) {
    set_int8_activations(int8);
    return eval_all(m, toks, DType::F32);
  }
  Isa saved_ = current_isa();
};

TEST_F(Int8Activations, QualityOnTrainedModel) {
  DEPCACHE_REQUIRE_SHARED(path, "models/stories260K-f32.v1.gguf");
  const auto q8 = test::temp_path("stories-q8") += ".gguf";
  quantize_model(path, q8, DType::Q8_0);
  auto m = Model::load(q8);
  std::filesystem::remove(q8);
  EXPECT_EQ(m->layers[0].wq.type, DType::Q8_0);
  const Tokenizer tok(Vocab::from_gguf(m->file()));
  auto ids = tok.encode("Once upon a time", true, true);
  {  // the sequence: the fp32-activation greedy continuation
    ThreadPool pool(2);
    Forward fwd(m, pool);
    KvAssembly kv(m->config(), 128, DType::F32);
    const std::vector<int32_t> gen = greedy(fwd, kv, ids, 60);
    ids.insert(ids.end(), gen.begin(), gen.end());
  }
  const int n_vocab = m->config().n_vocab;
  const auto exact = logits(m, ids, false), approx = logits(m, ids, true);
  int agree = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* a = exact.data() + i * n_vocab;
    const float* b = approx.data() + i * n_vocab;
    agree += std::max_element(a, a + n_vocab) == a + (std::max_element(b, b + n_vocab) - b);
  }
  const double max_diff = test::max_abs_diff(exact, approx, "int8 vs fp32 activations");
  double max_abs = 0;
  for (float v : exact) max_abs = std::max(max_abs, double(std::fabs(v)));
  std::printf(
      "[check] stories260K Q8_0, int8 vs fp32 activations: top-1 %d/%zu, max |dlogit| %.3g (max |logit| "
      "%.3g)\n",
      agree, ids.size(), max_diff, max_abs);
  EXPECT_GE(agree, static_cast<int>(ids.size()) * 95 / 100);
  EXPECT_LT(max_diff, 0.05 * max_abs);
}

TEST_F(Int8Activations, DecodeMatchesPrefillOnKQuants) {
  RandomModelOptions o;
  o.shape = *model_preset("tiny");
  o.shape.n_embd = 256, o.shape.n_ff = 512, o.shape.n_layer = 2;
  o.type = DType::Q4_K;
  const auto path = test::temp_path("i8") += ".gguf";
  write_random_model(path, o);
  auto m = Model::load(path);
  std::filesystem::remove(path);
  const auto toks = some_tokens(19, m->config().n_vocab);
  const auto ref = test::reference_logits(*m, toks);
  const auto got = logits(m, toks, true);
  EXPECT_LT(test::max_rel_diff(got, ref, "Q4_K int8 activations"), 5e-2);
  const auto all = decode_each(m, toks);
  EXPECT_LT(test::max_abs_diff(all.data(), got.data(), all.size(), "int8 decode vs prefill"), 1e-5);
}

// prefill(N) then decode(1) must give the logits of prefill(N+1) at the last
// position: same arithmetic except the matmul path (GEMM vs dot), so the
// tolerance is float32 accumulation-order noise.
TEST(Forward, PrefillThenDecodeEqualsLongerPrefill) {
  for (const char* preset : {"tiny", "tiny-qwen2"})
    for (DType kv_type : {DType::F32, DType::F16}) {
      auto m = tiny_model(preset, DType::F16);
      const int n_vocab = m->config().n_vocab;
      const auto toks = some_tokens(33, n_vocab, 3);
      ThreadPool pool(2);
      Forward fwd(m, pool);
      KvAssembly kv(m->config(), 64, kv_type);
      std::vector<float> logits;
      fwd.eval(std::span(toks).first(32), kv, Logits::Last, logits);
      fwd.eval(std::span(toks).subspan(32, 1), kv, Logits::Last, logits);
      const auto full = eval_all(m, toks, kv_type);
      EXPECT_LT(test::max_abs_diff(logits.data(), full.data() + 32 * n_vocab, n_vocab,
                                   std::string(preset) + " prefill+decode"),
                1e-4);
    }
}

TEST(Forward, BatchSplitsAndThreadCountsAgree) {
  auto m = tiny_model("tiny", DType::Q8_0);
  const int n_vocab = m->config().n_vocab;
  const auto toks = some_tokens(40, n_vocab, 5);
  const auto one_batch = eval_all(m, toks, DType::F32, 1);
  const auto two_threads = eval_all(m, toks, DType::F32, 2);
  EXPECT_LT(test::max_abs_diff(one_batch.data(), two_threads.data(), one_batch.size(), "1 vs 2 threads"),
            1e-5);
  ThreadPool pool(2);
  Forward fwd(m, pool);
  KvAssembly kv(m->config(), 40, DType::F32);
  std::vector<float> all, logits;
  for (int start : {0, 7, 10, 25}) {
    const int end = start == 25 ? 40 : (start == 0 ? 7 : (start == 7 ? 10 : 25));
    fwd.eval(std::span(toks).subspan(start, end - start), kv, Logits::All, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  EXPECT_LT(test::max_abs_diff(all.data(), one_batch.data(), all.size(), "split batches"), 1e-4);
}

TEST(Forward, RejectsBadTokensAndOverflow) {
  auto m = tiny_model("tiny", DType::F32);
  ThreadPool pool(1);
  Forward fwd(m, pool);
  KvAssembly kv(m->config(), 4, DType::F32);
  std::vector<float> logits;
  const std::vector<int32_t> bad = {1, m->config().n_vocab};
  EXPECT_THROW(fwd.eval(bad, kv, Logits::Last, logits), Error);
  const std::vector<int32_t> too_long = {1, 2, 3, 4, 5};
  try {
    fwd.eval(too_long, kv, Logits::Last, logits);
    FAIL() << "expected a context overflow error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::LimitExceeded);
    EXPECT_NE(std::string(e.what()).find("context"), std::string::npos) << e.what();
  }
}

// The trained stories260K model must reproduce its known greedy continuation.
TEST(Forward, Stories260KGreedyMatchesKnownText) {
  DEPCACHE_REQUIRE_SHARED(path, "models/stories260K-f32.v1.gguf");
  auto m = Model::load(path);
  const Tokenizer tok(Vocab::from_gguf(m->file()));
  const std::string prompt = "Once upon a time";
  const auto ids = tok.encode(prompt, true, true);
  ASSERT_EQ(ids.size(), 5u);
  for (DType kv_type : {DType::F32, DType::F16}) {
    ThreadPool pool(2);
    Forward fwd(m, pool);
    KvAssembly kv(m->config(), 128, kv_type);
    const std::vector<int32_t> gen = greedy(fwd, kv, ids, 60);
    std::vector<int32_t> all = ids;
    all.insert(all.end(), gen.begin(), gen.end());
    EXPECT_EQ(tok.decode(all),
              "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
              "One day, "
              "she saw a big, red ball. She wanted to play with it, but it was too high.\nLily");
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

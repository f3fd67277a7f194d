// The depcache binary as a user runs it: outputs, help and exit codes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "model/gguf.h"
#include "model/model_writer.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::CliRun;
CliRun run(const std::string& args, const std::string& stdin_text = "") {
  return test::run_cli(args, stdin_text);
}

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new std::filesystem::path(test::temp_path("cli-model") += ".gguf");
    const CliRun r = run("model new --preset tiny --type q8_0 --seed 3 -o " + model_->string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*model_);
    delete model_;
  }
  static std::filesystem::path* model_;
};
std::filesystem::path* Cli::model_ = nullptr;

TEST_F(Cli, EverySubcommandHasHelp) {
  for (const char* sub :
       {"", "model", "model new", "model info", "model quantize", "tokenize", "generate", "bench-model"}) {
    const CliRun r = run(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub << ": " << r.out;
    EXPECT_NE(r.out.find("--help"), std::string::npos) << sub;
  }
}

TEST_F(Cli, GenerateIsDeterministicWhenGreedy) {
  const std::string args =
      "generate -m " + model_->string() + " -p 'the cat' -n 12 --temp 0 --ignore-eos -t 2";
  const CliRun a = run(args), b = run(args);
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_EQ(a.out.rfind("the cat", 0), 0u) << a.out;  // the prompt is echoed first
  EXPECT_NE(a.out.find("TTFT"), std::string::npos);
  const auto text = [](const std::string& s) { return s.substr(0, s.find("\nprompt:")); };
  EXPECT_EQ(text(a.out), text(b.out));
}

TEST_F(Cli, TokenizeReadsStdinExactly) {
  const CliRun r = run("tokenize -m " + model_->string(), "hi there");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(r.out.empty());
  const CliRun with_bos = run("tokenize --bos -m " + model_->string(), "hi there");
  EXPECT_EQ(with_bos.out, "1 " + r.out) << "BOS id 1 of the built-in vocabulary is prepended";
}

TEST_F(Cli, ExitCodesMeanSomething) {
  EXPECT_EQ(run("generate -p x").code, 2) << "missing required option";
  EXPECT_EQ(run("no-such-command").code, 2);
  EXPECT_EQ(run("generate -m /nonexistent.gguf -p x").code, 4);
  const auto junk = test::temp_path("junk") += ".gguf";
  std::ofstream(junk) << "GGUF but not really";
  const CliRun corrupt = run("generate -m " + junk.string() + " -p x");
  EXPECT_EQ(corrupt.code, 3) << corrupt.out;
  EXPECT_NE(corrupt.out.find("GGUF version"), std::string::npos) << corrupt.out;
  std::filesystem::remove(junk);
  const CliRun too_long = run("generate -m " + model_->string() + " -p 'a b c' -n 100 -c 8");
  EXPECT_EQ(too_long.code, 5) << too_long.out;
  EXPECT_EQ(run("model new --preset nope -o /tmp/x.gguf").code, 3);
  EXPECT_EQ(run("generate -m " + model_->string() + " -p x --temp -1").code, 3);
}

TEST_F(Cli, BenchModelPrintsTableAndJson) {
  const CliRun table = run("bench-model -m " + model_->string() + " -p 16 -n 4 -r 1 -t 2");
  ASSERT_EQ(table.code, 0) << table.out;
  EXPECT_NE(table.out.find("pp16"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("tg4"), std::string::npos) << table.out;
  const CliRun json = run("bench-model -m " + model_->string() + " -p 8 -n 0 -r 1 --json");
  ASSERT_EQ(json.code, 0) << json.out;
  EXPECT_NE(json.out.find("\"avg_ts\""), std::string::npos) << json.out;
  const CliRun int8 = run("bench-model -m " + model_->string() + " -p 8 -n 2 -r 1 --int8-activations");
  ASSERT_EQ(int8.code, 0) << int8.out;
  EXPECT_NE(int8.out.find("pp8"), std::string::npos) << int8.out;
  // Sequences decoding side by side: a row per count, tokens counted over all.
  const CliRun batched = run("bench-model -m " + model_->string() + " -p 0 -n 3 -r 1 --parallel 1,4 --json");
  ASSERT_EQ(batched.code, 0) << batched.out;
  std::map<std::string, int64_t> tokens;
  std::istringstream lines(batched.out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') {
      const auto j = nlohmann::json::parse(line);
      tokens[j["test"].get<std::string>()] = j["n_tokens"].get<int64_t>();
    }
  EXPECT_EQ(tokens, (std::map<std::string, int64_t>{{"tg3", 3}, {"tg3x4", 12}})) << batched.out;
  const CliRun none = run("bench-model -m " + model_->string() + " -p 0 -n 3 -r 1 --parallel 0");
  EXPECT_EQ(none.code, 3) << none.out;
  EXPECT_NE(none.out.find("--parallel"), std::string::npos) << none.out;
  const CliRun bf16 = run("bench-model -m " + model_->string() + " -p 8 -n 2 -r 1 --bf16-products");
  ASSERT_EQ(bf16.code, 0) << bf16.out;
  EXPECT_NE(bf16.out.find("pp8"), std::string::npos) << bf16.out;
}

// Requantizing keeps the model usable: the Q8_0 test model rewritten as F16
// and back generates, and the types are the requested ones.
TEST_F(Cli, ModelQuantizeRewritesMatrices) {
  const auto f16 = test::temp_path("cli-f16") += ".gguf";
  const CliRun r = run("model quantize -m " + model_->string() + " -o " + f16.string() + " --type f16");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("as F16"), std::string::npos) << r.out;
  const CliRun info = run("model info --tensors " + f16.string());
  EXPECT_NE(info.out.find("blk.0.attn_q.weight"), std::string::npos);
  EXPECT_EQ(info.out.find("Q8_0"), std::string::npos) << info.out;
  const CliRun gen = run("generate -m " + f16.string() + " -p 'a b' -n 4 --temp 0");
  EXPECT_EQ(gen.code, 0) << gen.out;
  EXPECT_EQ(run("model quantize -m " + model_->string() + " -o " + f16.string() + " --type q9_9").code, 3);
  EXPECT_EQ(run("model quantize -m " + f16.string() + " -o " + f16.string() + " --type q8_0").code, 3);
  EXPECT_EQ(run("model quantize -m /nonexistent.gguf -o " + f16.string() + " --type q8_0").code, 4);
  std::filesystem::remove(f16);
}

// The random weights' spread: --init-std for every matrix, --qk-init-std for
// the query and key projections alone.
TEST_F(Cli, ModelNewDrawsWeightsWithTheAskedSpread) {
  const auto path = test::temp_path("cli-init-std") += ".gguf";
  ASSERT_EQ(run("model new --preset tiny --init-std 0.05 --qk-init-std 0.2 -o " + path.string()).code, 0);
  {
    const GgufFile f = GgufFile::open(path);
    const auto spread = [&](const char* name) {
      const GgufTensor* t = f.find_tensor(name);
      EXPECT_NE(t, nullptr) << name;
      if (t == nullptr || t->type != DType::F32) return 0.0;
      double ss = 0;
      for (int64_t i = 0; i < t->n_elements(); ++i) {
        float v;
        std::memcpy(&v, t->data + i * sizeof v, sizeof v);
        ss += double(v) * v;
      }
      return std::sqrt(ss / static_cast<double>(t->n_elements()));
    };
    EXPECT_NEAR(spread("blk.0.attn_q.weight"), 0.2, 0.01);
    EXPECT_NEAR(spread("blk.1.attn_k.weight"), 0.2, 0.01);
    EXPECT_NEAR(spread("blk.0.attn_v.weight"), 0.05, 0.003);
    EXPECT_NEAR(spread("blk.1.ffn_up.weight"), 0.05, 0.003);
    EXPECT_NEAR(spread("token_embd.weight"), 0.05, 0.003);
  }
  EXPECT_EQ(run("model new --preset tiny --qk-init-std -1 -o " + path.string()).code, 2);
  std::filesystem::remove(path);
}

TEST_F(Cli, ModelInfoShowsTensors) {
  const CliRun r = run("model info --tensors " + model_->string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("blk.1.ffn_down.weight"), std::string::npos);
  EXPECT_NE(r.out.find("Q8_0"), std::string::npos);
}

// The support section: what the file needs part by part, its chat template,
// and the verdict (exit 3 when a part is refused).
TEST_F(Cli, ModelInfoSaysWhatIsSupported) {
  const auto path = test::temp_path("cli-support") += ".gguf";
  RandomModelOptions o;
  o.shape = *model_preset("tiny");
  o.shape.n_layer = 1;
  o.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
  write_random_model(path, o);
  CliRun r = run("model info " + path.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("chat template  Jinja2, 65 bytes, run as it is"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verdict        runs"), std::string::npos) << r.out;
  // A template the interpreter cannot read: chats need --chat-template, the model still runs.
  o.chat_template = "{% include 'turns.jinja' %}";
  write_random_model(path, o);
  r = run("model info " + path.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("chat template  NOT SUPPORTED: chat template line 1: the statement 'include' is not "
                       "supported; serve needs --chat-template NAME for chats"),
            std::string::npos)
      << r.out;
  // A part the engine does not implement is named, and the verdict is a refusal.
  o.chat_template.clear();
  write_random_model(path, o);
  const auto yarn = test::temp_path("cli-support-yarn") += ".gguf";
  {
    const GgufFile f = GgufFile::open(path);
    GgufWriter w;
    for (const auto& [k, v] : f.metadata()) w.set(k, v);
    w.set("llama.rope.scaling.type", GgufValue::string("dynamic"));
    for (const GgufTensor& t : f.tensors())
      w.add_tensor(t.name, t.type, t.dims, [&t](uint8_t* dst, size_t n) { std::memcpy(dst, t.data, n); });
    w.write(yarn);
  }
  r = run("model info " + yarn.string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("chat template  none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model          NOT SUPPORTED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dynamic"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verdict        refused (see above)"), std::string::npos) << r.out;
  std::filesystem::remove(path);
  std::filesystem::remove(yarn);
}

// `model probe`: the text's ids, every position's logits and a greedy
// continuation as JSON (what bench/experiments/oracle_check.sh compares with the other
// engine); a context the model cannot run is LimitExceeded (exit 5).
TEST_F(Cli, ModelProbePrintsIdsLogitsAndAGreedyContinuation) {
  const CliRun r = run("model probe -m " + model_->string() + " -n 5", "Once upon a time");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  ASSERT_GT(j["ids"].size(), 2u);
  EXPECT_EQ(j["logits"].size(), j["ids"].size());
  EXPECT_EQ(j["greedy"].size(), 5u);
  for (const auto& row : j["logits"])
    for (const auto& x : row) ASSERT_TRUE(std::isfinite(x.get<double>()));
  EXPECT_EQ(run("model probe -m " + model_->string() + " -n 5 -c 100000", "Once upon a time").code, 5);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

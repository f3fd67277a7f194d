// `depcache train` as a user runs it: a synthetic world, QA requests of one
// hop, a tiny model trained with checkpoints; a run stopped by a signal and
// resumed ends exactly where an uninterrupted one does; errors are clear.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "model/model.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "retrieval/rag_request.h"
#include "test_support.h"
#include "train/qa_sequences.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::run_cli;

class TrainCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(test::temp_path("train-cli"));
    std::filesystem::create_directories(*dir_);
    for (const auto& [seed, name] : {std::pair{1, "train"}, {2, "eval"}}) {
      auto r = run_cli(fmt::format(
          "kg import --synthetic --entities 40 --relations 4 --facts-per-entity 2 --seed {} -o {}", seed,
          file(std::string(name) + ".dkg")));
      ASSERT_EQ(r.code, 0) << r.out;
      r = run_cli(fmt::format(
          "workload generate --kg {} --requests 24 --qa-items 20 --entities-per-request 2 "
          "--paths-per-entity 4 --min-paths 1 --question-hops 1 --pattern uniform --seed {} --out {}",
          file(std::string(name) + ".dkg"), seed, file(std::string(name) + ".jsonl")));
      ASSERT_EQ(r.code, 0) << r.out;
    }
    auto r =
        run_cli("vocab learn --requests " + file("train.jsonl") + " --size 400 -o " + file("vocab.gguf"));
    ASSERT_EQ(r.code, 0) << r.out;
    r = run_cli(
        "model new --preset tiny --layers 1 --embd 32 --heads 2 --heads-kv 1 --ff 64 --tied --seed 3 "
        "--vocab-from " +
        file("vocab.gguf") + " -o " + file("init.gguf"));
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string file(const std::string& name) { return (*dir_ / name).string(); }
  static std::string train_args(const std::string& out, int steps) {
    return fmt::format(
        "train --init {} --requests {} --eval {} -o {} --steps {} --batch 4 --warmup 2 --lr 3e-3 "
        "--log-every 5 --eval-every 10 --checkpoint-every 5 -t 2",
        file("init.gguf"), file("train.jsonl"), file("eval.jsonl"), file(out), steps);
  }
  static std::string bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  static std::filesystem::path* dir_;
};
std::filesystem::path* TrainCli::dir_ = nullptr;

TEST_F(TrainCli, TrainsLogsAndWritesAModelTheEngineRuns) {
  const auto r = run_cli(train_args("model.gguf", 20) + " --attention dependency --scheme depth --log " +
                         file("log.jsonl") + " --position-gap 16");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("depth positions, trees see the system text, gaps of 0..16 before each tree"),
            std::string::npos)
      << r.out;
  std::ifstream log(file("log.jsonl"));
  std::string line;
  int lines = 0;
  double first = 0, last = 0;
  bool evaluated = false;
  while (std::getline(log, line)) {
    const auto j = nlohmann::json::parse(line);
    if (lines++ == 0) first = j["loss"];
    last = j["loss"];
    evaluated = evaluated || j.contains("eval_exact_match");
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  }
  EXPECT_EQ(lines, 4) << "a line every 5 of 20 steps";
  EXPECT_TRUE(evaluated);
  EXPECT_LT(last, first) << "the loss falls";
  // The engine runs it, and it knows the scheme it was trained for and what trees saw.
  const auto info = run_cli("model info " + file("model.gguf"));
  EXPECT_NE(info.out.find("depth"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("depcache.tree_context"), std::string::npos) << info.out;
  const auto gen = run_cli(fmt::format("generate -m {} -p 'What is' -n 3 --temp 0", file("model.gguf")));
  EXPECT_EQ(gen.code, 0) << gen.out;
  // `run` judges its answers: the summary's count is the rows' count.
  const auto run = run_cli(fmt::format("run -m {} --requests {} -s full,depcache -n 6 -q --json {}",
                                       file("model.gguf"), file("eval.jsonl"), file("rows.jsonl")));
  ASSERT_EQ(run.code, 0) << run.out;
  std::ifstream rows(file("rows.jsonl"));
  std::map<std::string, int> right;
  int n_rows = 0;
  while (std::getline(rows, line)) {
    const auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("answer")) << line;
    right[j["strategy"]] += j["exact_match"].get<bool>();
    ++n_rows;
  }
  EXPECT_EQ(n_rows, 48);
  for (const char* strategy : {"full", "depcache"})
    EXPECT_NE(run.out.find(fmt::format("{:<10} answers: {} of 24 exact", strategy, right[strategy])),
              std::string::npos)
        << run.out;
}

// The prompt template goes from the vocabulary (learned from prompts built
// with it) to the model made from it, through training, to `run`'s prompts.
TEST_F(TrainCli, APromptTemplateGoesFromTheVocabularyThroughTrainingToRun) {
  auto r = run_cli(
      "vocab learn --requests " + file("train.jsonl") +
      " --size 400 --prompt-system 'Facts:\n' --prompt-task-prefix '' --prompt-task-suffix ' ->' -o " +
      file("tv.gguf"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_cli("model info " + file("tv.gguf"));
  EXPECT_NE(r.out.find("depcache.prompt.task_suffix"), std::string::npos) << r.out;
  r = run_cli(
      "model new --preset tiny --layers 1 --embd 32 --heads 2 --heads-kv 1 --ff 64 --tied --vocab-from " +
      file("tv.gguf") + " --prompt-task-prefix 'Q: ' -o " + file("tinit.gguf"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_cli(fmt::format("train --init {} --requests {} -o {} --steps 2 --batch 2 -t 2", file("tinit.gguf"),
                          file("train.jsonl"), file("tmodel.gguf")));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto model = Model::load(file("tmodel.gguf"));
  RagWrapper want;
  want.system = "Facts:\n";
  want.task_prefix = "Q: ";
  want.task_suffix = " ->";
  EXPECT_EQ(model->config().prompt, want);
  // The trainer built its sequences with it: prompt, answer, EOS.
  const Tokenizer tok(Vocab::from_gguf(model->file()));
  double sum = 0;
  const std::vector<RagRequest> train = read_requests(file("train.jsonl"));
  for (const RagRequest& q : train)
    sum += static_cast<double>(make_prompt_parts(tok, q, want).n_flat_tokens() +
                               static_cast<int64_t>(answer_tokens(tok, q.answers.front()).size()));
  EXPECT_NE(r.out.find(fmt::format("training on {} sequences ({:.1f} tokens each)", train.size(),
                                   sum / static_cast<double>(train.size()))),
            std::string::npos)
      << r.out;
  // `run` builds each prompt with it.
  r = run_cli(fmt::format("run -m {} --requests {} -s full -n 1 -q --json {}", file("tmodel.gguf"),
                          file("eval.jsonl"), file("trows.jsonl")));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<RagRequest> requests = read_requests(file("eval.jsonl"));
  std::ifstream rows(file("trows.jsonl"));
  std::string line;
  size_t n = 0;
  for (; std::getline(rows, line) && n < requests.size(); ++n) {
    const int64_t tokens = nlohmann::json::parse(line)["prompt_tokens"];
    EXPECT_EQ(tokens, make_prompt_parts(tok, requests[n], want).n_flat_tokens());
    EXPECT_LT(tokens, make_prompt_parts(tok, requests[n]).n_flat_tokens());
  }
  EXPECT_EQ(n, requests.size());
  r = run_cli("model new --prompt-task-prefix -o " + file("x.gguf"));
  EXPECT_EQ(r.code, 2) << r.out;
}

TEST_F(TrainCli, ARunStoppedBySigtermResumesToTheSameModel) {
  const int steps = 60;
  ASSERT_EQ(run_cli(train_args("straight.gguf", steps)).code, 0);
  // SIGTERM once the first log line is out (step 5): the run checkpoints the
  // step it is in and exits 128 + 15. Bounded: at most 30 s of polling.
  const std::string log = file("stopped.log");
  const auto stopped = test::run_shell(
      fmt::format("{} {} --log {} > {} 2>&1 & pid=$!; "
                  "for i in $(seq 600); do [ -s {} ] && break; sleep 0.05; done; kill -TERM $pid; wait $pid; "
                  "echo exit=$?",
                  DEPCACHE_BINARY, train_args("resumed.gguf", steps), log, file("stopped.err"), log));
  ASSERT_NE(stopped.out.find("exit=143"), std::string::npos) << stopped.out << bytes(file("stopped.err"));
  const std::string err = bytes(file("stopped.err"));
  EXPECT_NE(err.find("SIGTERM at step"), std::string::npos) << err;
  ASSERT_TRUE(std::filesystem::exists(file("resumed.gguf.ckpt")));
  ASSERT_TRUE(std::filesystem::exists(file("resumed.gguf.ckpt.optim")));
  EXPECT_FALSE(std::filesystem::exists(file("resumed.gguf"))) << "no final model from a stopped run";
  const auto r = run_cli(train_args("resumed.gguf", steps) + " --resume");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("at step 60"), std::string::npos) << "the signal came before the end: " << r.out;
  EXPECT_TRUE(bytes(file("resumed.gguf")) == bytes(file("straight.gguf"))) << "the same model, bit for bit";
}

TEST_F(TrainCli, AVocabularyLearnedFromTheRequests) {
  std::string text[2];
  for (std::string& t : text) {
    const auto r =
        run_cli("vocab learn --requests " + file("train.jsonl") + " --size 1024 -o " + file("v2.gguf"));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("tokens ("), std::string::npos) << r.out;
    t = bytes(file("v2.gguf"));
  }
  EXPECT_TRUE(text[0] == text[1]) << "deterministic";
  // With room for every word, the prompt's fixed words are single tokens (the
  // colon one of its own).
  const auto t = run_cli("tokenize --pieces -m " + file("v2.gguf"), "Question: What is the");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_EQ(std::count(t.out.begin(), t.out.end(), '\n'), 5) << t.out;
  EXPECT_EQ(run_cli("vocab learn -o " + file("v3.gguf")).code, 3) << "nothing to learn from";
  EXPECT_EQ(run_cli("vocab learn --text " + file("nope.txt") + " -o " + file("v3.gguf")).code, 4);
  EXPECT_EQ(run_cli("vocab learn --text " + file("train.jsonl") + " --size 100 -o " + file("v3.gguf")).code,
            2);
}

TEST_F(TrainCli, QuestionsOverOneContextArePackedIntoOneSequence) {
  auto r = run_cli(fmt::format(
      "workload generate --kg {} --requests 12 --questions-per-context 3 --qa-items 20 "
      "--entities-per-request 3 --paths-per-entity 4 --min-paths 1 --question-hops 1 --pattern uniform "
      "--seed 5 --out {}",
      file("train.dkg"), file("packed.jsonl")));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string args = fmt::format("train --init {} --requests {} -o {} --steps 2 --batch 2 -t 2",
                                       file("init.gguf"), file("packed.jsonl"), file("packed.gguf"));
  r = run_cli(args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("training on 12 sequences"), std::string::npos) << r.out;
  r = run_cli(args + " --pack-shared-context");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("training on 4 sequences"), std::string::npos) << "3 questions per context: " << r.out;
  // Requests that merely follow each other are not packed.
  r = run_cli(
      fmt::format("train --init {} --requests {} -o {} --steps 2 --batch 2 -t 2 --pack-shared-context",
                  file("init.gguf"), file("train.jsonl"), file("packed.gguf")));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("training on 24 sequences"), std::string::npos) << r.out;
}

TEST_F(TrainCli, Errors) {
  EXPECT_EQ(run_cli("train --init " + file("nope.gguf") + " --requests " + file("train.jsonl") + " -o " +
                    file("x.gguf"))
                .code,
            4);
  std::ofstream(file("unanswered.jsonl")) << R"({"id": "q", "question": "Why?", "text": "Because."})"
                                          << "\n";
  const auto r = run_cli("train --init " + file("init.gguf") + " --requests " + file("unanswered.jsonl") +
                         " -o " + file("x.gguf"));
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("no answer"), std::string::npos) << r.out;
  EXPECT_EQ(run_cli("train --init " + file("init.gguf") + " --requests " + file("train.jsonl") + " -o " +
                    file("x.gguf") + " --attention sideways")
                .code,
            2);
  // Position gaps move context trees, which only dependency attention has.
  const auto gap = run_cli("train --init " + file("init.gguf") + " --requests " + file("train.jsonl") +
                           " -o " + file("x.gguf") + " --position-gap 8");
  EXPECT_EQ(gap.code, 3) << gap.out;
  EXPECT_NE(gap.out.find("--position-gap moves context trees: it needs --attention dependency"),
            std::string::npos)
      << gap.out;
  EXPECT_EQ(run_cli("train --init " + file("init.gguf") + " --requests " + file("train.jsonl") + " -o " +
                    file("x.gguf") + " --attention dependency --position-gap -1")
                .code,
            2);
  EXPECT_EQ(run_cli("train --init " + file("init.gguf") + " --requests " + file("train.jsonl") + " -o " +
                    file("x.gguf") + " --attention dependency --position-gap 65537")
                .code,
            2);
  EXPECT_FALSE(std::filesystem::exists(file("x.gguf")));
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

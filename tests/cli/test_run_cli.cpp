// `depcache run` as a user runs it: a request stream through the three
// strategies on a random-weight model, per-request JSON rows, and errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_support.h"

namespace depcache {
namespace {

using test::run_cli;

class RunCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(test::temp_path("run-cli"));
    std::filesystem::create_directories(*dir_);
    const auto r = run_cli("model new --preset tiny --seed 3 -o " + file("model.gguf"));
    ASSERT_EQ(r.code, 0) << r.out;
    // The second request repeats the first's entities in another order and
    // asks another question: depcache reuses both subtrees, prefix only the
    // system prompt.
    std::ofstream(*dir_ / "requests.jsonl")
        << R"({"id": "a", "question": "What is a dog?", "entities": [)"
           R"({"name": "dog", "paths": ["dog -hypernym-> canine", "dog -part-> tail"]},)"
           R"({"name": "cat", "paths": ["cat -hypernym-> feline"]}]})"
        << "\n"
        << R"({"id": "b", "question": "And a cat?", "entities": [)"
           R"({"name": "cat", "paths": ["cat -hypernym-> feline"]},)"
           R"({"name": "dog", "paths": ["dog -hypernym-> canine", "dog -part-> tail"]}]})"
        << "\n"
        << R"({"id": "c", "question": "Summarise.", "documents": [{"id": "d1", "title": "Dogs", "text": "Dogs bark."}]})"
        << "\n";
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string file(const char* name) { return (*dir_ / name).string(); }
  static std::filesystem::path* dir_;
};
std::filesystem::path* RunCli::dir_ = nullptr;

TEST_F(RunCli, ThreeStrategiesSideBySide) {
  const auto r = run_cli("run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                         " -s full,prefix,depcache --kv-type f32 --verify -n 3 --json " + file("rows.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"full ", "prefix ", "depcache ", "TTFT p50", "hit rate", "[depcache] 3/3 requests"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  std::ifstream in(file("rows.jsonl"));
  std::map<std::string, nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    rows[j["strategy"].get<std::string>() + "/" + j["id"].get<std::string>()] = j;
  }
  ASSERT_EQ(rows.size(), 9u);
  EXPECT_EQ(rows["full/b"]["reused_tokens"], 0);
  EXPECT_EQ(rows["depcache/a"]["reused_tokens"], 0);
  const int64_t dep_prompt = rows["depcache/b"]["prompt_tokens"],
                dep_reused = rows["depcache/b"]["reused_tokens"];
  const int64_t prefix_reused = rows["prefix/b"]["reused_tokens"];
  EXPECT_GT(dep_reused, prefix_reused);  // both subtrees versus the system prompt only
  EXPECT_GT(prefix_reused, 0);
  EXPECT_EQ(rows["depcache/b"]["computed_tokens"].get<int64_t>() + dep_reused, dep_prompt);
  EXPECT_LT(rows["depcache/b"]["max_logit_diff_vs_no_reuse"].get<double>(), 1e-4);
  EXPECT_EQ(rows["depcache/b"]["output"].size(), 3u);
  // Full and prefix see the same flat prompt and pick the same tokens.
  EXPECT_EQ(rows["full/b"]["output"], rows["prefix/b"]["output"]);
}

std::map<std::string, nlohmann::json> read_rows(const std::string& path) {
  std::ifstream in(path);
  std::map<std::string, nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    rows[j["id"].get<std::string>()] = j;
  }
  return rows;
}

// The disk tier across processes: the second run finds the first's spans in
// the cache directory, and reuse from disk matches recomputation.
TEST_F(RunCli, DiskTierCarriesSpansAcrossRuns) {
  const std::string dir = file("kv-cache");
  const std::string base = "run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                           " -s depcache --kv-type f32 --verify --cache-dir " + dir;
  auto r = run_cli(base + " --json " + file("disk1.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_rows(file("disk1.jsonl"))["a"]["reused_tokens"], 0);
  r = run_cli(base + " --json " + file("disk2.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("adopted from"), std::string::npos) << r.out;
  auto rows = read_rows(file("disk2.jsonl"));
  EXPECT_GT(rows["a"]["reused_tokens"].get<int64_t>(), 0) << r.out;
  EXPECT_GT(rows["a"]["found_in"]["disk"].get<int64_t>(), 0) << r.out;
  for (const char* id : {"a", "b", "c"}) {
    EXPECT_LT(rows[id]["max_logit_diff_vs_no_reuse"].get<double>(), 1e-4) << id;
    EXPECT_TRUE(rows[id]["top1_agrees_with_no_reuse"].get<bool>()) << id;
  }
  // Corrupt every span file: the third run recomputes and still answers the same.
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-7, std::ios::end);
    f.put('\x11');
  }
  r = run_cli(base + " --json " + file("disk3.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  rows = read_rows(file("disk3.jsonl"));
  EXPECT_EQ(rows["a"]["found_in"]["disk"], 0) << r.out;
  EXPECT_NE(r.out.find("bad records dropped"), std::string::npos) << r.out;
  for (const char* id : {"a", "b", "c"})
    EXPECT_LT(rows[id]["max_logit_diff_vs_no_reuse"].get<double>(), 1e-4);
}

// Two processes share spans through a real Redis; a Redis that is not
// there costs a warning, not a request.
TEST_F(RunCli, RedisTierSharedBetweenProcesses) {
  DEPCACHE_REQUIRE_REDIS(redis);
  const std::string base =
      "run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
      " -s depcache,prefix --kv-type f32 --verify --redis 127.0.0.1:" + std::to_string(redis.port());
  auto r = run_cli(base + " --json " + file("redis1.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_cli(base + " --json " + file("redis2.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(file("redis2.jsonl"));
  int remote_rows = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    remote_rows += j["found_in"]["remote"].get<int64_t>() > 0;
    EXPECT_LT(j["max_logit_diff_vs_no_reuse"].get<double>(), 1e-4) << line;
  }
  EXPECT_GE(remote_rows, 2) << r.out;  // request a of both strategies, at least
  redis.stop();
  r = run_cli(base);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: cannot connect to Redis"), std::string::npos) << r.out;
}

// A hot tier too small for the working set, with a host tier, prefetching
// and LACR's lookahead: answers stay those of full computation.
TEST_F(RunCli, SmallHotTierWithHostTierAndPrefetch) {
  const auto r = run_cli("run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                         " -s depcache --kv-type f32 --verify --cache-mib 0.02 --host-mib 1 --prefetch 2 "
                         "--policy lacr --json " +
                         file("small.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tiers: matched tokens"), std::string::npos) << r.out;
  for (const auto& [id, row] : read_rows(file("small.jsonl")))
    EXPECT_LT(row["max_logit_diff_vs_no_reuse"].get<double>(), 1e-4) << id;
}

TEST_F(RunCli, Errors) {
  const std::string base = "run -m " + file("model.gguf") + " --requests " + file("requests.jsonl");
  EXPECT_EQ(run_cli("run --help").code, 0);
  auto r = run_cli(base + " -s fastest");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("unknown strategy 'fastest'"), std::string::npos) << r.out;
  r = run_cli("run -m " + file("model.gguf") + " --requests " + file("missing.jsonl"));
  EXPECT_EQ(r.code, 4) << r.out;
  r = run_cli("run -m " + file("missing.gguf") + " --requests " + file("requests.jsonl"));
  EXPECT_EQ(r.code, 4) << r.out;
  r = run_cli(base + " --ctx-size 20");
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_NE(r.out.find("context size 20"), std::string::npos) << r.out;
  r = run_cli(base + " --scheme diagonal");
  EXPECT_EQ(r.code, 2) << r.out;
  r = run_cli(base + " --redis localhost:notaport");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("bad Redis address"), std::string::npos) << r.out;
  std::ofstream(file("bad.jsonl")) << "{\"question\": 1}\n";
  r = run_cli("run -m " + file("model.gguf") + " --requests " + file("bad.jsonl"));
  EXPECT_EQ(r.code, 3) << r.out;
}

}  // namespace
}  // namespace depcache

// `depcache run` as a user runs it: a request stream through the three
// strategies on a random-weight model, per-request JSON rows, and errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "compute/packed_matrix.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

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
  static std::string file(const std::string& name) { return (*dir_ / name).string(); }
  static void expect_mode_named_measured_kept_apart(const std::string& type, const std::string& flag,
                                                    const std::string& header, bool approximate_here);
  static std::filesystem::path* dir_;
};
std::filesystem::path* RunCli::dir_ = nullptr;

TEST_F(RunCli, ThreeStrategiesSideBySide) {
  const auto r = run_cli("run --serial -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                         " -s full,prefix,depcache --scheme depth --kv-type f32 --verify -n 3 --json " +
                         file("rows.jsonl"));
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

// Each seed system runs at its own defaults within one run (strategy/
// profile.h), says so in the header, and --policy, --scheduler and
// --host-mib override them for every strategy.
TEST_F(RunCli, EachSystemRunsWithItsOwnPolicies) {
  const std::string base = "run --serial -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                           " -s prefix,depcache,ragcache,cachecraft -q --cache-mib 8 ";
  auto r = run_cli(base);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s :
       {"[prefix] policy lru, scheduler fifo, tiers hot 8 MiB\n", "[depcache] policy lacr, scheduler fifo",
        "[ragcache] policy pgdsf, scheduler ragcache, tiers hot 8 MiB, host 32 MiB (swap-out-once)",
        "[cachecraft] policy cachecraft, scheduler fifo", "[ragcache] PGDSF prefill cost table"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  r = run_cli(base + "--policy gdsf --scheduler lpm --host-mib 0");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"[depcache] policy gdsf (--policy), scheduler lpm, tiers hot 8 MiB\n",
                        "[ragcache] policy gdsf (--policy), scheduler lpm, tiers hot 8 MiB\n"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_EQ(run_cli(base + "--policy nope").code, 3);
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
  const std::string base = "run --serial -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                           " -s depcache --scheme depth --kv-type f32 --verify --cache-dir " + dir;
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

// q8_0 KV end to end: spans written by one process to disk and Redis are
// read back by the next ones (reuse equals recomputation in q8_0), fidelity
// against f16 KV is reported, and a model whose KV rows are not whole q8_0
// blocks is refused by name before anything runs.
TEST_F(RunCli, Q8KvThroughDiskAndRedis) {
  DEPCACHE_REQUIRE_REDIS(redis);
  const std::string dir = file("kv-cache-q8");
  const std::string base = "run --serial -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                           " -s depcache,prefix --scheme depth --kv-type q8_0 --verify ";
  const std::string disk = base + "--cache-dir " + dir;
  const std::string remote = base + "--redis 127.0.0.1:" + std::to_string(redis.port());
  ASSERT_EQ(run_cli(disk + " --json " + file("q8-disk1.jsonl")).code, 0);
  ASSERT_EQ(run_cli(remote + " --json " + file("q8-redis1.jsonl")).code, 0);
  bool some_span_file = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    some_span_file |= e.is_regular_file();
  EXPECT_TRUE(some_span_file);
  for (const auto& [cmd, out, tier] : {std::tuple{disk, file("q8-disk2.jsonl"), "disk"},
                                       std::tuple{remote, file("q8-redis2.jsonl"), "remote"}}) {
    const auto r = run_cli(cmd + " --json " + out);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("KV q8_0"), std::string::npos) << r.out;
    std::ifstream in(out);
    int lower_rows = 0;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      lower_rows += j["found_in"][tier].get<int64_t>() > 0;
      EXPECT_LT(j["max_logit_diff_vs_no_reuse"].get<double>(), 1e-4) << tier << ": " << line;
      EXPECT_TRUE(j["top1_agrees_with_no_reuse"].get<bool>()) << line;
    }
    EXPECT_GE(lower_rows, 2) << tier << "\n" << r.out;
  }
  // Against f16 KV: close, not identical.
  const auto f = run_cli("run --serial -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                         " -s full --kv-type q8_0 --reference-kv-type f16 --fidelity -n 4 --json " +
                         file("q8-fidelity.jsonl"));
  ASSERT_EQ(f.code, 0) << f.out;
  std::ifstream in(file("q8-fidelity.jsonl"));
  double kl = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    kl += j["fidelity"]["kl_first_token"].get<double>();
  }
  EXPECT_GT(kl, 0.0) << "q8_0 and f16 KV gave the same logits?\n" << f.out;
  EXPECT_LT(kl, 0.1) << f.out;
  // KV rows of 16 elements (one KV head of 16) are not whole blocks.
  ASSERT_EQ(run_cli("model new --preset tiny --heads-kv 1 --seed 3 -o " + file("narrow.gguf")).code, 0);
  const auto bad = run_cli("run -m " + file("narrow.gguf") + " --requests " + file("requests.jsonl") +
                           " -s prefix --kv-type q8_0");
  EXPECT_EQ(bad.code, 3) << bad.out;
  EXPECT_NE(bad.out.find("q8_0 stores rows in blocks of 32"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("use f16"), std::string::npos) << bad.out;
  const auto unknown =
      run_cli("run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") + " --kv-type q4_0");
  EXPECT_NE(unknown.code, 0);
  EXPECT_NE(unknown.out.find("q8_0"), std::string::npos) << unknown.out;
}

// An approximate matmul mode on a model of the types it changes: said in
// the header, measured by --fidelity against exact matmuls (close, not equal;
// equal where `approximate_here` is false: the CPU has no kernels for it),
// and its K/V kept apart: an exact run finds nothing of the mode's spans on
// disk, and the next run in the mode finds them.
void RunCli::expect_mode_named_measured_kept_apart(const std::string& type, const std::string& flag,
                                                   const std::string& header, bool approximate_here) {
  const std::string model = file("model-" + type + ".gguf"), tag = type + flag;
  ASSERT_EQ(run_cli("model new --preset tiny --type " + type + " --seed 3 -o " + model).code, 0);
  const std::string base =
      "run --serial -m " + model + " --requests " + file("requests.jsonl") + " -s prefix --kv-type f32 ";
  const auto f = run_cli(base + flag + " --fidelity -n 4 --json " + file(tag + "-fidelity.jsonl"));
  ASSERT_EQ(f.code, 0) << f.out;
  EXPECT_NE(f.out.find(header), std::string::npos) << f.out;
  std::ifstream in(file(tag + "-fidelity.jsonl"));
  double kl = 0;
  int rows = 0;
  for (std::string line; std::getline(in, line); ++rows)
    kl += nlohmann::json::parse(line)["fidelity"]["kl_first_token"].get<double>();
  EXPECT_EQ(rows, 3) << f.out;
  if (approximate_here) {
    EXPECT_GT(kl, 0.0) << flag << " gave the exact logits?\n" << f.out;
    EXPECT_LT(kl, 0.1) << f.out;
  } else {
    EXPECT_EQ(kl, 0.0) << flag << " without its kernels is exact\n" << f.out;
  }
  const std::string dir = file("kv-cache-" + tag);
  ASSERT_EQ(run_cli(base + flag + " --cache-dir " + dir).code, 0);
  auto found_on_disk = [&](const std::string& extra, const std::string& json) {
    const auto r = run_cli(base + extra + " --cache-dir " + dir + " --json " + file(json));
    EXPECT_EQ(r.code, 0) << r.out;
    int64_t n = 0;
    std::ifstream rows(file(json));
    for (std::string line; std::getline(rows, line);)
      n += nlohmann::json::parse(line)["found_in"]["disk"].get<int64_t>();
    return n;
  };
  EXPECT_EQ(found_on_disk("", tag + "-exact.jsonl"), 0) << "an exact run read " << flag << " K/V";
  EXPECT_GT(found_on_disk(flag, tag + "-again.jsonl"), 0);
}

TEST_F(RunCli, Int8ActivationsAreNamedMeasuredAndKeptApart) {
  expect_mode_named_measured_kept_apart("q8_0", "--int8-activations",
                                        "matmuls: approximate, int8 activations", true);
}

// BF16 products on a BF16 and on an F16 model (whose weights they round
// too); exact on a CPU without AVX512-BF16, and said so.
TEST_F(RunCli, Bf16ProductsAreNamedMeasuredAndKeptApart) {
  const bool here = has_bf16_panels(DType::BF16);
  const std::string header =
      here ? "bfloat16 products for BF16/F16 weights (AVX512-BF16)" : "this CPU has no AVX512-BF16: exact";
  expect_mode_named_measured_kept_apart("bf16", "--bf16-products", header, here);
  expect_mode_named_measured_kept_apart("f16", "--bf16-products", header, here);
}

// Layer-wise preload from the command line: spans on disk read layer by
// layer (a fixed depth, and whole with off) answer as recomputation does;
// a value that is not auto, off or a count is refused before anything runs.
TEST_F(RunCli, LayerPreloadReadsDiskSpansLayerByLayer) {
  const std::string dir = file("kv-layered");
  const std::string base = "run --serial -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                           " -s depcache --scheme depth --kv-type f32 --verify --cache-dir " + dir;
  ASSERT_EQ(run_cli(base).code, 0);
  const std::string copy = file("kv-layered-copy");
  std::filesystem::copy(dir, copy, std::filesystem::copy_options::recursive);
  for (const auto& [mode, cache] :
       std::vector<std::pair<std::string, std::string>>{{"1", dir}, {"off", copy}}) {
    const std::string json = file(("layered-" + mode + ".jsonl").c_str());
    const std::string args = base.substr(0, base.size() - dir.size()) + cache;
    const auto r = run_cli(args + " --layer-preload " + mode + " --json " + json);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto rows = read_rows(json);
    EXPECT_GT(rows.at("a")["found_in"]["disk"].get<int64_t>(), 0) << mode << r.out;
    for (const char* id : {"a", "b", "c"}) {
      EXPECT_LT(rows.at(id)["max_logit_diff_vs_no_reuse"].get<double>(), 1e-4) << mode << id;
      EXPECT_GE(rows.at(id)["layer_wait_ms"].get<double>(), 0) << mode << id;
    }
    const bool layered = r.out.find("(0 spans layer by layer") == std::string::npos;
    EXPECT_EQ(layered, mode != "off") << r.out;
  }
  const auto bad = run_cli(base + " --layer-preload sometimes");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--layer-preload takes auto, off or a number of layers"), std::string::npos)
      << bad.out;
}

// Two processes share spans through a real Redis; a Redis that is not
// there costs a warning, not a request.
TEST_F(RunCli, RedisTierSharedBetweenProcesses) {
  DEPCACHE_REQUIRE_REDIS(redis);
  const std::string base = "run --serial -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                           " -s depcache,prefix --scheme depth --kv-type f32 --verify --redis 127.0.0.1:" +
                           std::to_string(redis.port());
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

// The same through a Redis Cluster of three masters (and a replica each):
// the second process's blocks come from the cluster, with the logits of
// recomputation; --redis and --redis-cluster together, or a plain Redis
// given as a cluster, are refused by name.
TEST_F(RunCli, RedisClusterTierSharedBetweenProcesses) {
  DEPCACHE_REQUIRE_REDIS_CLUSTER(cluster, 3, 1);
  const std::string base = "run --serial -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                           " -s depcache,prefix --scheme depth --kv-type f32 --verify --redis-block 4";
  const std::string remote = base + " --redis-cluster " + cluster.seeds();
  auto r = run_cli(remote + " --json " + file("cluster1.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("remote cluster 127.0.0.1:"), std::string::npos) << r.out;
  int masters_used = 0;
  for (const int port : cluster.masters()) masters_used += cluster.cli(port, "dbsize") != "0\n";
  EXPECT_EQ(masters_used, 3);  // the blocks are spread over every master
  r = run_cli(remote + " --json " + file("cluster2.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(file("cluster2.jsonl"));
  int remote_rows = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    remote_rows += j["found_in"]["remote"].get<int64_t>() > 0;
    EXPECT_LT(j["max_logit_diff_vs_no_reuse"].get<double>(), 1e-4) << line;
  }
  EXPECT_GE(remote_rows, 2) << r.out;
  r = run_cli(remote + " --redis 127.0.0.1:" + std::to_string(cluster.ports()[0]));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--redis excludes --redis-cluster"), std::string::npos) << r.out;
  DEPCACHE_REQUIRE_REDIS(plain);
  r = run_cli(base + " --redis-cluster 127.0.0.1:" + std::to_string(plain.port()));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("is not a cluster node"), std::string::npos) << r.out;
  r = run_cli(base + " --redis-cluster 127.0.0.1:6379,nohost:");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("bad Redis address"), std::string::npos) << r.out;
}

// A hot tier that holds about one request, with a host tier: the first
// request's subtrees are demoted to the host tier by the next two and come
// back from there for the fourth; with prefetching they are loaded while an
// earlier request computes. Answers stay those of full computation either way.
TEST_F(RunCli, SmallHotTierWithHostTierAndPrefetch) {
  std::ofstream(file("tiers.jsonl"))
      << R"({"id": "a", "question": "What is a dog?", "entities": [)"
         R"({"name": "dog", "paths": ["dog -hypernym-> canine", "dog -part-> tail"]},)"
         R"({"name": "cat", "paths": ["cat -hypernym-> feline"]}]})"
      << "\n"
      << R"({"id": "b", "question": "What is an owl?", "entities": [)"
         R"({"name": "owl", "paths": ["owl -hypernym-> bird of prey", "owl -eats-> mice and voles"]}]})"
      << "\n"
      << R"({"id": "c", "question": "What is a fish?", "entities": [)"
         R"({"name": "fish", "paths": ["fish -hypernym-> aquatic vertebrate", "fish -has-> fins and gills"]}]})"
      << "\n"
      << R"({"id": "d", "question": "Dogs and cats?", "entities": [)"
         R"({"name": "dog", "paths": ["dog -hypernym-> canine", "dog -part-> tail"]},)"
         R"({"name": "cat", "paths": ["cat -hypernym-> feline"]}]})"
      << "\n";
  const std::string base =
      "run -m " + file("model.gguf") + " --requests " + file("tiers.jsonl") +
      " -s depcache --scheme depth --kv-type f32 --verify --cache-mib 0.05 --host-mib 1 -n 4 ";
  auto r = run_cli(base + "--serial --json " + file("host.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tiers: matched tokens"), std::string::npos) << r.out;
  auto rows = read_rows(file("host.jsonl"));
  EXPECT_GT(rows["d"]["found_in"]["host"].get<int64_t>(), 0)
      << "d's subtrees were expected in the host tier\n"
      << r.out;
  for (const auto& [id, row] : rows) EXPECT_LT(row["max_logit_diff_vs_no_reuse"].get<double>(), 1e-4) << id;

  // All four arrive at once and are admitted one per step (--batch-tokens 1):
  // while a step computes, the next two waiting requests' spans are loaded;
  // d's come back from the host tier while c is computed.
  r = run_cli(base + "--batch-tokens 1 --prefetch 2 --policy lacr --json " + file("prefetch.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto at = r.out.find("prefetched ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_GT(std::stoll(r.out.substr(at + 11)), 0) << "the prefetcher promoted nothing\n" << r.out;
  rows = read_rows(file("prefetch.jsonl"));
  EXPECT_GT(rows["d"]["reused_tokens"].get<int64_t>(), 0) << r.out;
  for (const auto& [id, row] : rows) EXPECT_LT(row["max_logit_diff_vs_no_reuse"].get<double>(), 1e-4) << id;
}

// Open-loop replay: requests that arrive together are batched (their
// answers are those of one at a time), Poisson arrivals at --rate are
// replayed in time, and latencies count from arrival.
TEST_F(RunCli, OpenLoopReplay) {
  const std::string base = "run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                           " -s full,depcache --scheme depth --kv-type f32 -n 5 ";
  auto r = run_cli(base + "--serial --json " + file("serial.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::map<std::string, nlohmann::json> serial;
  {
    std::ifstream in(file("serial.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      serial[j["strategy"].get<std::string>() + "/" + j["id"].get<std::string>()] = j;
    }
  }
  for (const char* extra : {"", "--rate 200 --seed 3 ", "--batch-tokens 1 "}) {
    r = run_cli(base + extra + "--json " + file("open.jsonl"));
    ASSERT_EQ(r.code, 0) << extra << "\n" << r.out;
    EXPECT_NE(r.out.find("e2e p50"), std::string::npos) << r.out;
    std::ifstream in(file("open.jsonl"));
    int rows = 0;
    for (std::string line; std::getline(in, line); ++rows) {
      const auto j = nlohmann::json::parse(line);
      const std::string key = j["strategy"].get<std::string>() + "/" + j["id"].get<std::string>();
      if (j["strategy"] == "full") {
        EXPECT_EQ(j["output"], serial[key]["output"]) << extra << key;
      }
      EXPECT_GT(j["ttft_ms"].get<double>(), 0.0) << key;
      EXPECT_GE(j["total_ms"].get<double>(), j["ttft_ms"].get<double>()) << key;
    }
    EXPECT_EQ(rows, 6) << extra;
  }
  EXPECT_EQ(run_cli(base + "--rate-scale 0").code, 2);
  EXPECT_EQ(run_cli(base + "--batch-tokens 0").code, 2);
}

// --sweep-rate: per strategy the unloaded TTFT, the SLO, the curve and the
// highest rate within it, as Markdown and a PNG (gnuplot is installed by
// the setup script).
TEST_F(RunCli, SweepRate) {
  const std::string report = file("sweep.md");
  const auto r = run_cli("run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                         " -s full,depcache -n 2 -q --sweep-rate --slo-ms 50 --report " + report);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"highest rate within it", "| full |", "| depcache |", "within SLO"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_TRUE(std::filesystem::exists(report));
  EXPECT_TRUE(std::filesystem::exists(file("sweep.png"))) << r.out;
  EXPECT_EQ(run_cli("run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                    " --sweep-rate --slo-ms -1")
                .code,
            2);
}

// Fidelity to full attention: `full` against itself is perfect; depcache
// under the depth scheme (paths of a tree share positions, the flat prompt
// does not) is measurably not, on the same requests.
TEST_F(RunCli, FidelityAgainstFullAttention) {
  const auto r = run_cli("run --serial -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                         " -s full,depcache --scheme depth --fidelity -n 6 --json " + file("fidelity.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* s : {"1st token", "KL mean", "identical", "ROUGE-L", "fidelity, against full attention"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  std::ifstream in(file("fidelity.jsonl"));
  int full_rows = 0;
  double depcache_kl = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    const auto& f = j["fidelity"];
    if (j["strategy"] == "full") {
      ++full_rows;
      EXPECT_TRUE(f["first_token_agrees"].get<bool>()) << line;
      EXPECT_TRUE(f["identical_continuation"].get<bool>()) << line;
      EXPECT_EQ(f["kl_first_token"].get<double>(), 0.0) << line;  // one at a time: the same arithmetic
      EXPECT_EQ(f["rouge_l"].get<double>(), 1.0) << line;
    } else if (j["id"] != "c") {  // requests with multi-path trees
      depcache_kl += f["kl_first_token"].get<double>();
    }
  }
  EXPECT_EQ(full_rows, 3);
  EXPECT_GT(depcache_kl, 1e-7) << "dependency attention under the depth scheme changed nothing?\n" << r.out;
}

// A model that says which position scheme it was trained for gets that
// scheme by default; without the key the default applies; --scheme wins.
TEST_F(RunCli, PositionSchemeFromTheModelsMetadata) {
  const std::string marked = file("marked.gguf");
  ASSERT_EQ(run_cli("model new --preset tiny --position-scheme depth -o " + marked).code, 0);
  auto r = run_cli("model info " + marked);
  EXPECT_NE(r.out.find("depcache.position_scheme"), std::string::npos) << r.out;
  const std::string rest = " --requests " + file("requests.jsonl") + " -s depcache -q";
  r = run_cli("run -m " + marked + rest);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("positions depth (the model's metadata)"), std::string::npos) << r.out;
  r = run_cli("run -m " + file("model.gguf") + rest);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("positions sequential (default)"), std::string::npos) << r.out;
  r = run_cli("run -m " + marked + rest + " --scheme stacked");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("positions stacked (--scheme)"), std::string::npos) << r.out;
  EXPECT_NE(run_cli("model new --preset tiny --position-scheme diagonal -o " + marked).code, 0);
}

// Likewise what context trees see: a model trained with trees alone is
// served so; --tree-context wins; other strategies never change.
TEST_F(RunCli, TreeContextFromTheModelsMetadata) {
  const std::string alone = file("alone.gguf");
  ASSERT_EQ(run_cli("model new --preset tiny --seed 3 --tree-context none -o " + alone).code, 0);
  EXPECT_NE(run_cli("model info " + alone).out.find("depcache.tree_context"), std::string::npos);
  // Each request's divergence from full attention: what trees saw shows in it.
  const auto served = [&](const std::string& model, const std::string& options) {
    const auto r = run_cli("run -m " + model + " --requests " + file("requests.jsonl") +
                           " -s depcache -q -n 2 --fidelity --json " + file("tc.jsonl") + options);
    EXPECT_EQ(r.code, 0) << r.out;
    std::vector<double> kl;
    std::ifstream rows(file("tc.jsonl"));
    for (std::string line; std::getline(rows, line);)
      kl.push_back(nlohmann::json::parse(line)["fidelity"]["kl_first_token"].get<double>());
    return std::pair{r.out, kl};
  };
  const auto [by_metadata, kl_alone] = served(alone, "");
  EXPECT_NE(by_metadata.find("trees see only themselves (the model's metadata)"), std::string::npos)
      << by_metadata;
  const auto [by_option, kl_system] = served(alone, " --tree-context system");
  EXPECT_EQ(by_option.find("trees see only themselves"), std::string::npos) << by_option;
  EXPECT_NE(kl_alone, kl_system) << "what trees see changed no answer";
  // The same weights without the key, told by the option: served as the marked model.
  const auto [told, kl_told] = served(file("model.gguf"), " --tree-context none");
  EXPECT_NE(told.find("trees see only themselves (--tree-context)"), std::string::npos) << told;
  EXPECT_EQ(kl_told, kl_alone);
  const auto full = run_cli("run -m " + alone + " --requests " + file("requests.jsonl") + " -s full -q -n 2");
  EXPECT_EQ(full.out.find("trees see only themselves"), std::string::npos) << full.out;
  EXPECT_NE(run_cli("model new --preset tiny --tree-context some -o " + alone).code, 0);
  EXPECT_NE(
      run_cli("run -m " + alone + " --requests " + file("requests.jsonl") + " --tree-context some").code, 0);
}

// Model B is model A with one weight changed in the middle of a matrix: it
// must not reuse A's spans from a shared cache directory.
TEST_F(RunCli, ModelsThatDifferInOneWeightShareNoCachedKv) {
  const std::string dir = file("kv-two-models"), a = file("model-a.gguf"), b = file("model-b.gguf");
  ASSERT_EQ(run_cli("model new --preset tiny --type f32 --seed 5 -o " + a).code, 0);
  std::filesystem::copy_file(a, b);
  test::set_f32_weight(b, "blk.0.ffn_gate.weight", 5000, 0.5f);
  const std::string rest =
      " --requests " + file("requests.jsonl") + " -s depcache --kv-type f32 --cache-dir " + dir;
  auto r = run_cli("run -m " + a + rest);
  ASSERT_EQ(r.code, 0) << r.out;
  r = run_cli("run -m " + b + rest + " --json " + file("model-b.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const auto& [id, row] : read_rows(file("model-b.jsonl")))
    EXPECT_EQ(row["found_in"]["disk"].get<int64_t>(), 0) << id << ": model A's K/V served to model B";
  r = run_cli("run -m " + a + rest + " --json " + file("model-a.jsonl"));  // A still finds its own
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_GT(read_rows(file("model-a.jsonl"))["a"]["found_in"]["disk"].get<int64_t>(), 0) << r.out;
}

// NaN weights: --verify reports an infinite difference (never 0), the JSON
// rows say the logits were not finite, and the run ends with exit code 3.
TEST_F(RunCli, NonFiniteLogitsAreReportedAndFail) {
  const std::string nan_model = file("nan.gguf");
  ASSERT_EQ(run_cli("model new --preset tiny --type f32 --seed 3 -o " + nan_model).code, 0);
  test::set_f32_weight(nan_model, "blk.0.attn_q.weight", 100, std::numeric_limits<float>::quiet_NaN());
  const auto r = run_cli("run -m " + nan_model + " --requests " + file("requests.jsonl") +
                         " -s full,depcache --verify -n 2 --json " + file("nan.jsonl"));
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("non-finite logits"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("inf"), std::string::npos) << "the summary's max |dlogit|\n" << r.out;
  std::ifstream in(file("nan.jsonl"));
  int rows = 0;
  for (std::string line; std::getline(in, line); ++rows) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_FALSE(j["logits_finite"].get<bool>()) << line;
    EXPECT_TRUE(j["max_logit_diff_vs_no_reuse"].is_null()) << line;
    EXPECT_FALSE(j["top1_agrees_with_no_reuse"].get<bool>()) << line;
  }
  EXPECT_EQ(rows, 6);
}

// What the cache could not keep is said, not hidden: spans larger than the
// hot tier, and prompts beyond the model's trained context.
TEST_F(RunCli, WhatCouldNotBeCachedIsReported) {
  auto r = run_cli("run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                   " -s depcache --cache-mib 0.001 --json " + file("oversized.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("spans were not cached"), std::string::npos) << r.out;
  int64_t oversized = 0;
  for (const auto& [id, row] : read_rows(file("oversized.jsonl")))
    oversized += row["oversized_spans"].get<int64_t>();
  EXPECT_GT(oversized, 0);

  const std::string short_model = file("short.gguf");
  ASSERT_EQ(run_cli("model new --preset tiny --ctx 32 -o " + short_model).code, 0);
  r = run_cli("run -m " + short_model + " --requests " + file("requests.jsonl") + " -q");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("more than the 32 the model was trained on"), std::string::npos) << r.out;
}

// A KV assembly larger than memory (or than size_t can count) is a clear
// limit error with exit code 5, not an internal error.
TEST_F(RunCli, KvAllocationFailureIsALimitError) {
  for (const char* rows : {"3000000000000", "9000000000000000000"}) {  // beyond any address space
    const auto r = run_cli("run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
                           " -s full -c " + rows);
    EXPECT_EQ(r.code, 5) << r.out;
    EXPECT_NE(r.out.find("cannot allocate"), std::string::npos) << r.out;
  }
}

// SubGCache as a batch mode of run: with a cluster per query every query
// sees exactly its own subgraph, so its answer is full attention's on the
// per-query prompt (the prefix reuse is exact); with one cluster per batch
// the representative is computed once per batch and the queries compute
// little more than their questions.
TEST_F(RunCli, SubgcacheServesQueryBatchesByCluster) {
  ASSERT_EQ(run_cli("kg import --synthetic --entities 12 --relations 4 --facts-per-entity 2 --seed 2 -o " +
                    file("sg.dkg"))
                .code,
            0);
  const auto g =
      run_cli("workload generate --kg " + file("sg.dkg") +
              " --pattern zipf --requests 8 --qa-items 20 --entities-per-request 1 --paths-per-entity 3 "
              "--min-paths 1 --hops 2 --question-hops 1 --seed 3 --out " +
              file("sg.jsonl"));
  ASSERT_EQ(g.code, 0) << g.out;
  const auto rows_of = [](const std::string& path) {
    std::map<std::string, std::vector<nlohmann::json>> by_strategy;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      by_strategy[j["strategy"].get<std::string>()].push_back(j);
    }
    return by_strategy;
  };
  const std::string base = "run --serial -m " + file("model.gguf") + " --requests " + file("sg.jsonl") +
                           " -s full,subgcache -n 3 --fidelity --query-batch 4 --json ";
  auto r = run_cli(base + file("sg-own.jsonl") + " --clusters 4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("subgcache: 8 queries in 2 batches of up to 4, 8 clusters"), std::string::npos)
      << r.out;
  auto rows = rows_of(file("sg-own.jsonl"));
  ASSERT_EQ(rows["subgcache"].size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    const auto& sg = rows["subgcache"][i];
    EXPECT_EQ(sg["id"], rows["full"][i]["id"]) << "rows in the stream's order";
    EXPECT_EQ(sg["prompt_tokens"], rows["full"][i]["prompt_tokens"]) << "its own subgraph, as CSV";
    EXPECT_TRUE(sg["fidelity"]["identical_continuation"].get<bool>()) << sg.dump();
    EXPECT_LT(sg["fidelity"]["kl_first_token"].get<double>(), 1e-6) << sg.dump();
  }
  r = run_cli(base + file("sg-one.jsonl") + " --clusters 1 --linkage average --subgraph-embedding text");
  ASSERT_EQ(r.code, 0) << r.out;
  rows = rows_of(file("sg-one.jsonl"));
  int64_t computed = 0, full_computed = 0;
  for (size_t i = 0; i < 8; ++i) {
    computed += rows["subgcache"][i]["computed_tokens"].get<int64_t>();
    full_computed += rows["full"][i]["computed_tokens"].get<int64_t>();
    EXPECT_GE(rows["subgcache"][i]["prompt_tokens"].get<int64_t>(),
              rows["full"][i]["prompt_tokens"].get<int64_t>())
        << "the union holds every member's subgraph";
  }
  EXPECT_LT(computed, full_computed);

  // Two clusters per batch: served cluster by cluster, reported in the stream's order.
  r = run_cli(base + file("sg-two.jsonl") + " --clusters 2");
  ASSERT_EQ(r.code, 0) << r.out;
  rows = rows_of(file("sg-two.jsonl"));
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(rows["subgcache"][i]["id"], rows["full"][i]["id"]);

  // The warm-up takes the measured stream's form: warmed with the same
  // requests, prefix finds each whole CSV prompt but its question's last tokens.
  r = run_cli("run --serial -m " + file("model.gguf") + " --requests " + file("sg.jsonl") +
              " -s prefix,subgcache -n 1 --warmup " + file("sg.jsonl") + " --json " + file("sg-warm.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  rows = rows_of(file("sg-warm.jsonl"));
  ASSERT_EQ(rows["prefix"].size(), 8u);
  for (const auto& row : rows["prefix"])
    EXPECT_GE(row["reused_tokens"].get<int64_t>(), row["prompt_tokens"].get<int64_t>() - 1) << row.dump();

  // --graph-format: csv without subgcache gives full the same CSV prompts;
  // paths beside subgcache keeps the path form for the others.
  r = run_cli("run --serial -m " + file("model.gguf") + " --requests " + file("sg.jsonl") +
              " -s full --graph-format csv -n 1 --json " + file("sg-csv.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  rows = rows_of(file("sg-own.jsonl"));  // full on the CSV prompts beside subgcache
  const auto csv_rows = rows_of(file("sg-csv.jsonl"));
  for (size_t i = 0; i < 8; ++i)
    EXPECT_EQ(csv_rows.at("full").at(i)["prompt_tokens"], rows.at("full").at(i)["prompt_tokens"]);
  r = run_cli("run --serial -m " + file("model.gguf") + " --requests " + file("sg.jsonl") +
              " -s full --graph-format paths -n 1 --json " + file("sg-paths.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto path_rows = rows_of(file("sg-paths.jsonl"));
  int differ = 0;
  for (size_t i = 0; i < 8; ++i)
    differ += path_rows.at("full").at(i)["prompt_tokens"] != rows.at("full").at(i)["prompt_tokens"];
  EXPECT_GT(differ, 0) << "the path form is another prompt";
  r = run_cli("run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") +
              " -s full --graph-format csv");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("has no entities"), std::string::npos) << r.out;
  EXPECT_EQ(run_cli(base + file("x.jsonl") + " --graph-format tree").code, 2);

  EXPECT_EQ(run_cli(base + file("x.jsonl") + " --linkage median").code, 2);
  EXPECT_EQ(run_cli(base + file("x.jsonl") + " --clusters 0").code, 2);
  // Documents are not a subgraph: a clear error.
  r = run_cli("run -m " + file("model.gguf") + " --requests " + file("requests.jsonl") + " -s subgcache");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("SubGCache clusters GraphRAG subgraphs"), std::string::npos) << r.out;
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
  EXPECT_EQ(r.code, 2) << r.out;  // a malformed option value: a usage error
  EXPECT_NE(r.out.find("bad Redis address"), std::string::npos) << r.out;
  std::ofstream(file("bad.jsonl")) << "{\"question\": 1}\n";
  r = run_cli("run -m " + file("model.gguf") + " --requests " + file("bad.jsonl"));
  EXPECT_EQ(r.code, 3) << r.out;
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

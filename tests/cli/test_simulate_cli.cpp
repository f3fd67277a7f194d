// `depcache simulate` as a user runs it: a trace file replayed under several
// policies, JSON output, and errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::run_cli;

TEST(SimulateCli, ReplaysATraceUnderEveryPolicy) {
  const auto dir = test::temp_path("simulate-cli");
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "trace.jsonl");
    for (int i = 0; i < 40; ++i)
      f << R"({"question": "q", "entities": [{"name": "e)" << i % 5 << R"(", "paths": ["e)" << i % 5
        << R"( -r-> x", "e)" << i % 5 << R"( -s-> y"]}, {"name": "f)" << i % 3 << R"(", "paths": ["f)"
        << i % 3 << R"( -r-> z"]}]})"
        << "\n";
  }
  const std::string trace = (dir / "trace.jsonl").string();
  const std::string model = (dir / "model.gguf").string();
  ASSERT_EQ(run_cli("model new --preset tiny --seed 3 -o " + model).code, 0);
  auto r = run_cli(
      "simulate --requests " + trace + " --cost-model " + model +
      " --capacity 50% --json --policy lru,lfu,gdsf,pgdsf,lacr,cachecraft,lpm,lsp,lacr+lpm,lacr+ragcache");
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream lines(r.out);
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;  // the cost table, on stderr
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["requests"], 40);
    EXPECT_GT(j["token_hit_rate"].get<double>(), 0.0);
    EXPECT_LE(j["token_hit_rate"].get<double>(), 1.0);
    ++n;
  }
  EXPECT_EQ(n, 10);
  // PGDSF ranks by the profiled table: without one it is a usage error.
  r = run_cli("simulate --requests " + trace + " --policy pgdsf");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--cost-model"), std::string::npos) << r.out;

  // RAGCache's knowledge tree: documents hit whole; a host tier below a
  // small hot tier finds more of them than the hot tier alone.
  const auto document_hits = [&](const std::string& extra) {
    const auto res =
        run_cli("simulate --requests " + trace + " --strategy ragcache --capacity 30% --json" + extra);
    EXPECT_EQ(res.code, 0) << res.out;
    return res.code == 0 ? nlohmann::json::parse(res.out)["item_hit_rate"].get<double>() : -1.0;
  };
  const double hot_only = document_hits(""), with_host = document_hits(" --host-capacity 70%");
  EXPECT_GE(hot_only, 0.0);
  EXPECT_GT(with_host, hot_only);
  EXPECT_LE(with_host, 1.0);
  r = run_cli("simulate --requests " + trace + " --capacity 100%");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("capacity"), std::string::npos) << r.out;

  EXPECT_EQ(run_cli("simulate --help").code, 0);
  r = run_cli("simulate --requests " + trace + " --policy mru");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("unknown replacement policy 'mru'"), std::string::npos) << r.out;
  EXPECT_EQ(run_cli("simulate --requests " + trace + " --capacity lots").code, 3);
  EXPECT_EQ(run_cli("simulate --requests " + (dir / "missing.jsonl").string()).code, 4);
  // The schedulers' starvation bound: a bound of one pass leaves lpm next to
  // arrival order; without one it reorders the window by what is cached.
  const auto lpm_hit_rate = [&](const std::string& bound) {
    const auto res =
        run_cli("simulate --requests " + trace + " --capacity 20% --json --policy lru+lpm --window 8" +
                " --starvation-bound " + bound);
    EXPECT_EQ(res.code, 0) << res.out;
    return res.code == 0 ? nlohmann::json::parse(res.out)["token_hit_rate"].get<double>() : -1.0;
  };
  EXPECT_NE(lpm_hit_rate("1"), lpm_hit_rate("1000000"));
  EXPECT_EQ(run_cli("simulate --requests " + trace + " --starvation-bound 0").code, 2);
  EXPECT_EQ(run_cli("simulate").code, 2);
  EXPECT_EQ(run_cli("simulate --grid").code, 2);  // needs --kg
  std::filesystem::remove_all(dir);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

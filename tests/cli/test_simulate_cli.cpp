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
namespace {

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
  auto r = run_cli(
      "simulate --requests " + trace +
      " --capacity 50% --json --policy lru,lfu,gdsf,pgdsf,lacr,cachecraft,lpm,lsp,lacr+lpm,lacr+ragcache");
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream lines(r.out);
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["requests"], 40);
    EXPECT_GT(j["token_hit_rate"].get<double>(), 0.0);
    EXPECT_LE(j["token_hit_rate"].get<double>(), 1.0);
    ++n;
  }
  EXPECT_EQ(n, 10);
  r = run_cli("simulate --requests " + trace + " --capacity 100%");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("capacity"), std::string::npos) << r.out;

  EXPECT_EQ(run_cli("simulate --help").code, 0);
  r = run_cli("simulate --requests " + trace + " --policy mru");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("unknown replacement policy 'mru'"), std::string::npos) << r.out;
  EXPECT_EQ(run_cli("simulate --requests " + trace + " --capacity lots").code, 3);
  EXPECT_EQ(run_cli("simulate --requests " + (dir / "missing.jsonl").string()).code, 4);
  EXPECT_EQ(run_cli("simulate").code, 2);
  EXPECT_EQ(run_cli("simulate --grid").code, 2);  // needs --kg
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace depcache

// `depcache kg`: help, import of a triples file, stats, exit codes.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using KgRun = test::CliRun;
KgRun run_kg(const std::string& args) { return test::run_cli("kg " + args); }

class KgCli : public ::testing::Test {
 protected:
  void SetUp() override {
    triples_ = test::temp_path("kg-cli") += ".tsv";
    kg_ = test::temp_path("kg-cli") += ".dkg";
    std::ofstream(triples_) << "# tiny graph\n"
                               "a\tr1\tb\n"
                               "b\tr1\tc\n"
                               "c\tr2\ta\n"
                               "c\tr2\tc\n"
                               "a\t@alias\talpha\n";
  }
  void TearDown() override {
    std::filesystem::remove(triples_);
    std::filesystem::remove(kg_);
  }
  std::filesystem::path triples_, kg_;
};

TEST_F(KgCli, EverySubcommandHasHelp) {
  for (const char* sub : {"", "import", "stats"}) {
    const KgRun r = run_kg(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub << ": " << r.out;
    EXPECT_NE(r.out.find("--help"), std::string::npos) << sub;
  }
  EXPECT_NE(run_kg("import --help").out.find("--triples"), std::string::npos);
}

TEST_F(KgCli, ImportThenStats) {
  const KgRun imp = run_kg("import --triples " + triples_.string() + " --out " + kg_.string());
  ASSERT_EQ(imp.code, 0) << imp.out;
  EXPECT_NE(imp.out.find("entities:  3"), std::string::npos) << imp.out;
  EXPECT_NE(imp.out.find("triples:   4"), std::string::npos) << imp.out;
  EXPECT_NE(imp.out.find(kg_.string()), std::string::npos) << imp.out;

  const KgRun stats = run_kg("stats --kg " + kg_.string());
  ASSERT_EQ(stats.code, 0) << stats.out;
  EXPECT_NE(stats.out.find("entities:   3"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("relations:  2"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("triples:    4"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("aliases:    1"), std::string::npos) << stats.out;
  EXPECT_NE(stats.out.find("self-loops: 1"), std::string::npos) << stats.out;

  const KgRun json = run_kg("stats --json --top 1 --kg " + kg_.string());
  ASSERT_EQ(json.code, 0) << json.out;
  EXPECT_NE(json.out.find("\"triples\":4"), std::string::npos) << json.out;
  EXPECT_NE(json.out.find("\"relations_by_triples\":[{\"relation\":\"r1\",\"triples\":2}]"),
            std::string::npos)
      << json.out;
}

TEST_F(KgCli, ExitCodes) {
  EXPECT_EQ(run_kg("").code, 2) << "kg needs a subcommand";
  EXPECT_EQ(run_kg("import --out " + kg_.string()).code, 2) << "no source";
  EXPECT_EQ(run_kg("import --wordnet --triples " + triples_.string() + " --out " + kg_.string()).code, 2);
  EXPECT_EQ(run_kg("import --triples " + triples_.string()).code, 2) << "no --out";
  EXPECT_EQ(run_kg("import --triples " + triples_.string() + " --format xml --out " + kg_.string()).code, 2);
  EXPECT_EQ(run_kg("stats").code, 2);

  EXPECT_EQ(run_kg("stats --kg /nonexistent.dkg").code, 4);
  EXPECT_EQ(run_kg("import --triples /nonexistent.tsv --out " + kg_.string()).code, 4);
  EXPECT_EQ(run_kg("import --wordnet --wordnet-dir /nonexistent --out " + kg_.string()).code, 4);

  std::ofstream(kg_) << "DKG1 but then nothing useful";
  const KgRun corrupt = run_kg("stats --kg " + kg_.string());
  EXPECT_EQ(corrupt.code, 3) << corrupt.out;
  EXPECT_NE(corrupt.out.find(kg_.string()), std::string::npos) << corrupt.out;
  std::ofstream(triples_) << "a\tr\n";
  const KgRun bad = run_kg("import --triples " + triples_.string() + " --out " + kg_.string());
  EXPECT_EQ(bad.code, 3) << bad.out;
  EXPECT_NE(bad.out.find(":1:"), std::string::npos) << bad.out;
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

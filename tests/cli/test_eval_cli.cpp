// `depcache eval --quick` as a user runs it: every section of the report is
// there, every figure in it is finite, every plot is a PNG; bad options are
// refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

namespace depcache {
namespace {

using test::run_cli;

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Section {
  const char* name;   // --sections
  const char* title;  // its heading
  std::vector<const char*> plots;
};

const std::vector<Section> kSections = {
    {"depcache-length",
     "DepCache: TTFT and throughput against prompt length",
     {"depcache-ttft", "depcache-throughput"}},
    {"depcache-policies", "DepCache: replacement policies", {"depcache-policies"}},
    {"depcache-accuracy",
     "DepCache: answers under self-attention and dependency attention",
     {"depcache-accuracy"}},
    {"ragcache-policies", "RAGCache: document hit rate by policy and capacity", {"ragcache-policies"}},
    {"ragcache-ttft", "RAGCache: TTFT under load", {}},
    {"ragcache-speculation", "RAGCache: speculative pipelining", {}},
    {"subgcache", "SubGCache: clusters of queries", {"subgcache-csv", "subgcache"}},
    {"chunk-quality", "Chunk reuse: quality against recomputation", {"chunk-quality"}},
    {"throughput", "Throughput within an SLO", {}},
    {"engine", "The engine: prompt and generation speed", {}},
};

TEST(EvalCli, QuickReportHasEverySectionFiniteFiguresAndPlots) {
  const auto dir = test::temp_path("eval-cli");
  // Under a sanitizer the sections that run the shipped QA models (seconds
  // in a Release build); the Release build runs them all.
#ifdef DEPCACHE_SANITIZED
  const std::string only = " --sections depcache-accuracy,subgcache,chunk-quality";
#else
  const std::string only;
#endif
  const auto r = run_cli("eval --quick -t 2 --out " + dir.string() + " --models " + DEPCACHE_MODELS_DIR +
                         " --data " + (test::shared_dir() / "data").string() + only + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out.substr(r.out.size() > 4000 ? r.out.size() - 4000 : 0);
  const std::string md = read_all(dir / "report.md");
  EXPECT_NE(md.find("- commit: "), std::string::npos);
  EXPECT_NE(md.find("- CPU: "), std::string::npos);
  EXPECT_NE(md.find("- command: `depcache eval --quick"), std::string::npos);
  size_t ran = 0;
  for (const Section& s : kSections) {
    if (!only.empty() && only.find(s.name) == std::string::npos) continue;
    ++ran;
    SCOPED_TRACE(s.name);
    const size_t at = md.find(std::string("\n## ") + s.title);
    ASSERT_NE(at, std::string::npos);
    // The section runs to the next heading: what a later section holds is not its.
    const std::string section = md.substr(at, md.find("\n## ", at + 1) - at);
    // Each section has a table of figures; the paper's sections say what the paper reports.
    EXPECT_NE(section.find("|---|"), std::string::npos) << section;
    if (std::string(s.name) != "engine") {
      EXPECT_NE(section.find("Against the paper:"), std::string::npos) << section;
    }
    for (const char* plot : s.plots) {
      std::ifstream png(dir / (std::string(plot) + ".png"), std::ios::binary);
      char magic[4] = {};
      png.read(magic, 4);
      EXPECT_EQ(std::string(magic + 1, 3), "PNG") << plot;
      EXPECT_NE(section.find(std::string("](") + plot + ".png)"), std::string::npos) << plot;
    }
  }
  EXPECT_GT(ran, 0u);
  // SubGCache is measured in its own form too: subgraphs as CSV, read by the CSV model.
  EXPECT_NE(md.find("read by `depcache-qa-csv.gguf`"), std::string::npos) << md;
  EXPECT_FALSE(std::regex_search(md, std::regex(R"(\b(NaN|nan|inf|Inf)\b)"))) << md;
  std::filesystem::remove_all(dir);
}

TEST(EvalCli, BadOptionsAreRefusedByName) {
  const auto dir = test::temp_path("eval-cli-bad");
  auto r = run_cli("eval --quick --out " + dir.string() + " --sections depcache-length,nosuch 2>&1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("unknown section 'nosuch'"), std::string::npos) << r.out;
  r = run_cli("eval --quick --out " + dir.string() + " --models " + dir.string() + "/none 2>&1");
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("depcache-qa.gguf"), std::string::npos) << r.out;
  r = run_cli("eval --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--quick"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace depcache

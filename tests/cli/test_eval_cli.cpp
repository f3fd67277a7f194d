// `depcache eval --quick` as a user runs it: every section of the report is
// there, every figure in it is finite, every plot is a PNG; bad options are
// refused by name.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "model/model_writer.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

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

// `eval --quick --sections <names>` into a folder of its own: the report's
// text, or the process's output if it failed.
struct QuickRun {
  std::filesystem::path dir;
  test::CliRun r;
  std::string md;
};

QuickRun run_quick(const std::string& sections, const std::string& label, const std::string& more = "") {
  QuickRun q;
  q.dir = test::temp_path("eval-cli-" + label);
  q.r =
      run_cli("eval --quick -t 2 --out " + q.dir.string() + " --models " + DEPCACHE_MODELS_DIR + " --data " +
              (test::shared_dir() / "data").string() + " --sections " + sections + more + " 2>&1");
  q.md = read_all(q.dir / "report.md");
  return q;
}

// One section's checks on a report: its heading, a table of figures, what
// the paper reports (but the engine's own section), each plot a PNG linked
// from the section, and nothing of the next section counted as its.
void expect_section(const QuickRun& q, const Section& s) {
  SCOPED_TRACE(s.name);
  const std::string& md = q.md;
  const size_t at = md.find(std::string("\n## ") + s.title);
  ASSERT_NE(at, std::string::npos) << md;
  const std::string section = md.substr(at, md.find("\n## ", at + 1) - at);
  EXPECT_NE(section.find("|---|"), std::string::npos) << section;
  if (std::string(s.name) != "engine") {
    EXPECT_NE(section.find("Against the paper:"), std::string::npos) << section;
  }
  for (const char* plot : s.plots) {
    std::ifstream png(q.dir / (std::string(plot) + ".png"), std::ios::binary);
    char magic[4] = {};
    png.read(magic, 4);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG") << plot;
    EXPECT_NE(section.find(std::string("](") + plot + ".png)"), std::string::npos) << plot;
  }
}

// What every report has, whatever its sections: where it was measured, the
// command, and no figure that is not finite.
void expect_header_and_finite(const QuickRun& q) {
  EXPECT_NE(q.md.find("- commit: "), std::string::npos);
  EXPECT_NE(q.md.find("- CPU: "), std::string::npos);
  EXPECT_NE(q.md.find("- command: `depcache eval --quick"), std::string::npos);
  EXPECT_FALSE(std::regex_search(q.md, std::regex(R"(\b(NaN|nan|inf|Inf)\b)"))) << q.md;
}

// Each section alone, one test each, so that ctest spreads them over its
// slots. Under a sanitizer, the sections that run the shipped QA models
// (seconds in a Release build); the Release build runs them all.
std::vector<Section> quick_sections() {
  std::vector<Section> out;
  for (const Section& s : kSections) {
#ifdef DEPCACHE_SANITIZED
    const std::string name = s.name;
    if (name != "depcache-accuracy" && name != "subgcache" && name != "chunk-quality") continue;
#endif
    out.push_back(s);
  }
  return out;
}

// ctest lists a parameter by what this prints.
void PrintTo(const Section& s, std::ostream* os) { *os << s.name; }

class EvalQuickSection : public testing::TestWithParam<Section> {};

TEST_P(EvalQuickSection, HasItsTableFiniteFiguresAndPlots) {
  const Section& s = GetParam();
  const QuickRun q = run_quick(s.name, s.name);
  ASSERT_EQ(q.r.code, 0) << q.r.out.substr(q.r.out.size() > 4000 ? q.r.out.size() - 4000 : 0);
  expect_header_and_finite(q);
  expect_section(q, s);
  if (std::string(s.name) == "ragcache-ttft") {
    // Below the working set the hot tier binds: prefix caching with 5% of the
    // documents' KV computes more per request than with room for everything.
    const std::regex roomy(R"(\| prefix caching \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| ([0-9]+) \|)");
    const std::regex tight(
        R"(\| 5% \| prefix caching \(LRU, hot tier only\) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| ([0-9]+) \|)");
    std::smatch a, b;
    ASSERT_TRUE(std::regex_search(q.md, a, roomy)) << q.md;
    ASSERT_TRUE(std::regex_search(q.md, b, tight)) << q.md;
    EXPECT_GT(std::stod(b[1]), std::stod(a[1])) << q.md;
    EXPECT_NE(q.md.find("| mean TTFT vs prefix caching (SGLang) |"), std::string::npos) << q.md;
  }
  if (std::string(s.name) == "subgcache") {
    // SubGCache is measured in its own form too: subgraphs as CSV, read by the CSV model.
    EXPECT_NE(q.md.find("read by `depcache-qa-csv.gguf`"), std::string::npos) << q.md;
  }
  std::filesystem::remove_all(q.dir);
}

INSTANTIATE_TEST_SUITE_P(EvalCli, EvalQuickSection, testing::ValuesIn(quick_sections()),
                         [](const testing::TestParamInfo<Section>& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Several sections in one report, in the order given: each finds its own
// heading and stops at the next (two quick sections, seconds under a
// sanitizer too).
TEST(EvalCli, SectionsTogetherKeepTheirOwnFigures) {
  const QuickRun q = run_quick("engine,ragcache-policies", "together");
  ASSERT_EQ(q.r.code, 0) << q.r.out.substr(q.r.out.size() > 4000 ? q.r.out.size() - 4000 : 0);
  expect_header_and_finite(q);
  for (const Section& s : kSections) {
    const std::string name = s.name;
    if (name == "engine" || name == "ragcache-policies") {
      expect_section(q, s);
    } else {
      EXPECT_EQ(q.md.find(std::string("\n## ") + s.title), std::string::npos) << name;
    }
  }
  std::filesystem::remove_all(q.dir);
}

// A preset's shape as the speed model: made in --work under its name, its
// quantized copies beside it, named in the header and the command.
TEST(EvalCli, SpeedModelOfAPresetShape) {
  const auto work = test::temp_path("eval-cli-preset-work");
  const QuickRun q = run_quick("engine", "preset", " --speed-model tiny-qwen2 --work " + work.string());
  ASSERT_EQ(q.r.code, 0) << q.r.out.substr(q.r.out.size() > 4000 ? q.r.out.size() - 4000 : 0);
  expect_header_and_finite(q);
  expect_section(q, kSections.back());
  EXPECT_NE(q.md.find("--speed-model tiny-qwen2 --sections engine`"), std::string::npos) << q.md;
  const auto model = work / "speed-tiny-qwen2-f16.gguf";
  const auto shape = model_preset("tiny-qwen2");
  ASSERT_TRUE(shape);
  EXPECT_NE(q.md.find(fmt::format("- speed model: `{}` (random weights, {} layers, {} wide", model.string(),
                                  shape->n_layer, shape->n_embd)),
            std::string::npos)
      << q.md;
  EXPECT_TRUE(std::filesystem::exists(work / "speed-tiny-qwen2-Q8_0.gguf"));
  EXPECT_FALSE(std::filesystem::exists(work / "speed-f16.gguf"));
  std::filesystem::remove_all(q.dir);
  std::filesystem::remove_all(work);
}

TEST(EvalCli, BadOptionsAreRefusedByName) {
  const auto dir = test::temp_path("eval-cli-bad");
  auto r = run_cli("eval --quick --out " + dir.string() + " --sections depcache-length,nosuch 2>&1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("unknown section 'nosuch'"), std::string::npos) << r.out;
  r = run_cli("eval --quick --out " + dir.string() + " --speed-model nosuch 2>&1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("unknown speed model 'nosuch'"), std::string::npos) << r.out;
  r = run_cli("eval --quick --out " + dir.string() + " --models " + dir.string() + "/none 2>&1");
  EXPECT_EQ(r.code, 4) << r.out;
  EXPECT_NE(r.out.find("depcache-qa.gguf"), std::string::npos) << r.out;
  r = run_cli("eval --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--quick"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// The evaluation report: tables and comparisons in Markdown, plots drawn by
// the real gnuplot, and every non-finite figure or missing plot reported as
// a failure rather than written as if it were a result.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "eval/eval_report.h"
#include "eval/plot.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(EvalReport, WritesTablesAndRecordsNonFiniteFigures) {
  const auto dir = test::temp_path("eval-report");
  std::filesystem::create_directories(dir);
  EvalReport r(dir);
  r.section("One");
  r.text("Some words.");
  r.table({"a", "b"}, {{r.num(1.25, 1), r.ratio(3, 2)}});
  EXPECT_EQ(r.delta(2.44), "+2.4");
  EXPECT_EQ(r.delta(-0.5), "-0.5");
  r.versus({{"speed", "2x (Fig. 1)", r.ratio(4, 2), "because"}});
  EXPECT_TRUE(r.write("# head\n").empty()) << "every figure finite";
  const std::string md = read_all(dir / "report.md");
  EXPECT_NE(md.find("# head\n"), std::string::npos);
  EXPECT_NE(md.find("## One"), std::string::npos);
  EXPECT_NE(md.find("| a | b |\n|---|---|\n| 1.2 | 1.50x |"), std::string::npos) << md;
  EXPECT_NE(md.find("| speed | 2x (Fig. 1) | 2.00x | because |"), std::string::npos) << md;

  r.section("Two");
  EXPECT_EQ(r.num(std::nan("")), "NaN");
  EXPECT_EQ(r.num(INFINITY), "NaN");
  EXPECT_EQ(r.ratio(1, 0), "NaN");
  EXPECT_EQ(r.delta(-INFINITY), "NaN");
  const std::vector<std::string> failures = r.write("# head\n");
  ASSERT_EQ(failures.size(), 4u);
  for (const std::string& f : failures) EXPECT_EQ(f.rfind("Two: ", 0), 0u) << f;
  std::filesystem::remove_all(dir);
}

TEST(EvalReport, DrawsPlotsWithGnuplotAndReportsOnesItCouldNotDraw) {
  if (!gnuplot_available()) DEPCACHE_SKIP("gnuplot not installed (scripts/setup.sh installs gnuplot-nox)");
  const auto dir = test::temp_path("eval-plot");
  std::filesystem::create_directories(dir);
  EvalReport r(dir);
  r.section("Plots");
  r.plot("line", "1 2\n2 4\n3 8\n", "plot $DATA using 1:2 with linespoints title 'x'");
  r.plot("broken", "1 2\n", "plot $DATA using 1:2 with nosuchstyle");
  const std::vector<std::string> failures = r.write("");
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_NE(failures[0].find("broken.png"), std::string::npos) << failures[0];
  std::ifstream png(dir / "line.png", std::ios::binary);
  char magic[4] = {};
  png.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  const std::string md = read_all(dir / "report.md");
  EXPECT_NE(md.find("![line](line.png)"), std::string::npos);
  EXPECT_EQ(md.find("broken.png"), std::string::npos) << "no link to a plot that was not drawn";
  std::filesystem::remove_all(dir);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

#pragma once
// The report `depcache eval` writes: Markdown with tables and, beside it,
// PNG plots drawn by gnuplot. Every figure goes through num(), which refuses
// NaN and Inf: a report with a non-finite figure is a failed evaluation.
#include <filesystem>
#include <string>
#include <vector>

namespace depcache {

// One result set beside the paper's: what, the paper's figure (and where it
// is), ours, and why they differ.
struct Versus {
  std::string result, paper, ours, why;
};

class EvalReport {
 public:
  explicit EvalReport(std::filesystem::path dir);

  void section(const std::string& title);  // "## title"
  void text(const std::string& markdown);  // a paragraph
  void table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);
  void versus(const std::vector<Versus>& rows);
  // Draws name.png in the report's directory from `data` (gnuplot data
  // blocks; '$DATA' in `commands` names the file) and links it.
  void plot(const std::string& name, const std::string& data, const std::string& commands);

  // v with `digits` decimals; a non-finite v is recorded against the current
  // section and printed as NaN.
  std::string num(double v, int digits = 1);
  // v with a sign and one decimal, "+2.4" (non-finite: recorded, as num()).
  std::string delta(double v);
  // a / b as "2.4x" (b == 0 or non-finite: recorded).
  std::string ratio(double a, double b);

  // Writes report.md; returns what failed: non-finite figures, plots not drawn.
  std::vector<std::string> write(const std::string& header) const;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::string body_, section_;
  std::vector<std::string> failures_;
};

}  // namespace depcache

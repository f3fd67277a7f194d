#include "eval/eval_report.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>

#include "eval/plot.h"
#include "util/error.h"

namespace depcache {

EvalReport::EvalReport(std::filesystem::path dir) : dir_(std::move(dir)) {}

void EvalReport::section(const std::string& title) {
  section_ = title;
  body_ += fmt::format("\n## {}\n\n", title);
}

void EvalReport::text(const std::string& markdown) { body_ += markdown + "\n\n"; }

void EvalReport::table(const std::vector<std::string>& header,
                       const std::vector<std::vector<std::string>>& rows) {
  body_ += fmt::format("| {} |\n|", fmt::join(header, " | "));
  for (size_t i = 0; i < header.size(); ++i) body_ += "---|";
  body_ += "\n";
  for (const auto& row : rows) body_ += fmt::format("| {} |\n", fmt::join(row, " | "));
  body_ += "\n";
}

void EvalReport::versus(const std::vector<Versus>& rows) {
  std::vector<std::vector<std::string>> cells;
  for (const Versus& v : rows) cells.push_back({v.result, v.paper, v.ours, v.why});
  text("Against the paper:");
  table({"result", "paper", "here", "why they differ"}, cells);
}

void EvalReport::plot(const std::string& name, const std::string& data, const std::string& commands) {
  if (plot_png(dir_ / (name + ".png"), data, commands))
    body_ += fmt::format("![{}]({}.png)\n\n", name, name);
  else
    failures_.push_back(fmt::format("{}: plot {}.png not drawn (gnuplot missing or failed)", section_, name));
}

std::string EvalReport::num(double v, int digits) {
  if (!std::isfinite(v)) {
    failures_.push_back(fmt::format("{}: a non-finite figure ({})", section_, v));
    return "NaN";
  }
  return fmt::format("{:.{}f}", v, digits);
}

std::string EvalReport::delta(double v) {
  const std::string n = num(v);
  return std::isfinite(v) && v >= 0 ? "+" + n : n;
}

std::string EvalReport::ratio(double a, double b) {
  if (b == 0 || !std::isfinite(a / b)) {
    failures_.push_back(fmt::format("{}: a ratio {} / {} is not finite", section_, a, b));
    return "NaN";
  }
  return fmt::format("{:.2f}x", a / b);
}

std::vector<std::string> EvalReport::write(const std::string& header) const {
  const std::filesystem::path path = dir_ / "report.md";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << header << body_;
  out.close();
  if (!out) fail(ErrorKind::InvalidInput, "cannot write {}", path.string());
  return failures_;
}

}  // namespace depcache

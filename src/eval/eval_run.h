#pragma once
// `depcache eval`: each seed paper's headline experiments re-run on this
// engine, on models and data made on the machine (the shipped QA models for
// answers, a random-weight model for speed), written as one Markdown report
// with PNG plots, each result beside the paper's figure.
#include <string>
#include <vector>

namespace depcache {

struct EvalOptions {
  std::string out = "build/eval", models_dir = "models", work_dir = "build/eval-models",
              data_dir = "../shared/data";
  std::vector<std::string> sections;  // empty: all of eval_sections()
  bool quick = false;
  int threads = 0;
};

// The report's sections by name, in the order they run.
std::vector<std::string> eval_sections();

// Runs the chosen sections and writes <out>/report.md; `command` is quoted in
// its header. InvalidInput for an unknown section, NotFound for a missing
// shipped model or gnuplot, Internal when a figure or plot failed.
void run_eval(const EvalOptions& o, const std::string& command);

}  // namespace depcache

#pragma once
// `depcache eval`: each seed paper's headline experiments re-run on this
// engine, on models and data made on the machine (the shipped QA models for
// answers, a random-weight model for speed), written as one Markdown report
// with PNG plots, each result beside the paper's figure.
#include <filesystem>
#include <string>
#include <vector>

namespace depcache {

struct EvalOptions {
  std::string out = "build/eval", models_dir = "models", work_dir = "build/eval-models",
              data_dir = "../shared/data";
  std::vector<std::string> sections;  // empty: all of eval_sections()
  // The random-weight model the speed sections run: "small" (4 layers, 256
  // wide: attention weighs most) or a shape of model_preset_names().
  std::string speed_model = "small";
  bool quick = false;
  int threads = 0;
};

// Where the speed model of o.speed_model is made (under o.work_dir);
// InvalidInput for an unknown name.
std::filesystem::path speed_model_path(const EvalOptions& o);

// The report's sections by name, in the order they run.
std::vector<std::string> eval_sections();

// Runs the chosen sections and writes <out>/report.md; `command` is quoted in
// its header. InvalidInput for an unknown section or speed model, NotFound for a missing
// shipped model or gnuplot, Internal when a figure or plot failed.
void run_eval(const EvalOptions& o, const std::string& command);

}  // namespace depcache

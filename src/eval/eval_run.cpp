#include "eval/eval_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "compute/dot.h"
#include "eval/eval_report.h"
#include "eval/experiments.h"
#include "eval/plot.h"
#include "model/model.h"
#include "model/model_writer.h"
#include "util/error.h"
#include "util/thread_pool.h"
#include "util/timing.h"

namespace depcache {
namespace {

namespace fs = std::filesystem;
using experiments::EvalContext;

// Each section once, with its name, in the report's order.
struct Section {
  const char* name;
  void (*run)(EvalContext&);
};
constexpr Section kSections[] = {
    {"depcache-length", experiments::depcache_length},
    {"depcache-policies", experiments::depcache_policies},
    {"depcache-accuracy", experiments::depcache_accuracy},
    {"ragcache-policies", experiments::ragcache_policies},
    {"ragcache-ttft", experiments::ragcache_ttft},
    {"ragcache-speculation", experiments::ragcache_speculation},
    {"subgcache", experiments::subgcache},
    {"chunk-quality", experiments::chunk_quality},
    {"throughput", experiments::throughput},
    {"engine", experiments::engine_table},
};

std::string shell_line(const char* cmd) {
  std::string out;
  if (FILE* p = popen(cmd, "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

}  // namespace

std::vector<std::string> eval_sections() {
  std::vector<std::string> names;
  for (const Section& s : kSections) names.emplace_back(s.name);
  return names;
}

fs::path speed_model_path(const EvalOptions& o) {
  const std::vector<std::string> presets = model_preset_names();
  if (o.speed_model == "small") return fs::path(o.work_dir) / "speed-f16.gguf";
  if (std::find(presets.begin(), presets.end(), o.speed_model) == presets.end())
    fail(ErrorKind::InvalidInput, "unknown speed model '{}' (expected small or a preset: {})", o.speed_model,
         fmt::join(presets, ", "));
  return fs::path(o.work_dir) / fmt::format("speed-{}-f16.gguf", o.speed_model);
}

void run_eval(const EvalOptions& o, const std::string& command) {
  const std::vector<std::string> all = eval_sections();
  const std::vector<std::string>& chosen = o.sections.empty() ? all : o.sections;
  for (const std::string& s : chosen)
    if (std::find(all.begin(), all.end(), s) == all.end())
      fail(ErrorKind::InvalidInput, "unknown section '{}' (expected {})", s, fmt::join(all, ", "));
  speed_model_path(o);  // refuses an unknown name before anything runs
  if (!gnuplot_available())
    fail(ErrorKind::NotFound, "eval draws its plots with gnuplot: install it (scripts/setup.sh does)");
  for (const char* m : {"depcache-qa.gguf", "depcache-qa-alone.gguf", "depcache-qa-sequential.gguf",
                        "depcache-qa-gaps.gguf", "depcache-qa-csv.gguf"})
    experiments::shipped_model_path(o.models_dir, m);
  fs::create_directories(o.out);
  fs::create_directories(o.work_dir);
  // The checkout this run starts from (edits made while it runs do not change what runs).
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::string commit = shell_line("git rev-parse --short HEAD 2>/dev/null");
  if (!commit.empty() && !shell_line("git status --porcelain --untracked-files=no 2>/dev/null").empty())
    commit += " (with uncommitted changes)";
  const auto t0 = Clock::now();
  experiments::stage(fmt::format("eval{}: writing {}/report.md", o.quick ? " --quick" : "", o.out));

  // The speed model: random F16 weights, made once; the small one has the
  // demo's shape.
  const fs::path speed = speed_model_path(o);
  if (!fs::exists(speed)) {
    RandomModelOptions m;
    if (o.speed_model == "small") {
      m.shape = *model_preset("tiny");
      m.shape.n_layer = 4;
      m.shape.n_embd = 256;
      m.shape.n_head = 4;
      m.shape.n_head_kv = 2;
      m.shape.n_ff = 768;
      m.shape.n_ctx = 32768;
    } else {
      m.shape = *model_preset(o.speed_model);
    }
    m.type = DType::F16;
    m.seed = 1;
    m.n_threads = o.threads;
    experiments::stage(fmt::format("making the speed model {}", speed.string()));
    write_random_model(speed, m);
  }
  EvalReport report(o.out);
  experiments::EvalContext c{o, report, Model::load(speed), speed.string()};
  std::vector<std::vector<std::string>> timing;
  for (const Section& s : kSections) {
    if (std::find(chosen.begin(), chosen.end(), s.name) == chosen.end()) continue;
    const auto ts = Clock::now();
    s.run(c);
    timing.push_back({s.name, fmt::format("{:.0f} s", seconds_since(ts))});
  }
  report.section("Time per section");
  report.table({"section", "wall time"}, timing);

  const std::string header = fmt::format(
      "# depcache eval{}\n\nEach seed paper's headline experiments, re-run on this engine; every figure "
      "below "
      "comes from this run.\n\n- command: `{}`\n- commit: {}\n- date: {}\n- CPU: {}, {} threads, kernels {}\n"
      "- speed model: `{}` (random weights, {} layers, {} wide: look at speed, not text); QA models: `{}`\n"
      "- wall time: {:.0f} s\n",
      o.quick ? " (quick)" : "", command, commit.empty() ? "unknown (not a git checkout)" : commit, date,
      cpu_name(), ThreadPool(o.threads).size(), isa_name(current_isa()), c.speed_path,
      c.speed->config().n_layer, c.speed->config().n_embd, o.models_dir, seconds_since(t0));
  const std::vector<std::string> failures = report.write(header);
  experiments::stage(fmt::format("wrote {}/report.md", o.out));
  if (!failures.empty())
    fail(ErrorKind::Internal, "the report has {} failed figures or plots:\n  {}", failures.size(),
         fmt::join(failures, "\n  "));
}

}  // namespace depcache

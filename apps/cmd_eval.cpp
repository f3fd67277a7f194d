// `depcache eval`: its options; the experiments are in src/eval (eval_run.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli_common.h"
#include "commands.h"
#include "eval/eval_run.h"

namespace depcache::cli {

void add_eval_command(CLI::App& app) {
  static EvalOptions o;
  CLI::App* cmd = app.add_subcommand(
      "eval", "Re-run each seed paper's headline experiments and write one report (Markdown and PNG plots)");
  cmd->add_flag("--quick", o.quick, "Smaller streams and fewer points: a few minutes on 2 cores");
  add_output_option(*cmd, o.out, "Directory of report.md and its plots")->capture_default_str();
  cmd->add_option("--models", o.models_dir, "Directory of the shipped QA models")->capture_default_str();
  cmd->add_option("--work", o.work_dir,
                  "Directory of the models eval makes (the speed model and its quantized copies, made once)")
      ->capture_default_str();
  cmd->add_option("--data", o.data_dir,
                  "Directory with musique/ (MuSiQue corpus and questions); without it the document sections "
                  "use documents of a made-up world")
      ->capture_default_str();
  cmd->add_option(
         "--sections", o.sections,
         fmt::format("Sections to run, comma-separated (default: all): {}", fmt::join(eval_sections(), ", ")))
      ->delimiter(',');
  cmd->add_option(
         "--speed-model", o.speed_model,
         "Shape of the random-weight model the speed sections run: small (4 layers, 256 wide, where "
         "attention over the prompt weighs most) or a preset of `model new` (qwen2-0.5b, llama3.2-1b, "
         "...), made in --work once")
      ->capture_default_str();
  add_threads_option(*cmd, o.threads);
  cmd->callback([] {
    const std::string command = fmt::format(
        "depcache eval{} --out {} --models {} --data {}{}{}", o.quick ? " --quick" : "", o.out, o.models_dir,
        o.data_dir, o.speed_model == "small" ? "" : " --speed-model " + o.speed_model,
        o.sections.empty() ? "" : fmt::format(" --sections {}", fmt::join(o.sections, ",")));
    run_eval(o, command);
  });
}

}  // namespace depcache::cli

// depcache: one binary, one subcommand per job.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"depcache: an LLM inference engine that reuses KV caches of retrieved context"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "depcache 0.1.0");
  depcache::cli::add_model_commands(app);
  depcache::cli::add_tokenize_command(app);
  depcache::cli::add_generate_command(app);
  depcache::cli::add_bench_model_command(app);
  depcache::cli::add_kg_commands(app);
  depcache::cli::add_retrieve_command(app);
  depcache::cli::add_workload_commands(app);
  depcache::cli::add_run_command(app);
  depcache::cli::add_simulate_command(app);
  depcache::cli::add_serve_command(app);
  depcache::cli::add_route_command(app);
  depcache::cli::add_loadgen_command(app);
  depcache::cli::add_train_command(app);
  depcache::cli::add_vocab_commands(app);
  depcache::cli::add_chunks_commands(app);
  depcache::cli::add_eval_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error exits 2.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const depcache::cli::ExitCode& e) {
    return e.code;
  } catch (const depcache::Error& e) {
    std::fprintf(stderr, "depcache: error: %s\n", e.what());
    return static_cast<int>(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "depcache: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}

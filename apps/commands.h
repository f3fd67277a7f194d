#pragma once
// Each subcommand family registers itself on the root CLI app. Callbacks throw
// depcache::Error; main() turns its kind into the exit code.
#include <CLI/CLI.hpp>

namespace depcache::cli {

// Thrown by a command that ends with a particular exit code but no error
// message of its own (it printed what the user needs already).
struct ExitCode {
  int code;
};

void add_model_commands(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_bench_model_command(CLI::App& app);
void add_kg_commands(CLI::App& app);
void add_kg_paths_command(CLI::App& kg);  // registered by add_kg_commands
void add_retrieve_command(CLI::App& app);
void add_workload_commands(CLI::App& app);
void add_run_command(CLI::App& app);
void add_simulate_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_route_command(CLI::App& app);
void add_loadgen_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_vocab_commands(CLI::App& app);
void add_chunks_commands(CLI::App& app);
void add_eval_command(CLI::App& app);

}  // namespace depcache::cli

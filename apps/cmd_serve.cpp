// `depcache serve`: the engine behind an OpenAI-compatible HTTP API.
#include <fmt/format.h>
#include <pthread.h>

#include <csignal>
#include <filesystem>

#include "cli_common.h"
#include "commands.h"
#include "engine/engine_loop.h"
#include "model/model.h"
#include "model/vocab.h"
#include "server/http_server.h"
#include "strategy/strategy.h"
#include "util/error.h"

namespace depcache::cli {

void add_serve_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("serve", "Serve a GGUF model over an OpenAI-compatible HTTP API");
  static std::string model_path, kv_type = "f16", policy = "lru", scheduler = "fifo";
  static ServerOptions so;
  static EngineOptions eo;
  static double cache_mib = 1024, drain_s = 30;
  static int64_t pool_rows = 16384;
  cmd->add_option("-m,--model", model_path, "GGUF model file")->required();
  cmd->add_option("--host", so.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", so.port, "Port to listen on (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", so.api_key, "Require 'Authorization: Bearer KEY' (default: no key)");
  cmd->add_option("--max-body", so.max_body_bytes, "Largest request body in bytes (larger: 413)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  cmd->add_option("--http-threads", so.http_threads,
                  "Requests served at once (a streaming client holds one; the rest queue in the kernel)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--strategy", so.strategy, "Reuse strategy of plain requests: full, prefix, depcache")
      ->capture_default_str()
      ->check(CLI::IsMember(strategy_names()));
  cmd->add_option("-t,--threads", eo.threads, "Compute threads (default: one per core)");
  cmd->add_option("-c,--ctx-size", pool_rows, "Rows of the KV pool shared by running requests")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  cmd->add_option("--kv-type", kv_type, "KV storage: f16 or f32")->capture_default_str();
  cmd->add_option("--cache-mib", cache_mib, "Hot tier of the KV index (MiB)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1048576.0));
  cmd->add_option("--policy", policy,
                  "Replacement policy of the index: lru, lfu, gdsf, pgdsf, lacr, cachecraft")
      ->capture_default_str();
  cmd->add_option("--batch-tokens", eo.batch_tokens, "Tokens computed in one forward pass")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd->add_option("--scheduler", scheduler, "Admission order: fifo, lpm, lsp, ragcache")
      ->capture_default_str()
      ->check(CLI::IsMember({"fifo", "lpm", "lsp", "ragcache"}));
  cmd->add_option(
         "--drain-seconds", drain_s,
         "On SIGTERM/SIGINT: how long requests in flight may take to finish before they are cancelled")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->callback([] {
    // SIGTERM and SIGINT are taken by sigwait below, on this thread only:
    // every thread started from here on inherits the mask.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    HttpServer http(so);
    const int port = http.listen();
    fmt::print(stderr, "depcache serve: listening on http://{}:{} (loading {})\n", so.host, port, model_path);
    std::fflush(stderr);
    std::shared_ptr<const Model> model = Model::load(model_path);
    auto tok = std::make_shared<const Tokenizer>(Vocab::from_gguf(model->file()));
    eo.pool_rows = pool_rows;
    eo.kv_type = parse_kv_type(kv_type);
    eo.cache_bytes = static_cast<size_t>(cache_mib * 1048576.0);
    eo.policy = policy;
    eo.strategy = {default_position_scheme(model->config()), true};
    eo.scheduler = {scheduler, 32};
    eo.tokenizer = tok;
    eo.eog_ids = tok->eog_ids();
    EngineLoop loop(model, eo);
    const std::string name = std::filesystem::path(model_path).stem().string();
    http.ready(name, tok, loop, std::min<int64_t>(pool_rows, model->config().n_ctx_train));
    fmt::print(stderr, "depcache serve: ready, model '{}'\n", name);
    std::fflush(stderr);

    int sig = 0;
    sigwait(&stop_signals, &sig);
    fmt::print(stderr, "depcache serve: {}, draining (at most {} s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               drain_s);
    const bool in_time = http.shutdown(std::chrono::steady_clock::now() +
                                       std::chrono::milliseconds(static_cast<int64_t>(drain_s * 1000)));
    fmt::print(stderr, "depcache serve: stopped{}\n",
               in_time ? "" : " (requests still running were cancelled)");
  });
}

}  // namespace depcache::cli

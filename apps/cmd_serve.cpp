// `depcache serve`: the engine behind an OpenAI-compatible HTTP API.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "cli_common.h"
#include "commands.h"
#include "engine/engine_loop.h"
#include "engine_options.h"
#include "model/model.h"
#include "model/vocab.h"
#include "prompt/chat_template.h"
#include "retrieval/corpus.h"
#include "retrieval/knowledge_graph.h"
#include "retrieval/retriever.h"
#include "server/http_server.h"
#include "strategy/strategy.h"
#include "tier_options.h"
#include "util/error.h"

namespace depcache::cli {
namespace {

// The chat format: the family asked for, else the model's own template. A
// template the interpreter cannot read stops the server, naming what it
// cannot read, rather than chats being formatted by a guess.
std::optional<ChatFormat> served_chat_format(const std::string& asked, const std::string& model_template) {
  if (!asked.empty()) return ChatFormat(*chat_family_from_name(asked));
  if (model_template.empty()) {
    fmt::print(stderr,
               "depcache serve: the model has no chat template: /v1/chat/completions answers 400 unless "
               "--chat-template is given\n");
    return std::nullopt;
  }
  try {
    return ChatFormat::from_jinja(model_template);
  } catch (const Error& e) {
    fail(ErrorKind::InvalidInput,
         "the model's chat template cannot be run here ({}); name a format with --chat-template ({}) if one "
         "fits",
         e.what(), fmt::join(chat_family_names(), ", "));
  }
}

// serve's command line.
struct ServeArgs {
  std::string model_path;
  ServerOptions so;
  EngineArgs engine_args;
  double drain_s = 30;
  int64_t pool_rows = 16384;
  std::string chat_template, kg_path, corpus_path, corpus_format = "auto";
  std::string api_key, api_key_file;
  int64_t request_timeout_ms = so.http.request_timeout.count(),
          keep_alive_ms = so.http.keep_alive_timeout.count(),
          write_timeout_ms = so.http.write_timeout.count();
  double stage_latency_ms = 0;
  int64_t batch_window_ms = 50;
};

// The server's options from the command line's: timeouts, keys (from a
// file, the environment or the command line: one source), batching.
void finish_options(ServeArgs& a) {
  a.so.search.stage_latency = std::chrono::microseconds(std::llround(a.stage_latency_ms * 1000));
  a.so.http.request_timeout = std::chrono::milliseconds(a.request_timeout_ms);
  a.so.http.keep_alive_timeout = std::chrono::milliseconds(a.keep_alive_ms);
  a.so.http.write_timeout = std::chrono::milliseconds(a.write_timeout_ms);
  // Keys: from a file, the environment or the command line (one source).
  const char* env_key = std::getenv("DEPCACHE_API_KEY");
  const int sources = !a.api_key_file.empty() + !a.api_key.empty() + (env_key && *env_key);
  if (sources > 1)
    throw CLI::ValidationError("--api-key-file",
                               "give keys in one way: --api-key-file, --api-key or DEPCACHE_API_KEY");
  if (!a.api_key_file.empty()) a.so.api_keys = read_api_key_file(a.api_key_file);
  if (!a.api_key.empty()) a.so.api_keys = {ApiKey{a.api_key, {}}};
  if (env_key && *env_key) a.so.api_keys = {ApiKey{env_key, {}}};
  a.so.subgcache.window = std::chrono::milliseconds(a.batch_window_ms);
  if (a.so.search.speculate && a.so.search.stages < 2)
    throw CLI::ValidationError("--speculate", "needs --search-stages 2 or more");
}

// The retrieval sources the server answers rag.retrieve from.
struct Sources {
  std::unique_ptr<KnowledgeGraph> kg;
  std::unique_ptr<GraphRetriever> graph;
  std::unique_ptr<ChunkIndex> corpus;
};
Sources load_sources(const ServeArgs& a, const Tokenizer& tok, ServedModel& served) {
  Sources out;
  if (!a.kg_path.empty()) {
    out.kg = std::make_unique<KnowledgeGraph>(KnowledgeGraph::load(a.kg_path));
    out.graph = std::make_unique<GraphRetriever>(*out.kg);
    served.graph = out.graph.get();
    fmt::print(stderr, "depcache serve: knowledge graph {} ({} entities, {} triples)\n", a.kg_path,
               out.kg->n_entities(), out.kg->n_triples());
  }
  if (!a.corpus_path.empty()) {
    out.corpus = std::make_unique<ChunkIndex>(
        ChunkIndex::build(load_corpus(a.corpus_path, parse_corpus_format(a.corpus_format)), tok));
    served.corpus = out.corpus.get();
    fmt::print(stderr, "depcache serve: corpus {} ({} documents, {} chunks)\n", a.corpus_path,
               out.corpus->corpus().docs.size(), out.corpus->chunks().size());
  }
  return out;
}

// Listens, loads the model and its sources, serves until SIGTERM or SIGINT,
// then drains.
void serve(ServeArgs& a) {
  // SIGTERM and SIGINT are taken by sigwait below, on this thread only:
  // every thread started from here on inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  finish_options(a);
  HttpServer http(a.so);
  const int port = http.listen();
  fmt::print(stderr, "depcache serve: listening on http://{}:{} (loading {})\n", a.so.host, port,
             a.model_path);
  std::fflush(stderr);
  std::shared_ptr<const Model> model = Model::load(a.model_path, {a.pool_rows});
  auto tok = std::make_shared<const Tokenizer>(Vocab::from_gguf(model->file()));
  ServedModel served;
  served.name = std::filesystem::path(a.model_path).stem().string();
  served.tokenizer = tok;
  served.n_ctx = std::min<int64_t>(a.pool_rows, model->config().n_ctx_train);
  served.chat = served_chat_format(a.chat_template, tok->vocab().chat_template);
  served.prompt = model->config().prompt;
  // Read before the engine starts, so a bad file stops the server at once.
  const Sources sources = load_sources(a, *tok, served);
  // Every strategy is served by one engine: the default strategy's profile
  // (its policy, scheduler, tiers) is the engine's.
  const ResolvedEngine re = resolve_engine(a.engine_args, a.so.strategy, model->config(), a.pool_rows, true);
  EngineOptions eo = re.engine;
  eo.tokenizer = tok;
  eo.eog_ids = tok->eog_ids();
  const TierOptions& tiers = re.tiers;
  fmt::print(stderr, "depcache serve: default strategy {}: {}; positions {}\n", a.so.strategy, re.summary,
             position_scheme_name(eo.strategy.scheme));
  if (const std::string mode = apply_matmul_mode(a.engine_args); !mode.empty())
    fmt::print(stderr, "depcache serve: {}\n", mode);
  std::unique_ptr<EngineTiers> lower;
  EngineLoop loop(
      model, eo,
      [&](Engine& e) {
        lower = std::make_unique<EngineTiers>(e, tiers, "depcache serve: ");
        profile_costs_if_needed(e, re, "depcache serve: ");
      },
      [&](Engine&) {
        if (!lower) return;
        try {
          lower->persist();  // the next server starts from what this one computed
        } catch (const std::exception& err) {
          fmt::print(stderr, "depcache serve: warning: the disk tier was not saved: {}\n", err.what());
        }
      });
  const std::string name = served.name;
  const std::string chat = served.chat ? served.chat->name() : "none";
  http.ready(std::move(served), loop);
  fmt::print(stderr, "depcache serve: ready, model '{}', chat template {}\n", name, chat);
  std::fflush(stderr);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  fmt::print(stderr, "depcache serve: {}, draining (at most {} s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
             a.drain_s);
  const bool in_time = http.shutdown(std::chrono::steady_clock::now() +
                                     std::chrono::milliseconds(static_cast<int64_t>(a.drain_s * 1000)));
  fmt::print(stderr, "depcache serve: stopped{}\n",
             in_time ? "" : " (requests still running were cancelled)");
}

// What a client may send and how long it may take (every limit answers with its HTTP code).
void add_http_limits(CLI::App* cmd, ServeArgs& a) {
  cmd->add_option("--max-body", a.so.http.max_body_bytes,
                  "Largest request body in bytes, whatever its transfer encoding (larger: 413)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  cmd->add_option("--max-header-bytes", a.so.http.max_header_bytes,
                  "Largest request line and headers together, in bytes (larger: 431)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{256}, size_t{1} << 24));
  cmd->add_option("--max-headers", a.so.http.max_header_lines, "Most header lines of a request (more: 431)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{100000}));
  cmd->add_option("--request-timeout", a.request_timeout_ms,
                  "Milliseconds a client has to send a whole request, from its first byte (slower: 408)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  cmd->add_option("--keep-alive-timeout", a.keep_alive_ms,
                  "Milliseconds an idle connection is kept open for its next request")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  cmd->add_option("--write-timeout", a.write_timeout_ms,
                  "Milliseconds a response may wait for a client that does not read it (then the request is "
                  "cancelled)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}));
  cmd->add_option(
         "--http-threads", a.so.http.max_connections,
         "Connections served at once, a thread each (a streaming client holds one); one more gets an "
         "immediate 503 with Retry-After")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{900}));
  cmd->add_option("--max-queue", a.so.max_queue,
                  "Requests waiting for the engine at most; more are refused with 429 and Retry-After (0: no "
                  "limit)")
      ->capture_default_str();
}

// Where rag.retrieve searches, staged search with speculation, SubGCache's batching.
void add_retrieval_options(CLI::App* cmd, ServeArgs& a) {
  cmd->add_option("--kg", a.kg_path,
                  "Knowledge graph (.dkg) that requests may retrieve entities and paths from");
  cmd->add_option("--corpus", a.corpus_path, "Document corpus that requests may retrieve chunks from (BM25)");
  cmd->add_option("--corpus-format", a.corpus_format, "Format of --corpus: auto, musique, hotpotqa, jsonl")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "musique", "hotpotqa", "jsonl"}));
  cmd->add_option("--search-stages", a.so.search.stages,
                  "Stages of a corpus search (each stage's top-k is what --speculate starts a prefill from)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  cmd->add_option(
         "--search-stage-order", a.so.search.order,
         "How a corpus search is staged: documents (chunk-id ranges, like shards searched in turn) or "
         "terms (the rarest query terms first, over every chunk); default documents")
      ->transform(CLI::CheckedTransformer(stage_orders()));
  cmd->add_flag("--speculate", a.so.search.speculate,
                "Dynamic speculative pipelining (RAGCache): prefill from each stage's top-k while the search "
                "goes on, keep it when the final list is the same (needs --search-stages 2 or more)");
  cmd->add_option("--max-prefill-bs", a.so.search.max_prefill_bs,
                  "Speculative prefills in flight at once, over every request")
      ->capture_default_str()
      ->check(CLI::Range(size_t{0}, size_t{1} << 20));
  cmd->add_option("--speculative-piece-tokens", a.so.search.piece_tokens,
                  "Prompt tokens a speculative prefill computes per step, so that stopping it takes effect "
                  "soon (0: the step's whole budget)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--search-stage-latency-ms", a.stage_latency_ms,
                  "Added to every search stage: stands for a retriever slower than in-memory BM25 (a remote "
                  "vector database), to measure how much of its time speculation hides")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60000.0));
  cmd->add_option(
         "--strategy", a.so.strategy,
         fmt::format("Reuse strategy of requests that name none: {} (subgcache: GraphRAG requests batched "
                     "and clustered by subgraph, one prefill per cluster)",
                     fmt::join(request_strategy_names(), ", ")))
      ->capture_default_str()
      ->check(CLI::IsMember(request_strategy_names()));
  add_subgcache_options(cmd, a.so.subgcache.subgcache);
  cmd->add_option("--query-batch", a.so.subgcache.subgcache.batch,
                  "subgcache: the most requests clustered together")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch-window-ms", a.batch_window_ms,
                  "subgcache: how long a batch's first request waits for others before its batch is "
                  "clustered")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{60000}));
}

}  // namespace

void add_serve_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("serve", "Serve a GGUF model over an OpenAI-compatible HTTP API");
  static ServeArgs a;
  cmd->add_option("-m,--model", a.model_path, "GGUF model file")->required();
  cmd->add_option("--host", a.so.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a.so.port, "Port to listen on (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option(
      "--api-key", a.api_key,
      "Require 'Authorization: Bearer KEY' (visible in the process list: prefer --api-key-file or "
      "the DEPCACHE_API_KEY environment variable)");
  cmd->add_option(
         "--api-key-file", a.api_key_file,
         "Keys clients may present, one per line: 'KEY' (KV reused among that key's requests only) or "
         "'KEY NAMESPACE' (keys naming the same namespace share their cache)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--allow-special-tokens", a.so.special_in_text,
                "Special-token strings in prompts and messages become control tokens (trusted clients only; "
                "by default they are plain text)");
  add_http_limits(cmd, a);
  cmd->add_option("--chat-template", a.chat_template,
                  "Chat format of /v1/chat/completions (default: the model's own tokenizer.chat_template, "
                  "run as Jinja2 runs it): " +
                      fmt::format("{}", fmt::join(chat_family_names(), ", ")))
      ->check(CLI::IsMember(chat_family_names()));
  add_retrieval_options(cmd, a);
  add_engine_options(*cmd, a.engine_args);
  cmd->add_option("-c,--ctx-size", a.pool_rows, "Rows of the KV pool shared by running requests")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 24));
  cmd->add_option(
         "--drain-seconds", a.drain_s,
         "On SIGTERM/SIGINT: how long requests in flight may take to finish before they are cancelled")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->callback([] { serve(a); });
}

}  // namespace depcache::cli

#pragma once
// `depcache serve`'s HTTP side: an OpenAI-compatible API over an EngineLoop.
// The listener starts before the model is loaded (/health answers 503 until
// ready()); every request is served on a worker thread of its own, which
// submits to the engine loop and writes the tokens as they come (server-sent
// events when the client asks to stream). A client that goes away mid-stream
// cancels its request, so its rows and pins are freed. shutdown() stops
// taking requests, lets the engine finish what is in flight (bounded by a
// deadline) and closes the listener. /health needs no key (probes); what
// shows the whole server (/metrics, /v1/cache/summary) needs the operator's
// key once any key is set; everything else a tenant's key when keys are set.
// Requests reuse KV only within their cache scope: the API key's namespace
// and the request's cache_salt.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "engine/engine_loop.h"
#include "kv/kv_events.h"
#include "model/rag_wrapper.h"
#include "model/tokenizer.h"
#include "prompt/chat_template.h"
#include "retrieval/corpus.h"
#include "retrieval/retriever.h"
#include "server/http_connection.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/query_batcher.h"
#include "server/speculation.h"
#include "util/timing.h"

namespace depcache {

struct PromptRequest;
struct PromptSources;

// A key a client may present (Authorization: Bearer KEY), and the cache
// namespace its requests reuse KV within.
struct ApiKey {
  static constexpr size_t kMinChars = 16;  // shorter keys are too easy to guess
  std::string key;
  std::string cache_namespace;  // empty: the shared one
};
// Keys from a file: one per line, "KEY" (a namespace of its own) or
// "KEY NAMESPACE" (keys naming the same namespace share their cache);
// blank lines and lines starting with # are skipped. Throws InvalidInput
// naming the file and line for a malformed one, or a file with no key.
std::vector<ApiKey> read_api_key_file(const std::string& path);
// The key a request presents (Authorization: Bearer KEY) among `keys`,
// compared in constant time with every one; nullptr when none matches.
const ApiKey* find_api_key(const std::vector<ApiKey>& keys, const httplib::Request& req);

// Who may read what shows every tenant at once (metrics, cache summaries, a
// router's replicas): the operator, by a key of its own. With no key of any
// kind the server is open (one user on loopback); with tenants' keys and no
// operator key, those endpoints are closed to everyone.
struct OperatorAccess {
  std::string key;             // empty: none
  bool tenants_keyed = false;  // tenants' keys are set
  // 401 (no or wrong key) or 403 (a tenant's key), or nullopt when allowed.
  std::optional<ApiError> refusal(const httplib::Request& req) const;
};
// The operator key from a file: its first line, at least ApiKey::kMinChars
// characters; throws InvalidInput naming the file.
std::string read_operator_key_file(const std::string& path);

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port
  std::vector<ApiKey> api_keys;     // empty: no authentication
  std::string operator_key;         // for /metrics and /v1/cache/summary (OperatorAccess)
  HttpLimits http;                  // connections, sizes, timeouts
  std::string strategy = "prefix";  // of requests that name none
  // Requests waiting for the engine; more: 429 with Retry-After. Below
  // http.max_connections, so that it is reached before connections run out.
  size_t max_queue = 64;
  bool special_in_text = false;  // PromptSources::special_in_text
  SpeculationOptions search;     // how corpus searches run (stages, speculative pipelining)
  QueryBatchOptions subgcache;   // requests with strategy "subgcache": batching and clustering
  // With a KV event log (serve --kv-events): GET /v1/cache/summary answers
  // with what the index holds as content keys, for routers.
  std::shared_ptr<KvEventLog> kv_events;
  std::string replica, epoch;  // this replica's name, and its process's epoch
};

// The model being served and what requests may draw their prompts from.
struct ServedModel {
  std::string name;
  std::shared_ptr<const Tokenizer> tokenizer;
  int64_t n_ctx = 0;               // the most rows a request may use (prompt + max_tokens)
  std::optional<ChatFormat> chat;  // nullopt: chat requests are refused
  const ChunkIndex* corpus = nullptr;
  const GraphRetriever* graph = nullptr;
  RagWrapper prompt;  // the model's, for RAG requests
};

class HttpServer {
 public:
  explicit HttpServer(const ServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts serving on a thread of its own; returns the port.
  // Throws Error when the address cannot be bound.
  int listen();
  // The model is loaded: from now on requests run on `loop`; the loop and
  // the model's corpus and graph must outlive shutdown().
  void ready(ServedModel model, EngineLoop& loop);
  // Stops taking requests (503), drains the engine until `deadline`
  // (cancelling what is left then) and stops the listener. True when
  // everything in flight finished in time.
  bool shutdown(std::chrono::steady_clock::time_point deadline);

 private:
  // The handlers: before routing (framing, body limits, keys, readiness:
  // refused before a body is read), the errors the library answers, then the
  // status endpoints (/health, /metrics, /v1/cache/summary, /v1/models) and
  // the completion endpoints.
  void routes();
  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res);
  void set_error_handlers();
  void add_status_routes();
  void add_completion_routes();
  // Stops the accept loop and joins its thread (once; later calls return).
  void stop_listening();
  // Both completion endpoints: parse, build the prompt, run, respond.
  void complete(const CompletionRequest& cr, httplib::Response& res, Clock::time_point arrived);
  // complete()'s steps, on the completion they share (defined in the .cpp):
  // submit it to the engine (through a corpus search, a query batch or
  // directly), then answer it whole or as a stream of events.
  struct Completion;
  void submit(const CompletionRequest& cr, const PromptRequest& prompt, const PromptSources& sources,
              Completion& c);
  void answer_whole(const Completion& c, httplib::Response& res);
  void answer_streamed(const Completion& c, std::shared_ptr<void> writing, httplib::Response& res);
  // The cache scope of a request: its key's namespace and its cache_salt.
  uint64_t cache_scope(const httplib::Request& req, const std::string& cache_salt) const;
  // A request that ran on the engine ended: its metrics and its log line.
  void finished(const std::string& id, const std::string& strategy, const RequestResult& r,
                Clock::time_point arrived);

  // Responses of requests the engine ran that are still being written.
  // shutdown() waits for them before stopping the library, which would cut
  // a chunked response short (no final chunk, no [DONE]).
  class Writing {
   public:
    // Counts one response until the returned holder is destroyed.
    std::shared_ptr<void> hold();
    // True when none is left before `deadline`.
    bool wait_until(std::chrono::steady_clock::time_point deadline);

   private:
    std::mutex mu_;
    std::condition_variable none_;
    int64_t n_ = 0;
  };

  // The queue limit, checked and reserved in one step. A request is
  // admitted before it is tokenized and submitted; until then the loop does
  // not count it, so a burst whose requests were all checked before any was
  // submitted would pass a check of the loop's count alone. Admitted but not
  // yet submitted requests count as waiting.
  class Admissions {
   public:
    // Reserves a place, or throws the 429 when `waiting` plus the places
    // reserved reach `limit` (0: no limit). The place is released when the
    // returned holder is destroyed (after the submission, or on an error).
    std::shared_ptr<void> admit(const EngineLoop& loop, size_t limit);

   private:
    std::mutex mu_;
    size_t reserved_ = 0;
  };

  ServerOptions options_;
  Writing writing_;
  Admissions admissions_;
  std::unique_ptr<GuardedHttpServer> http_;
  std::thread listener_;
  std::atomic<bool> listener_done_{false};  // listen_after_bind returned
  int listen_fd_ = -1;                      // the listening socket, seen as it is made
  std::atomic<bool> ready_{false}, draining_{false};
  ServedModel model_;
  EngineLoop* loop_ = nullptr;
  std::unique_ptr<SpeculativeSearch> search_;  // with a corpus
  std::unique_ptr<QueryBatcher> batcher_;      // SubGCache's query batches
  std::atomic<int64_t> next_id_{1};
  int64_t started_ = 0;  // unix time, for /v1/models
  ServerMetrics metrics_;
};

}  // namespace depcache

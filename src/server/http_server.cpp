#include "server/http_server.h"

#include <httplib.h>
#include <openssl/crypto.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>

#include "server/openai.h"
#include "server/request_prompt.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/timing.h"

namespace depcache {
namespace {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, error_body(e));
  if (e.status == 503 || e.status == 429) res.set_header("Retry-After", "1");
}

// The HTTP status of a request the engine failed.
ApiError engine_error(const RequestResult& r) {
  if (r.state == RequestState::Cancelled)
    return ApiError(503, "the request was cancelled: the server is shutting down", "server_error");
  switch (r.error_kind) {
    case ErrorKind::InvalidInput:
    case ErrorKind::NotFound:
      return ApiError(400, r.error);
    case ErrorKind::LimitExceeded:
      return ApiError(400, r.error, "invalid_request_error", {}, "context_length_exceeded");
    case ErrorKind::Internal:
    case ErrorKind::Unavailable:
      break;
  }
  return ApiError(500, r.error, "server_error");
}

Usage usage_of(const RequestResult& r) {
  Usage u{r.report.prompt_tokens, static_cast<int64_t>(r.tokens.size()), r.report.computed_tokens,
          r.report.reused_tokens};
  std::copy(std::begin(r.report.reused_from), std::end(r.report.reused_from), u.reused_from);
  return u;
}

std::string event(const json& j) { return "data: " + json_text(j) + "\n\n"; }

}  // namespace

// Times a request's tokens for the latency histograms, and its corpus search.
// Outside the anonymous namespace: HttpServer::Completion holds one, and a
// member of a class with linkage may not have a type without it (GCC warns
// when a unity batch compiles this file).
struct TokenClock {
  Clock::time_point arrived, last;
  bool any = false;
  bool reported = false;                  // finished() was called
  std::optional<RetrievalReport> search;  // when the server searched its corpus
  std::optional<BatchReport> batch;       // when it was served in a SubGCache batch
  void tick(ServerMetrics& m) {
    const auto now = Clock::now();
    if (any)
      m.between_tokens(std::chrono::duration<double>(now - last).count());
    else
      m.first_token(std::chrono::duration<double>(now - arrived).count());
    any = true;
    last = now;
  }
};

namespace {

// The server's own times of a request, from its arrival at the handler (after
// HTTP parsing): what a client's measured latency minus these spent outside
// the engine, in the HTTP layer and the network. A speculative prefill's
// first token counts from when the search confirmed it.
json timings_json(const RequestResult& r, const TokenClock& clock) {
  const auto ms = [&](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(t - clock.arrived).count();
  };
  const Clock::time_point first =
      clock.search ? std::max(r.first_token, clock.search->decided) : r.first_token;
  const Clock::time_point done = clock.search ? std::max(r.done, clock.search->decided) : r.done;
  json j = {{"ttft_ms", r.tokens.empty() ? json(nullptr) : json(ms(first))}, {"total_ms", ms(done)}};
  if (const auto& s = clock.search)
    j["search"] = {{"search_ms", s->search_ms}, {"non_overlapped_ms", s->non_overlapped_ms},
                   {"stages", s->stages},       {"speculations", s->speculations},
                   {"discarded", s->discarded}, {"accepted", s->accepted}};
  if (const auto& b = clock.batch)
    j["batch"] = {{"size", b->size},
                  {"cluster", b->cluster},
                  {"clusters", b->clusters},
                  {"wait_ms", b->wait_ms},
                  {"clustering_ms", b->clustering_ms}};
  return j;
}

// The final response or chunk: OpenAI's, plus the server's timings. With
// `logprobs` (the request asked for them), a whole response carries every
// token's; a stream's went out with their chunks.
json final_json(ApiKind kind, bool chunk, const std::string& id, int64_t created, const std::string& model,
                const RequestResult& r, bool include_usage, const TokenClock& clock,
                const Tokenizer* logprobs) {
  json j = completion_json(kind, chunk, id, created, model, chunk ? "" : r.text, r.finish_reason,
                           include_usage ? std::optional<Usage>(usage_of(r)) : std::nullopt,
                           logprobs && !chunk ? logprobs_json(kind, *logprobs, r.logprobs) : json(nullptr));
  j["timings"] = timings_json(r, clock);
  return j;
}

}  // namespace

HttpServer::HttpServer(const ServerOptions& options)
    : options_(options),
      http_(std::make_unique<GuardedHttpServer>(options.http)),
      started_(std::time(nullptr)) {
  http_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  routes();
}

std::vector<ApiKey> read_api_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::NotFound, "cannot read the API key file {}", path);
  std::vector<ApiKey> keys;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream words(line);
    ApiKey k;
    if (!(words >> k.key) || k.key.starts_with('#')) continue;
    words >> k.cache_namespace;
    std::string extra;
    if (words >> extra)
      fail(ErrorKind::InvalidInput, "{}:{}: a line holds a key and at most a namespace name", path, n);
    if (k.key.size() < ApiKey::kMinChars)
      fail(ErrorKind::InvalidInput, "{}:{}: a key shorter than {} characters is too easy to guess", path, n,
           ApiKey::kMinChars);
    // A key without a namespace keeps its requests' KV to itself.
    if (k.cache_namespace.empty()) k.cache_namespace = "key:" + k.key;
    keys.push_back(std::move(k));
  }
  if (keys.empty()) fail(ErrorKind::InvalidInput, "the API key file {} holds no key", path);
  return keys;
}

const ApiKey* find_api_key(const std::vector<ApiKey>& keys, const httplib::Request& req) {
  const std::string header = req.get_header_value("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  const std::string_view given =
      header.starts_with(kBearer) ? std::string_view(header).substr(kBearer.size()) : std::string_view();
  // Every key is compared, each in constant time for its length, so the
  // time taken tells nothing of how much of a key matched.
  const ApiKey* found = nullptr;
  for (const ApiKey& k : keys)
    if (given.size() == k.key.size() && CRYPTO_memcmp(given.data(), k.key.data(), given.size()) == 0 &&
        !found)
      found = &k;
  return found;
}

std::optional<ApiError> OperatorAccess::refusal(const httplib::Request& req) const {
  if (key.empty() && !tenants_keyed) return std::nullopt;
  if (key.empty())
    return ApiError(403, "this endpoint is the operator's, and no operator key is set (--operator-key-file)");
  if (find_api_key({ApiKey{key, {}}}, req)) return std::nullopt;
  return ApiError(401, "this endpoint needs the operator key (send Authorization: Bearer KEY)",
                  "invalid_request_error", {}, "invalid_api_key");
}

std::string read_operator_key_file(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line))
    fail(ErrorKind::InvalidInput, "the operator key file {} cannot be read", path);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  if (line.size() < ApiKey::kMinChars)
    fail(ErrorKind::InvalidInput, "{}: an operator key shorter than {} characters is too easy to guess", path,
         ApiKey::kMinChars);
  if (std::any_of(line.begin(), line.end(), [](unsigned char c) { return std::isspace(c); }))
    fail(ErrorKind::InvalidInput, "{}: an operator key holds no spaces", path);
  return line;
}

uint64_t HttpServer::cache_scope(const httplib::Request& req, const std::string& cache_salt) const {
  const ApiKey* key = options_.api_keys.empty() ? nullptr : find_api_key(options_.api_keys, req);
  return cache_scope_of(key ? key->cache_namespace : std::string(), cache_salt);
}

HttpServer::~HttpServer() { stop_listening(); }

void HttpServer::stop_listening() {
  if (!listener_.joinable()) return;
  // cpp-httplib's stop() does nothing until its accept loop has started; a
  // server stopped sooner (a model refused right after listen()) would wait
  // in accept forever.
  while (!http_->is_running() && !listener_done_.load(std::memory_order_acquire))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();
  listener_.join();
}

int HttpServer::listen() {
  int port = options_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(options_.host);
  } else if (!http_->bind_to_port(options_.host, port)) {
    port = -1;
  }
  if (port < 0)
    fail(ErrorKind::InvalidInput, "cannot listen on {}:{} (in use, or not an address of this machine)",
         options_.host, options_.port);
  // cpp-httplib listens with a backlog of 5 connections (built into the
  // library); in a burst of new connections each one beyond that waits for
  // the kernel to retry the handshake, a second later. Listening again on the
  // bound socket raises the backlog to the system's limit.
  if (listen_fd_ >= 0 && ::listen(listen_fd_, SOMAXCONN) != 0)
    fmt::print(stderr, "warning: the listen backlog stays at the HTTP library's 5 connections\n");
  listener_ = std::thread([this] {
    http_->listen_after_bind();
    listener_done_.store(true, std::memory_order_release);
  });
  return port;
}

void HttpServer::ready(ServedModel model, EngineLoop& loop) {
  model_ = std::move(model);
  loop_ = &loop;
  if (model_.corpus) search_ = std::make_unique<SpeculativeSearch>(loop, *model_.corpus, options_.search);
  batcher_ = std::make_unique<QueryBatcher>(options_.subgcache);
  ready_.store(true, std::memory_order_release);
}

std::shared_ptr<void> HttpServer::Writing::hold() {
  {
    std::lock_guard lk(mu_);
    ++n_;
  }
  return std::shared_ptr<void>(nullptr, [this](void*) {
    {
      std::lock_guard lk(mu_);
      --n_;
    }
    none_.notify_all();
  });
}

std::shared_ptr<void> HttpServer::Admissions::admit(const EngineLoop& loop, size_t limit) {
  {
    std::lock_guard lk(mu_);
    if (limit > 0 && loop.snapshot().waiting + reserved_ >= limit)
      throw ApiError(429,
                     fmt::format("the server is at capacity ({} requests waiting); retry shortly", limit),
                     "server_error", {}, "queue_full");
    ++reserved_;
  }
  return std::shared_ptr<void>(nullptr, [this](void*) {
    std::lock_guard lk(mu_);
    --reserved_;
  });
}

bool HttpServer::Writing::wait_until(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lk(mu_);
  return none_.wait_until(lk, deadline, [&] { return n_ == 0; });
}

bool HttpServer::shutdown(std::chrono::steady_clock::time_point deadline) {
  draining_ = true;
  if (batcher_) batcher_->stop();  // what waits for a batch is served now
  const bool in_time = !ready_ || loop_->drain(deadline);
  // The engine is done; what it produced is still being written. Requests
  // cancelled at the deadline end at once; a client that does not read is
  // bounded by the write timeout.
  const bool written = writing_.wait_until(std::max(deadline, Clock::now()) + std::chrono::seconds(10));
  if (!written) fmt::print(stderr, "warning: responses still being written are cut short\n");
  stop_listening();
  return in_time;
}

void HttpServer::finished(const std::string& id, const std::string& strategy, const RequestResult& r,
                          Clock::time_point arrived) {
  const double total_s = seconds_since(arrived);
  metrics_.request_done(r, total_s);
  const double ttft_ms =
      r.tokens.empty() ? -1 : std::chrono::duration<double, std::milli>(r.first_token - arrived).count();
  fmt::print(
      stderr,
      "{} strategy={} prompt={} computed={} reused={} generated={} ttft_ms={:.1f} total_ms={:.1f} {}{}\n", id,
      strategy, r.report.prompt_tokens, r.report.computed_tokens, r.report.reused_tokens, r.tokens.size(),
      ttft_ms, total_s * 1000, request_state_name(r.state), r.error.empty() ? "" : ": " + r.error);
}

void HttpServer::routes() {
  http_->set_logger(
      [this](const httplib::Request&, const httplib::Response& res) { metrics_.response(res.status); });
  http_->set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return pre_route(req, res); });
  set_error_handlers();
  add_status_routes();
  add_completion_routes();
}

httplib::Server::HandlerResponse HttpServer::pre_route(const httplib::Request& req, httplib::Response& res) {
  // Refused before its body is read: the body would be read as the next
  // request, so the connection ends with this response.
  const bool has_body = req.has_header("Transfer-Encoding") ||
                        (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
  const auto refuse = [&](const ApiError& e) {
    if (has_body) {
      GuardedHttpServer::close_after_response();
      res.set_header("Connection", "close");
    }
    send_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  };
  if (const std::optional<ApiError> e = framing_error(req)) return refuse(*e);
  // The library reads a body only for these methods; any other request's
  // body would be read as the next request on the connection.
  if (has_body && req.method != "POST" && req.method != "PUT" && req.method != "PATCH" &&
      req.method != "DELETE")
    return refuse(ApiError(400, fmt::format("a {} request carries no body here", req.method)));
  // A compressed body would be inflated whole before its size could be
  // checked (a small body can hold gigabytes).
  if (const std::string enc = req.get_header_value("Content-Encoding"); !enc.empty() && enc != "identity")
    return refuse(
        ApiError(415, fmt::format("compressed bodies (Content-Encoding: {}) are not accepted", enc)));
  // A declared body over the limit is refused before it is read (the
  // library would read it all to skip it).
  if (req.has_header("Content-Length")) {
    const std::string length = req.get_header_value("Content-Length");
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(length.data(), length.data() + length.size(), n);
    if (ec != std::errc() || end != length.data() + length.size())
      return refuse(ApiError(400, "the Content-Length header is not a number"));
    if (n > options_.http.max_body_bytes)
      return refuse(ApiError(413, fmt::format("the request body holds {} bytes, more than the server accepts "
                                              "({}, --max-body)",
                                              n, options_.http.max_body_bytes)));
  }
  if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
  if (req.path == "/metrics" || req.path == "/v1/cache/summary") {
    const OperatorAccess op{options_.operator_key, !options_.api_keys.empty()};
    if (const std::optional<ApiError> e = op.refusal(req)) return refuse(*e);
    if (req.path == "/metrics") return httplib::Server::HandlerResponse::Unhandled;
  } else if (!options_.api_keys.empty() && !find_api_key(options_.api_keys, req)) {
    return refuse(ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)",
                           "invalid_request_error", {}, "invalid_api_key"));
  }
  if (draining_) return refuse(ApiError(503, "the server is shutting down", "server_error"));
  if (!ready_.load(std::memory_order_acquire))
    return refuse(ApiError(503, "the model is still loading", "server_error"));
  return httplib::Server::HandlerResponse::Unhandled;
}

void HttpServer::set_error_handlers() {
  // Errors httplib answers itself (413, 404 of unknown paths, 400 of bad
  // HTTP) and those of the connection layer's limits get an OpenAI error
  // body too.
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (GuardedHttpServer::answer_violation(res)) return;
    if (!res.body.empty()) return;
    if (res.status == 413)
      send_error(res, ApiError(413, "the request body is larger than the server accepts (--max-body)"));
    else if (res.status == 404)
      send_error(res, ApiError(404, fmt::format("no such endpoint: {} {}", req.method, req.path)));
    else {
      // A request the library could not parse: where the next one starts
      // on this connection is unknown, so it ends here.
      GuardedHttpServer::close_after_response();
      res.set_header("Connection", "close");
      send_error(res, ApiError(res.status, fmt::format("the request is not valid HTTP ({})", res.status)));
    }
  });
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const PromptError& e) {
      send_error(res, bad_request(e.param(), e.what()));
    } catch (const Error& e) {
      // What the engine's own checks refused in a request is the client's.
      const bool client = e.kind() == ErrorKind::InvalidInput || e.kind() == ErrorKind::NotFound ||
                          e.kind() == ErrorKind::LimitExceeded;
      send_error(res, client ? ApiError(400, e.what()) : ApiError(500, e.what(), "server_error"));
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, e.what(), "server_error"));
    } catch (...) {
      send_error(res, ApiError(500, "internal error", "server_error"));
    }
  });
}

void HttpServer::add_status_routes() {
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) return send_json(res, 503, {{"status", "draining"}});
    if (!ready_.load(std::memory_order_acquire)) return send_json(res, 503, {{"status", "loading"}});
    send_json(res, 200, {{"status", "ok"}});
  });

  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const EngineSnapshot engine =
        ready_.load(std::memory_order_acquire) ? loop_->snapshot() : EngineSnapshot{};
    res.set_content(metrics_.render(engine) + render_http_metrics(*http_), "text/plain; version=0.0.4");
  });

  // What a router needs to know this replica's cache from scratch (and the
  // number of the last event batch it holds: later batches apply on top).
  http_->Get("/v1/cache/summary", [this](const httplib::Request&, httplib::Response& res) {
    if (!options_.kv_events)
      return send_error(res, ApiError(404, "this server publishes no KV events (serve --kv-events)"));
    const KvEventLog::Summary s = options_.kv_events->summary();
    json blocks = json::array();
    for (const uint64_t k : s.keys) blocks.push_back(fmt::format("{:016x}", k));
    const EngineSnapshot engine =
        ready_.load(std::memory_order_acquire) ? loop_->snapshot() : EngineSnapshot{};
    send_json(res, 200,
              {{"replica", options_.replica},
               {"epoch", options_.epoch},
               {"seq", s.seq},
               {"block_size", options_.kv_events->block_tokens()},
               {"running", engine.running},
               {"waiting", engine.waiting},
               {"block_hashes", std::move(blocks)}});
  });

  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", json::array({{{"id", model_.name},
                                      {"object", "model"},
                                      {"created", started_},
                                      {"owned_by", "depcache"}}})}});
  });
}

void HttpServer::add_completion_routes() {
  // The body's size is checked here whatever its transfer encoding (the
  // connection layer bounds the bytes as sent, framing included).
  const auto body_fits = [this](const httplib::Request& req) {
    // Only JSON bodies: a web page may send a form or text/plain request to
    // a server on the operator's machine without asking first, but not
    // application/json (the browser asks the server's leave, which this
    // server never gives).
    const std::string type = req.get_header_value("Content-Type");
    std::string media = type.substr(0, type.find(';'));
    std::erase_if(media, [](char c) { return c == ' ' || c == '\t'; });
    std::transform(media.begin(), media.end(), media.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (media != "application/json")
      throw ApiError(415,
                     fmt::format("the body must be sent as Content-Type: application/json (not '{}')", type));
    if (req.body.size() > options_.http.max_body_bytes)
      throw ApiError(413, fmt::format("the request body holds {} bytes, more than the server accepts ({}, "
                                      "--max-body)",
                                      req.body.size(), options_.http.max_body_bytes));
  };
  http_->Post("/v1/completions", [this, body_fits](const httplib::Request& req, httplib::Response& res) {
    const auto arrived = Clock::now();
    body_fits(req);
    thread_local std::mt19937_64 rng(std::random_device{}());
    CompletionRequest cr = parse_completion_request(req.body, rng());
    cr.cache_scope = cache_scope(req, cr.cache_salt);
    complete(cr, res, arrived);
  });
  http_->Post("/v1/chat/completions", [this, body_fits](const httplib::Request& req, httplib::Response& res) {
    const auto arrived = Clock::now();
    body_fits(req);
    thread_local std::mt19937_64 rng(std::random_device{}());
    CompletionRequest cr = parse_chat_request(req.body, rng());
    cr.cache_scope = cache_scope(req, cr.cache_salt);
    complete(cr, res, arrived);
  });
}

// A completion in progress: how its answer is named and timed, and the
// stream of its tokens.
struct HttpServer::Completion {
  ApiKind kind = ApiKind::Completion;
  std::string strategy;
  std::string id;
  int64_t created = 0;
  bool include_usage = false;
  const Tokenizer* logprobs = nullptr;  // when the request asks for logprobs
  std::shared_ptr<TokenClock> clock;
  std::shared_ptr<RequestStream> stream;
};

void HttpServer::complete(const CompletionRequest& cr, httplib::Response& res, Clock::time_point arrived) {
  if (!cr.model.empty() && cr.model != model_.name)
    throw ApiError(
        404,
        fmt::format("the model '{}' is not served here (this server serves '{}')", cr.model, model_.name),
        "invalid_request_error", "model", "model_not_found");
  check_vocab(cr, model_.tokenizer->n_vocab());
  std::shared_ptr<void> admitted = admissions_.admit(*loop_, options_.max_queue);
  const PromptSources sources{model_.tokenizer.get(), model_.chat,   model_.corpus,
                              model_.graph,           model_.prompt, options_.special_in_text};
  const PromptRequest prompt = prompt_request(cr);
  Completion c;
  c.kind = cr.kind;
  // A plain request on a server whose default is subgcache (a batch mode of
  // GraphRAG requests) runs under prefix, as it would by default.
  c.strategy = cr.rag && !cr.rag->strategy.empty() ? cr.rag->strategy : options_.strategy;
  if (!cr.rag && c.strategy == kSubgcache) c.strategy = std::string(engine_strategy(c.strategy));
  c.clock = std::make_shared<TokenClock>();
  c.clock->arrived = c.clock->last = arrived;
  std::shared_ptr<void> writing = writing_.hold();  // until the response is written
  submit(cr, prompt, sources, c);
  admitted.reset();  // submitted: the loop counts it now
  c.id = fmt::format("{}-{}", cr.kind == ApiKind::Chat ? "chatcmpl" : "cmpl", next_id_++);
  c.created = std::time(nullptr);
  c.include_usage = cr.include_usage;
  c.logprobs = cr.sampling.logprobs >= 0 ? model_.tokenizer.get() : nullptr;
  if (!cr.stream) return answer_whole(c, res);
  answer_streamed(c, std::move(writing), res);
}

void HttpServer::submit(const CompletionRequest& cr, const PromptRequest& prompt,
                        const PromptSources& sources, Completion& c) {
  const auto fits = [&](const PromptParts& parts) {
    const int64_t n_prompt = parts.n_flat_tokens();
    if (n_prompt + cr.sampling.max_tokens > model_.n_ctx)
      throw ApiError(
          400,
          fmt::format("the prompt holds {} tokens and max_tokens is {}: more than the context of {}",
                      n_prompt, cr.sampling.max_tokens, model_.n_ctx),
          "invalid_request_error", "max_tokens", "context_length_exceeded");
    return parts;
  };
  if (const std::optional<CorpusSearch> search = corpus_search(prompt, sources)) {
    // Searched here, in stages, so that speculative prefills overlap it.
    SpeculativeSearch::Submitted s = search_->submit(
        search->question, search->top_k,
        [&](const std::vector<RequestDocument>& docs) {
          RagRequest context = cr.rag->context;
          context.documents = docs;
          return fits(request_prompt(prompt, sources, &context));
        },
        c.strategy, cr.sampling);
    c.stream = std::move(s.stream);
    c.clock->search = s.report;
    metrics_.search(s.report);
  } else if (c.strategy == kSubgcache) {
    RagRequest context = request_context(prompt, sources);
    if (context.entities.empty())
      throw ApiError(400,
                     "subgcache clusters GraphRAG subgraphs: give entities with relation paths, or retrieve "
                     "them from the server's knowledge graph (rag.retrieve.from = kg)",
                     "invalid_request_error", "rag.strategy");
    try {
      QueryBatcher::Batched b = batcher_->submit(
          std::move(context),
          [&](const RagRequest& representative) {
            return loop_->submit(std::string(engine_strategy(kSubgcache)),
                                 fits(request_prompt(prompt, sources, &representative)), cr.sampling);
          },
          cr.cache_scope);
      c.stream = std::move(b.stream);
      c.clock->batch = b.report;
    } catch (const PromptError& e) {
      throw bad_request(e.param(), e.what());
    } catch (const Error& e) {
      throw ApiError(e.kind() == ErrorKind::Unavailable ? 503 : 400, e.what(),
                     e.kind() == ErrorKind::Unavailable ? "server_error" : "invalid_request_error");
    }
  } else {
    c.stream = loop_->submit(c.strategy, fits(request_prompt(prompt, sources)), cr.sampling);
  }
}

// A non-streamed answer leaves whole, with its status, when it is done: a
// server that dies meanwhile has sent nothing, so a proxy in front can retry
// the request on another replica, and a failure at any point gets its own
// status. Meanwhile the connection is watched: a client that goes away (while
// its request waits in the queue, say) cancels it.
void HttpServer::answer_whole(const Completion& c, httplib::Response& res) {
  const std::shared_ptr<RequestStream>& stream = c.stream;
  auto watched = Clock::now();
  while (!stream->done()) {
    if (stream->next(std::chrono::milliseconds(200))) c.clock->tick(metrics_);
    if (stream->done() || Clock::now() - watched < std::chrono::milliseconds(200)) continue;
    watched = Clock::now();
    if (!GuardedHttpServer::client_gone()) continue;
    loop_->cancel(stream);
    while (stream->next(std::chrono::seconds(30))) {
    }
    finished(c.id, c.strategy, stream->result(), c.clock->arrived);
    GuardedHttpServer::close_after_response();
    return send_error(res, ApiError(499, "the client closed the connection", "invalid_request_error"));
  }
  while (stream->next(std::chrono::milliseconds(0))) c.clock->tick(metrics_);
  const RequestResult r = stream->result();
  finished(c.id, c.strategy, r, c.clock->arrived);
  if (r.state != RequestState::Finished) throw engine_error(r);
  send_json(res, 200, final_json(c.kind, false, c.id, c.created, model_.name, r, true, *c.clock, c.logprobs));
}

void HttpServer::answer_streamed(const Completion& c, std::shared_ptr<void> writing, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  // A chat stream opens with the assistant's role, as OpenAI's does.
  auto pending = std::make_shared<std::string>(
      c.kind == ApiKind::Chat ? event(completion_json(c.kind, true, c.id, c.created, model_.name, "", {}, {}))
                              : "");
  // Something is written at least every second, so a client that went away
  // is noticed (the write fails) and its request cancelled, even while it
  // waits for its first token: an SSE comment.
  set_chunked_body(
      res, "text/event-stream",
      [this, c, pending, writing](ChunkWriter& sink) {
        const std::shared_ptr<RequestStream>& stream = c.stream;
        std::string out = std::exchange(*pending, {});
        const auto until = Clock::now() + std::chrono::seconds(1);
        while (out.empty() && !stream->done() && Clock::now() < until) {
          const std::optional<TokenEvent> e = stream->next(std::chrono::milliseconds(100));
          if (!e) continue;
          c.clock->tick(metrics_);
          if (!e->text.empty() || (c.logprobs && !e->logprobs.empty()))
            out = event(completion_json(
                c.kind, true, c.id, c.created, model_.name, e->text, {}, {},
                c.logprobs ? logprobs_json(c.kind, *c.logprobs, e->logprobs) : json(nullptr)));
        }
        if (!stream->done()) {
          if (out.empty()) out = ": waiting\n\n";
          return sink.write(out);  // false: the client is gone
        }
        const RequestResult r = stream->result();
        finished(c.id, c.strategy, r, c.clock->arrived);
        c.clock->reported = true;
        // The status is sent; a failure this late is told in the stream.
        out +=
            event(r.state == RequestState::Finished ? final_json(c.kind, true, c.id, c.created, model_.name,
                                                                 r, c.include_usage, *c.clock, c.logprobs)
                                                    : error_body(engine_error(r)));
        out += "data: [DONE]\n\n";
        return sink.write(out) && sink.finish();
      },
      [this, c](bool success) {
        if (success || c.clock->reported) return;
        loop_->cancel(c.stream);  // the client went away: free its rows and pins
        while (c.stream->next(std::chrono::seconds(30))) {
        }
        finished(c.id, c.strategy, c.stream->result(), c.clock->arrived);
      });
}

}  // namespace depcache

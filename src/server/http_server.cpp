#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <ctime>
#include <random>

#include "server/openai.h"
#include "server/request_prompt.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache {
namespace {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
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

std::string event(const json& j) { return "data: " + j.dump() + "\n\n"; }

// Times a request's tokens for the latency histograms, and its corpus search.
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

// The final response or chunk: OpenAI's, plus the server's timings.
json final_json(ApiKind kind, bool chunk, const std::string& id, int64_t created, const std::string& model,
                const RequestResult& r, bool include_usage, const TokenClock& clock) {
  json j = completion_json(kind, chunk, id, created, model, chunk ? "" : r.text, r.finish_reason,
                           include_usage ? std::optional<Usage>(usage_of(r)) : std::nullopt);
  j["timings"] = timings_json(r, clock);
  return j;
}

const char* state_name(RequestState s) {
  switch (s) {
    case RequestState::Finished:
      return "finished";
    case RequestState::Cancelled:
      return "cancelled";
    case RequestState::Failed:
      return "failed";
    default:
      return "running";
  }
}

}  // namespace

HttpServer::HttpServer(const ServerOptions& options)
    : options_(options), http_(std::make_unique<httplib::Server>()), started_(std::time(nullptr)) {
  const int threads = std::max(options_.http_threads, 1);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  routes();
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
      ttft_ms, total_s * 1000, state_name(r.state), r.error.empty() ? "" : ": " + r.error);
}

void HttpServer::routes() {
  http_->set_logger(
      [this](const httplib::Request&, const httplib::Response& res) { metrics_.response(res.status); });
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health" || req.path == "/metrics") return httplib::Server::HandlerResponse::Unhandled;
    if (!options_.api_key.empty() && req.get_header_value("Authorization") != "Bearer " + options_.api_key) {
      send_error(res, ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)",
                               "invalid_request_error", {}, "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (draining_) {
      send_error(res, ApiError(503, "the server is shutting down", "server_error"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!ready_.load(std::memory_order_acquire)) {
      send_error(res, ApiError(503, "the model is still loading", "server_error"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Errors httplib answers itself (413, 404 of unknown paths, 400 of bad
  // HTTP) get an OpenAI error body too.
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413)
      send_error(res, ApiError(413, "the request body is larger than the server accepts (--max-body)"));
    else if (res.status == 404)
      send_error(res, ApiError(404, fmt::format("no such endpoint: {} {}", req.method, req.path)));
    else
      send_error(res, ApiError(res.status, fmt::format("HTTP error {}", res.status)));
  });
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, e.what(), "server_error"));
    }
  });

  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) return send_json(res, 503, {{"status", "draining"}});
    if (!ready_.load(std::memory_order_acquire)) return send_json(res, 503, {{"status", "loading"}});
    send_json(res, 200, {{"status", "ok"}});
  });

  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const EngineSnapshot engine =
        ready_.load(std::memory_order_acquire) ? loop_->snapshot() : EngineSnapshot{};
    res.set_content(metrics_.render(engine), "text/plain; version=0.0.4");
  });

  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", json::array({{{"id", model_.name},
                                      {"object", "model"},
                                      {"created", started_},
                                      {"owned_by", "depcache"}}})}});
  });

  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    const auto arrived = Clock::now();
    thread_local std::mt19937_64 rng(std::random_device{}());
    complete(parse_completion_request(req.body, rng()), res, arrived);
  });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    const auto arrived = Clock::now();
    thread_local std::mt19937_64 rng(std::random_device{}());
    complete(parse_chat_request(req.body, rng()), res, arrived);
  });
}

void HttpServer::complete(const CompletionRequest& cr, httplib::Response& res, Clock::time_point arrived) {
  if (!cr.model.empty() && cr.model != model_.name)
    throw ApiError(
        404,
        fmt::format("the model '{}' is not served here (this server serves '{}')", cr.model, model_.name),
        "invalid_request_error", "model", "model_not_found");
  if (options_.max_queue > 0 && loop_->snapshot().waiting >= options_.max_queue)
    throw ApiError(
        429,
        fmt::format("the server is at capacity ({} requests waiting); retry shortly", options_.max_queue),
        "server_error", {}, "queue_full");
  const PromptSources sources{model_.tokenizer.get(), model_.chat, model_.corpus, model_.graph,
                              model_.prompt};
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
  // A plain request on a server whose default is subgcache (a batch mode of
  // GraphRAG requests) runs under prefix, as it would by default.
  std::string strategy = cr.rag && !cr.rag->strategy.empty() ? cr.rag->strategy : options_.strategy;
  if (!cr.rag && strategy == kSubgcache) strategy = "prefix";
  const auto clock = std::make_shared<TokenClock>();
  clock->arrived = clock->last = arrived;
  std::shared_ptr<void> writing = writing_.hold();  // until the response is written
  std::shared_ptr<RequestStream> stream;
  if (const std::optional<CorpusSearch> search = corpus_search(cr, sources)) {
    // Searched here, in stages, so that speculative prefills overlap it.
    SpeculativeSearch::Submitted s = search_->submit(
        search->question, search->top_k,
        [&](const std::vector<RequestDocument>& docs) {
          RagRequest context = cr.rag->context;
          context.documents = docs;
          return fits(request_prompt(cr, sources, &context));
        },
        strategy, cr.sampling);
    stream = std::move(s.stream);
    clock->search = s.report;
    metrics_.search(s.report);
  } else if (strategy == kSubgcache) {
    RagRequest context = request_context(cr, sources);
    if (context.entities.empty())
      throw ApiError(400,
                     "subgcache clusters GraphRAG subgraphs: give entities with relation paths, or retrieve "
                     "them from the server's knowledge graph (rag.retrieve.from = kg)",
                     "invalid_request_error", "rag.strategy");
    try {
      QueryBatcher::Batched b = batcher_->submit(std::move(context), [&](const RagRequest& representative) {
        return loop_->submit("prefix", fits(request_prompt(cr, sources, &representative)), cr.sampling);
      });
      stream = std::move(b.stream);
      clock->batch = b.report;
    } catch (const Error& e) {
      throw ApiError(e.kind() == ErrorKind::Unavailable ? 503 : 400, e.what(),
                     e.kind() == ErrorKind::Unavailable ? "server_error" : "invalid_request_error");
    }
  } else {
    stream = loop_->submit(strategy, fits(request_prompt(cr, sources)), cr.sampling);
  }
  const std::string id = fmt::format("{}-{}", cr.kind == ApiKind::Chat ? "chatcmpl" : "cmpl", next_id_++);
  const int64_t created = std::time(nullptr);
  const ApiKind kind = cr.kind;
  const bool streaming = cr.stream, include_usage = cr.include_usage;
  if (!streaming) {
    // Until the first token the status is open: a request that ends before
    // it (a failure, usually) is answered with its own status.
    if (stream->next()) {
      clock->tick(metrics_);
    } else {
      const RequestResult r = stream->result();
      finished(id, strategy, r, arrived);
      if (r.state != RequestState::Finished) throw engine_error(r);
      return send_json(res, 200, final_json(kind, false, id, created, model_.name, r, true, *clock));
    }
  }
  res.set_header("Cache-Control", "no-cache");
  // A chat stream opens with the assistant's role, as OpenAI's does.
  auto pending = std::make_shared<std::string>(
      streaming && kind == ApiKind::Chat
          ? event(completion_json(kind, true, id, created, model_.name, "", {}, {}))
          : "");
  // Something is written at least every second, so a client that went away
  // is noticed (the write fails) and its request cancelled, even while it
  // waits for its first token or for a whole (non-streamed) answer: an SSE
  // comment when streaming, else a space before the JSON.
  res.set_chunked_content_provider(
      streaming ? "text/event-stream" : "application/json",
      [this, stream, id, strategy, created, kind, streaming, include_usage, clock, pending, writing](
          size_t, httplib::DataSink& sink) {
        std::string out = std::exchange(*pending, {});
        const auto until = Clock::now() + std::chrono::seconds(1);
        while (out.empty() && !stream->done() && Clock::now() < until) {
          const std::optional<TokenEvent> e = stream->next(std::chrono::milliseconds(100));
          if (!e) continue;
          clock->tick(metrics_);
          if (streaming && !e->text.empty())
            out = event(completion_json(kind, true, id, created, model_.name, e->text, {}, {}));
        }
        if (!stream->done()) {
          if (out.empty()) out = streaming ? ": waiting\n\n" : " ";
          return sink.write(out.data(), out.size());  // false: the client is gone
        }
        const RequestResult r = stream->result();
        finished(id, strategy, r, clock->arrived);
        clock->reported = true;
        if (!streaming) {
          // The status is sent; a failure this late is told in the body.
          out = (r.state == RequestState::Finished
                     ? final_json(kind, false, id, created, model_.name, r, true, *clock)
                     : error_body(engine_error(r)))
                    .dump();
        } else {
          out += event(r.state == RequestState::Finished
                           ? final_json(kind, true, id, created, model_.name, r, include_usage, *clock)
                           : error_body(engine_error(r)));
          out += "data: [DONE]\n\n";
        }
        if (!sink.write(out.data(), out.size())) return false;
        sink.done();
        return true;
      },
      [this, stream, id, strategy, arrived, clock](bool success) {
        if (success || clock->reported) return;
        loop_->cancel(stream);  // the client went away: free its rows and pins
        while (stream->next(std::chrono::seconds(30))) {
        }
        finished(id, strategy, stream->result(), arrived);
      });
}

}  // namespace depcache

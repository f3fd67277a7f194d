#include "server/http_server.h"

#include <httplib.h>

#include <ctime>
#include <random>

#include "server/openai.h"
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
      break;
  }
  return ApiError(500, r.error, "server_error");
}

Usage usage_of(const RequestResult& r) {
  return {r.report.prompt_tokens, static_cast<int64_t>(r.tokens.size()), r.report.computed_tokens,
          r.report.reused_tokens};
}

std::string event(const json& j) { return "data: " + j.dump() + "\n\n"; }

// Times a request's tokens for the latency histograms.
struct TokenClock {
  Clock::time_point arrived, last;
  bool any = false;
  bool reported = false;  // finished() was called
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
  routes();
}

HttpServer::~HttpServer() {
  if (listener_.joinable()) {
    http_->stop();
    listener_.join();
  }
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
  listener_ = std::thread([this] { http_->listen_after_bind(); });
  return port;
}

void HttpServer::ready(std::string model_name, std::shared_ptr<const Tokenizer> tokenizer, EngineLoop& loop,
                       int64_t n_ctx) {
  model_name_ = std::move(model_name);
  tokenizer_ = std::move(tokenizer);
  loop_ = &loop;
  n_ctx_ = n_ctx;
  ready_.store(true, std::memory_order_release);
}

bool HttpServer::shutdown(std::chrono::steady_clock::time_point deadline) {
  draining_ = true;
  const bool in_time = !ready_ || loop_->drain(deadline);
  http_->stop();
  if (listener_.joinable()) listener_.join();
  return in_time;
}

void HttpServer::finished(const std::string& id, const RequestResult& r, Clock::time_point arrived) {
  const double total_s = seconds_since(arrived);
  metrics_.request_done(r, total_s);
  const double ttft_ms =
      r.tokens.empty() ? -1 : std::chrono::duration<double, std::milli>(r.first_token - arrived).count();
  fmt::print(
      stderr,
      "{} strategy={} prompt={} computed={} reused={} generated={} ttft_ms={:.1f} total_ms={:.1f} {}{}\n", id,
      options_.strategy, r.report.prompt_tokens, r.report.computed_tokens, r.report.reused_tokens,
      r.tokens.size(), ttft_ms, total_s * 1000, state_name(r.state), r.error.empty() ? "" : ": " + r.error);
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
               {"data", json::array({{{"id", model_name_},
                                      {"object", "model"},
                                      {"created", started_},
                                      {"owned_by", "depcache"}}})}});
  });

  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    const auto arrived = Clock::now();
    thread_local std::mt19937_64 rng(std::random_device{}());
    const CompletionRequest cr = parse_completion_request(req.body, rng());
    if (!cr.model.empty() && cr.model != model_name_)
      throw ApiError(
          404,
          fmt::format("the model '{}' is not served here (this server serves '{}')", cr.model, model_name_),
          "invalid_request_error", "model", "model_not_found");
    PromptParts parts;
    parts.task = tokenizer_->encode(cr.prompt, true, true);
    const auto n_prompt = static_cast<int64_t>(parts.task.size());
    if (n_prompt + cr.sampling.max_tokens > n_ctx_)
      throw ApiError(
          400,
          fmt::format("the prompt holds {} tokens and max_tokens is {}: more than the context of {}",
                      n_prompt, cr.sampling.max_tokens, n_ctx_),
          "invalid_request_error", "max_tokens", "context_length_exceeded");
    std::shared_ptr<RequestStream> stream = loop_->submit(options_.strategy, std::move(parts), cr.sampling);
    const std::string id = fmt::format("cmpl-{}", next_id_++);
    const int64_t created = std::time(nullptr);
    if (!cr.stream) {
      TokenClock clock{arrived, arrived};
      while (stream->next()) clock.tick(metrics_);
      const RequestResult r = stream->result();
      finished(id, r, arrived);
      if (r.state != RequestState::Finished) throw engine_error(r);
      return send_json(res, 200,
                       completion_json(id, created, model_name_, r.text, r.finish_reason, usage_of(r)));
    }
    const bool include_usage = cr.include_usage;
    const auto clock = std::make_shared<TokenClock>(TokenClock{arrived, arrived});
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, stream, id, created, include_usage, clock](size_t, httplib::DataSink& sink) {
          const std::optional<TokenEvent> e = stream->next(std::chrono::milliseconds(100));
          if (e) {
            clock->tick(metrics_);
            if (e->text.empty()) return true;
            const std::string out = event(completion_json(id, created, model_name_, e->text, {}, {}));
            return sink.write(out.data(), out.size());  // false: the client is gone
          }
          if (!stream->done()) return !sink.is_writable || sink.is_writable();
          const RequestResult r = stream->result();
          finished(id, r, clock->arrived);
          clock->reported = true;
          std::string out;
          if (r.state == RequestState::Finished) {
            out = event(completion_json(id, created, model_name_, "", r.finish_reason,
                                        include_usage ? std::optional<Usage>(usage_of(r)) : std::nullopt));
          } else {
            out = event(error_body(engine_error(r)));
          }
          out += "data: [DONE]\n\n";
          if (!sink.write(out.data(), out.size())) return false;
          sink.done();
          return true;
        },
        [this, stream, id, arrived, clock](bool success) {
          if (success || clock->reported) return;
          loop_->cancel(stream);  // the client went away: free its rows and pins
          while (stream->next(std::chrono::seconds(30))) {
          }
          finished(id, stream->result(), arrived);
        });
  });
}

}  // namespace depcache

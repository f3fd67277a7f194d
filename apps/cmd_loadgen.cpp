// `depcache loadgen`: replays a request file against a running server over
// HTTP, as a RAG service's clients would: each request streamed from
// /v1/completions (or /v1/chat/completions) with its context in the RAG
// extension, at the file's arrival times, a Poisson rate, or as fast as the
// clients allow. Reports TTFT and end-to-end latency from arrival, throughput,
// SLO attainment and the server's reuse; exits non-zero when any request
// failed, so it doubles as a load test. With --hostile, hostile clients are
// mixed in (slow senders, malformed and oversized bodies, garbage): the
// figures of the normal requests show what they cost the others.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_common.h"
#include "commands.h"
#include "eval/answers.h"
#include "eval/stats.h"
#include "retrieval/rag_request.h"
#include "retrieval/workload.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache::cli {
namespace {

using nlohmann::json;

struct LoadOptions {
  std::string url = "http://127.0.0.1:8080", requests_path, strategy = "depcache", api_key, json_path;
  size_t limit = 0, concurrency = 32, plain_every = 0;
  size_t retrieve = 0;  // > 0: the server searches its corpus for this many chunks
  double rate = 0, rate_scale = 0, slo_ms = 0, timeout_s = 600;
  double hostile = 0;  // share of all connections that are hostile
  int max_tokens = 4;
  uint64_t seed = 1;
  bool chat = false, stop_at_eos = false;
};

struct Outcome {
  int status = 0;                                    // HTTP status; 0: no answer
  std::string error;                                 // empty: answered in full
  double start_s = 0, ttft_s = -1, end_s = 0;        // from the run's start; ttft from arrival
  double server_ttft_ms = -1, server_total_ms = -1;  // the server's own, from its "timings"
  int64_t prompt = 0, computed = 0, reused = 0, generated = 0;
  bool plain = false;
  // The server's corpus search (timings.search), when it ran one.
  double search_ms = -1, non_overlapped_ms = -1;
  int speculations = 0;
  bool accepted = false;
  std::string text;  // the answer as streamed
};

json request_body(const RagRequest& r, const LoadOptions& o, bool plain) {
  const std::string question = r.question.empty() ? r.text : r.question;
  json body = {{"max_tokens", o.max_tokens},
               {"temperature", 0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", !o.stop_at_eos}};
  if (o.chat)
    body["messages"] = json::array({{{"role", "user"}, {"content", question}}});
  else
    body["prompt"] = question;
  if (plain) return body;
  if (o.retrieve > 0) {
    body["rag"] = {{"strategy", o.strategy}, {"retrieve", {{"from", "corpus"}, {"top_k", o.retrieve}}}};
    return body;
  }
  json rag = request_to_json(r);
  for (const char* k : {"id", "arrival_s", "question", "answers"}) rag.erase(k);
  if (r.question.empty()) rag.erase("text");  // the text is the question
  rag["strategy"] = o.strategy;
  body["rag"] = std::move(rag);
  return body;
}

// The server's own figures a stream event carries: its timings and token counts.
void read_server_figures(const json& j, Outcome& out) {
  if (j.contains("timings") && j["timings"].is_object()) {
    const json& t = j["timings"];
    if (t.contains("ttft_ms") && t["ttft_ms"].is_number()) out.server_ttft_ms = t["ttft_ms"];
    if (t.contains("total_ms") && t["total_ms"].is_number()) out.server_total_ms = t["total_ms"];
    if (t.contains("search") && t["search"].is_object()) {
      const json& sj = t["search"];
      out.search_ms = sj.value("search_ms", -1.0);
      out.non_overlapped_ms = sj.value("non_overlapped_ms", -1.0);
      out.speculations = sj.value("speculations", 0);
      out.accepted = sj.value("accepted", false);
    }
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    const json& u = j["usage"];
    out.prompt = u.value("prompt_tokens", 0);
    out.generated = u.value("completion_tokens", 0);
    out.computed = u.value("computed_tokens", 0);
    out.reused = u.value("reused_tokens", 0);
  }
}

// One request, streamed; the outcome's times are filled in by the caller's clock.
Outcome send(httplib::Client& client, const std::string& path, const httplib::Headers& headers,
             const json& body, Clock::time_point t0, double arrival_s) {
  Outcome out;
  out.start_s = seconds_since(t0);
  std::string pending, error_body;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& res) {
    out.status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (out.status != 200) {
      error_body.append(data, n);
      return true;
    }
    pending.append(data, n);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      const std::string ev = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (!ev.starts_with("data: ") || ev == "data: [DONE]")
        continue;  // comments keep the connection checked
      const json j = json::parse(ev.substr(6), nullptr, false);
      if (j.is_discarded()) {
        out.error = "a stream event is not JSON";
        continue;
      }
      if (j.contains("error")) {
        out.error = j["error"].value("message", "error");
        continue;
      }
      const json& choice = j["choices"][0];
      const json& piece =
          choice.contains("text") ? choice["text"] : choice["delta"].value("content", json(""));
      if (piece.is_string()) out.text += piece.get<std::string>();
      if (out.ttft_s < 0 && piece.is_string() && !piece.get<std::string>().empty())
        out.ttft_s = seconds_since(t0) - arrival_s;
      read_server_figures(j, out);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  if (!client.send(req, res, err)) {
    out.error = fmt::format("no answer: {}", httplib::to_string(err));
  } else if (out.status != 200) {
    const json j = json::parse(error_body, nullptr, false);
    out.error = fmt::format(
        "HTTP {}: {}", out.status,
        j.is_object() && j.contains("error") ? j["error"].value("message", error_body) : error_body);
  } else if (out.error.empty() && out.prompt == 0) {
    out.error = "the stream ended without usage (cut short?)";
  }
  out.end_s = seconds_since(t0);
  if (out.ttft_s < 0 && out.error.empty()) out.ttft_s = out.end_s - arrival_s;  // no text: its end
  return out;
}

// The hostile clients --hostile mixes in, in turn.
enum class Hostile { SlowSender, InvalidUtf8, DeepNesting, HugeNumber, ChunkedFlood, Garbage, kCount };
const char* hostile_name(Hostile h) {
  switch (h) {
    case Hostile::SlowSender:
      return "slow sender";
    case Hostile::InvalidUtf8:
      return "invalid UTF-8";
    case Hostile::DeepNesting:
      return "deep nesting";
    case Hostile::HugeNumber:
      return "1e400";
    case Hostile::ChunkedFlood:
      return "chunked flood";
    default:
      return "garbage";
  }
}

// host:port of an http:// URL.
std::pair<std::string, int> url_address(const std::string& url) {
  std::string rest = url.starts_with("http://") ? url.substr(7) : url;
  rest = rest.substr(0, rest.find('/'));
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return {rest, 80};
  return {rest.substr(0, colon), std::atoi(rest.c_str() + colon + 1)};
}

// One hostile client: connects, misbehaves, returns the status the server
// answered (0: none, the connection was closed or reset).
int hostile_exchange(const std::string& host, int port, Hostile kind, double limit_s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return 0;
  }
  const auto send_all = [&](std::string_view b) {
    while (!b.empty()) {
      const ssize_t n = ::send(fd, b.data(), b.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      b.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  };
  const auto post = [](const std::string& body) {
    return fmt::format(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
        "application/json\r\nContent-Length: {}\r\n\r\n{}",
        body.size(), body);
  };
  const Clock::time_point t0 = Clock::now();
  switch (kind) {
    case Hostile::SlowSender:
      // A byte a second until the server gives up on it.
      send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
      while (seconds_since(t0) < limit_s && send_all("X")) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 1000) > 0) break;
      }
      break;
    case Hostile::InvalidUtf8:
      send_all(post("{\"prompt\":\"caf\xe9\"}"));
      break;
    case Hostile::DeepNesting:
      send_all(post("{\"prompt\":" + std::string(100000, '[') + std::string(100000, ']') + "}"));
      break;
    case Hostile::HugeNumber:
      send_all(post("{\"prompt\":\"hi\",\"max_tokens\":1e400}"));
      break;
    case Hostile::ChunkedFlood: {
      send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
      const std::string chunk = fmt::format("{:x}\r\n{}\r\n", 1 << 16, std::string(1 << 16, 'a'));
      for (int i = 0; i < 512 && send_all(chunk); ++i) {
      }
      break;
    }
    default: {
      std::string junk(4096, '\0');
      for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>((i * 2654435761u) >> 13);
      send_all(junk);
    }
  }
  std::string reply;
  char buf[4096];
  while (seconds_since(t0) < limit_s) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return reply.starts_with("HTTP/1.1 ") ? std::atoi(reply.c_str() + 9) : 0;
}

// When each request arrives, in seconds from the start: Poisson (--rate),
// the file's times scaled (--rate-scale), or zeros for a closed loop (a
// request then arrives when a client is free).
std::vector<double> arrival_times(const LoadOptions& o, const std::vector<RagRequest>& reqs) {
  std::vector<double> arrival(reqs.size(), 0.0);
  if (o.rate > 0) {
    arrival = poisson_arrivals(reqs.size(), o.rate, o.seed);
  } else if (o.rate_scale > 0) {
    for (size_t i = 0; i < reqs.size(); ++i) arrival[i] = reqs[i].arrival_s / o.rate_scale;
    std::sort(arrival.begin(), arrival.end());
  }
  return arrival;
}

// Before the clients' threads: a clear error when no server is there, and the
// HTTP library's lazily built statics made on this thread (which keeps
// ThreadSanitizer, blind inside the uninstrumented library, from seeing races).
void check_server(const std::string& url) {
  httplib::Client probe(url);
  probe.set_connection_timeout(5);
  const auto health = probe.Get("/health");
  if (!health)
    fail(ErrorKind::Unavailable, "no server answers at {} ({})", url, httplib::to_string(health.error()));
  if (health->status != 200)
    fail(ErrorKind::Unavailable, "{}/health answers {}: {}", url, health->status, health->body);
}

// Hostile clients spread over the normal stream's span, each on a thread of
// its own, bounded in time; join() before reading the statuses.
struct HostileClients {
  std::vector<std::thread> threads;
  std::mutex mu;
  std::map<std::pair<Hostile, int>, size_t> status;  // (kind, status) -> count

  void start(const LoadOptions& o, size_t n_requests, double span, Clock::time_point t0) {
    if (o.hostile <= 0) return;
    const auto n_hostile =
        static_cast<size_t>(std::llround(static_cast<double>(n_requests) * o.hostile / (1 - o.hostile)));
    const auto [host, port] = url_address(o.url);
    for (size_t h = 0; h < n_hostile; ++h) {
      const double at = span * static_cast<double>(h) / static_cast<double>(n_hostile);
      const auto kind = static_cast<Hostile>(h % static_cast<size_t>(Hostile::kCount));
      threads.emplace_back([this, &o, t0, at, kind, host = host, port = port] {
        const double wait = at - seconds_since(t0);
        if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        const int got = hostile_exchange(host, port, kind, std::min(o.timeout_s, 120.0));
        std::lock_guard lk(mu);
        ++status[{kind, got}];
      });
    }
  }
  void join() {
    for (std::thread& t : threads) t.join();
  }
};

// The stream sent by o.concurrency clients; returns each request's outcome.
std::vector<Outcome> send_stream(const LoadOptions& o, const std::vector<RagRequest>& reqs,
                                 std::vector<double>& arrival, const std::string& path,
                                 Clock::time_point t0) {
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  const bool open_loop = o.rate > 0 || o.rate_scale > 0;
  std::vector<Outcome> outcomes(reqs.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> clients;
  for (size_t c = 0; c < std::min(o.concurrency, reqs.size()); ++c) {
    clients.emplace_back([&] {
      httplib::Client client(o.url);
      client.set_connection_timeout(10);
      client.set_read_timeout(static_cast<time_t>(o.timeout_s));
      for (size_t i; (i = next++) < reqs.size();) {
        if (open_loop) {
          const double wait = arrival[i] - seconds_since(t0);
          if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        } else {
          arrival[i] = seconds_since(t0);  // closed loop: a request arrives when a client is free
        }
        const bool plain = o.plain_every > 0 && i % o.plain_every == o.plain_every - 1;
        outcomes[i] = send(client, path, headers, request_body(reqs[i], o, plain), t0, arrival[i]);
        outcomes[i].plain = plain;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  return outcomes;
}

// The answered requests' figures. TTFT to the first token: the wait before
// the request could be sent plus the server's own TTFT (a token that
// completes no character yet sends no text, so with byte-level tokens the
// first text can come much later).
struct Tally {
  std::vector<double> ttft, token_ttft, e2e, server_ttft, http_ms, search_ms, non_overlapped_ms;
  int64_t speculations = 0, accepted = 0;
  std::map<std::string, size_t> errors;
  int64_t prompt = 0, computed = 0, reused = 0, generated = 0;
  // Answered requests that carry reference answers, judged as run judges them.
  int64_t scored = 0, exact = 0;
  double f1 = 0;
};

Tally tally(const std::vector<Outcome>& outcomes, const std::vector<double>& arrival,
            const std::vector<RagRequest>& reqs) {
  Tally t;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const Outcome& r = outcomes[i];
    if (!r.error.empty()) {
      ++t.errors[r.error.substr(0, 120)];
      continue;
    }
    if (!reqs[i].answers.empty() && !r.plain) {
      const std::string answer = answer_of_text(r.text);
      ++t.scored;
      t.exact += answer_matches(answer, reqs[i].answers) ? 1 : 0;
      t.f1 += answer_f1(answer, reqs[i].answers);
    }
    t.ttft.push_back(r.ttft_s * 1000);
    t.e2e.push_back((r.end_s - arrival[i]) * 1000);
    if (r.server_ttft_ms >= 0) {
      t.server_ttft.push_back(r.server_ttft_ms);
      t.token_ttft.push_back((r.start_s - arrival[i]) * 1000 + r.server_ttft_ms);
    }
    if (r.server_total_ms >= 0) t.http_ms.push_back((r.end_s - r.start_s) * 1000 - r.server_total_ms);
    t.prompt += r.prompt, t.computed += r.computed, t.reused += r.reused, t.generated += r.generated;
    if (r.search_ms >= 0) {
      t.search_ms.push_back(r.search_ms);
      t.non_overlapped_ms.push_back(r.non_overlapped_ms);
      t.speculations += r.speculations;
      t.accepted += r.accepted ? 1 : 0;
    }
  }
  return t;
}

// The staged search's lines (requests that searched the server's corpus).
void print_search(const Tally& t) {
  fmt::print("server search ms:     mean {:.2f} p50 {:.2f} p99 {:.2f}\n", mean(t.search_ms),
             percentile(t.search_ms, 50), percentile(t.search_ms, 99));
  fmt::print(
      "non-overlapped ms:    mean {:.2f} p50 {:.2f} p99 {:.2f} (search time before the answering "
      "prefill started)\n",
      mean(t.non_overlapped_ms), percentile(t.non_overlapped_ms, 50), percentile(t.non_overlapped_ms, 99));
  fmt::print("speculation: {} prefills started, {} of {} searches answered by one\n", t.speculations,
             t.accepted, t.search_ms.size());
}

// Latencies, throughput and reuse of the answered requests.
void print_figures(const LoadOptions& o, const Tally& t, double wall_s) {
  // The SLO is on TTFT to the first token where the server tells it (as run measures it).
  const std::vector<double>& slo_ttft = t.token_ttft.size() == t.ttft.size() ? t.token_ttft : t.ttft;
  const double slo = o.slo_ms > 0 ? o.slo_ms : 0;
  const auto within = std::count_if(slo_ttft.begin(), slo_ttft.end(), [&](double x) { return x <= slo; });
  if (!t.token_ttft.empty())
    fmt::print("TTFT ms (first token): p50 {:.1f} p90 {:.1f} p99 {:.1f} max {:.1f}\n",
               percentile(t.token_ttft, 50), percentile(t.token_ttft, 90), percentile(t.token_ttft, 99),
               percentile(t.token_ttft, 100));
  fmt::print("TTFT ms (first text):  p50 {:.1f} p90 {:.1f} p99 {:.1f} max {:.1f}\n", percentile(t.ttft, 50),
             percentile(t.ttft, 90), percentile(t.ttft, 99), percentile(t.ttft, 100));
  fmt::print("end to end ms:        p50 {:.1f} p99 {:.1f}\n", percentile(t.e2e, 50), percentile(t.e2e, 99));
  if (!t.server_ttft.empty())
    fmt::print(
        "server TTFT ms:       p50 {:.1f} p99 {:.1f} (from arrival at the server to the first token)\n",
        percentile(t.server_ttft, 50), percentile(t.server_ttft, 99));
  if (!t.http_ms.empty())
    fmt::print("HTTP layer ms:        p50 {:.1f} p99 {:.1f} (sent to received, less the server's time)\n",
               percentile(t.http_ms, 50), percentile(t.http_ms, 99));
  fmt::print("served {:.3f} req/s, {:.1f} generated tok/s over {:.1f} s\n", t.ttft.size() / wall_s,
             t.generated / wall_s, wall_s);
  fmt::print("prompt tokens {}: computed {}, reused {} ({:.1f}%)\n", t.prompt, t.computed, t.reused,
             t.prompt ? 100.0 * t.reused / t.prompt : 0.0);
  if (t.scored > 0)
    fmt::print("answers: {} of {} exact ({:.1f}%), token F1 {:.3f}; the text up to a newline or its end\n",
               t.exact, t.scored, 100.0 * t.exact / t.scored, t.f1 / t.scored);
  if (!t.search_ms.empty()) print_search(t);
  if (slo > 0)
    fmt::print("within the SLO (TTFT to the {} <= {} ms): {:.1f}%\n",
               &slo_ttft == &t.token_ttft ? "first token" : "first text", slo,
               100.0 * within / t.ttft.size());
}

// One JSON line per request (--json).
void write_rows(const std::string& json_path, const std::vector<RagRequest>& reqs,
                const std::vector<Outcome>& outcomes, const std::vector<double>& arrival) {
  std::ofstream out = open_output(json_path);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Outcome& r = outcomes[i];
    json row = {
        {"id", reqs[i].id},
        {"plain", r.plain},
        {"arrival_s", arrival[i]},
        {"start_s", r.start_s},
        {"status", r.status},
        {"error", r.error},
        {"ttft_ms", r.error.empty() ? r.ttft_s * 1000 : -1},
        {"server_ttft_ms", r.server_ttft_ms},
        {"ttft_token_ms",
         r.error.empty() && r.server_ttft_ms >= 0 ? (r.start_s - arrival[i]) * 1000 + r.server_ttft_ms : -1},
        {"server_total_ms", r.server_total_ms},
        {"e2e_ms", (r.end_s - arrival[i]) * 1000},
        {"prompt_tokens", r.prompt},
        {"computed_tokens", r.computed},
        {"reused_tokens", r.reused},
        {"generated_tokens", r.generated},
        {"search_ms", r.search_ms},
        {"non_overlapped_ms", r.non_overlapped_ms},
        {"speculations", r.speculations},
        {"accepted", r.accepted},
        {"text", r.text}};
    if (!reqs[i].answers.empty() && !r.plain && r.error.empty()) {
      const std::string answer = answer_of_text(r.text);
      row["answer"] = answer;
      row["exact_match"] = answer_matches(answer, reqs[i].answers);
      row["f1"] = answer_f1(answer, reqs[i].answers);
    }
    out << row.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  }
}

void run(const LoadOptions& o) {
  std::vector<RagRequest> reqs = read_requests(o.requests_path);
  if (o.limit > 0 && reqs.size() > o.limit) reqs.resize(o.limit);
  if (reqs.empty()) fail(ErrorKind::InvalidInput, "{} holds no requests", o.requests_path);
  std::vector<double> arrival = arrival_times(o, reqs);
  const bool open_loop = o.rate > 0 || o.rate_scale > 0;
  check_server(o.url);
  const std::string path = o.chat ? "/v1/chat/completions" : "/v1/completions";
  const Clock::time_point t0 = Clock::now();
  HostileClients hostile;
  hostile.start(o, reqs.size(), open_loop && !arrival.empty() ? std::max(arrival.back(), 1.0) : 1.0, t0);
  const std::vector<Outcome> outcomes = send_stream(o, reqs, arrival, path, t0);
  const double wall_s = seconds_since(t0);
  hostile.join();

  const Tally t = tally(outcomes, arrival, reqs);
  const size_t n_failed = reqs.size() - t.ttft.size();
  fmt::print("{} requests to {}{} ({}, {} clients, {}): {} answered, {} failed\n", reqs.size(), o.url, path,
             o.plain_every ? fmt::format("strategy {}, 1 in {} plain", o.strategy, o.plain_every)
                           : fmt::format("strategy {}", o.strategy),
             std::min(o.concurrency, reqs.size()),
             o.rate > 0         ? fmt::format("Poisson {}/s", o.rate)
             : o.rate_scale > 0 ? fmt::format("the file's arrivals / {}", o.rate_scale)
                                : std::string("closed loop"),
             t.ttft.size(), n_failed);
  for (const auto& [what, n] : t.errors) fmt::print("  {} x {}\n", n, what);
  if (!hostile.threads.empty()) {
    fmt::print("{} hostile clients mixed in (HTTP status they got; 0: closed without one):\n",
               hostile.threads.size());
    for (const auto& [key, n] : hostile.status)
      fmt::print("  {} x {}: {}\n", n, hostile_name(key.first), key.second);
  }
  if (!t.ttft.empty()) print_figures(o, t, wall_s);
  if (!o.json_path.empty()) write_rows(o.json_path, reqs, outcomes, arrival);
  if (n_failed > 0) fail(ErrorKind::Unavailable, "{} of {} requests failed", n_failed, reqs.size());
}

}  // namespace

void add_loadgen_command(CLI::App& app) {
  static LoadOptions o;
  CLI::App* cmd = app.add_subcommand(
      "loadgen",
      "Replay a request file against a running `depcache serve` over HTTP and report latency and reuse");
  cmd->add_option("--url", o.url, "Server address")->capture_default_str();
  cmd->add_option("--requests", o.requests_path, "Request file (JSONL, as `workload generate` writes)")
      ->required();
  cmd->add_option("--limit", o.limit, "Send at most this many requests (0: all)")->capture_default_str();
  cmd->add_option("-s,--strategy", o.strategy, "Reuse strategy each request asks for (rag.strategy)")
      ->capture_default_str();
  cmd->add_option("--plain-every", o.plain_every,
                  "Send every Kth request as a plain completion of its question, without context (0: none)")
      ->capture_default_str();
  cmd->add_option("--retrieve", o.retrieve,
                  "Send only each question and let the server search its corpus (serve --corpus) for this "
                  "many chunks (0: send the file's context)")
      ->capture_default_str();
  cmd->add_flag("--stop-at-eos", o.stop_at_eos,
                "Let the model end an answer early (default: exactly --max-tokens, as run generates)");
  cmd->add_flag("--chat", o.chat, "Send chat completions (the question as the user's message)");
  cmd->add_option("--concurrency", o.concurrency, "Clients, each with one request in flight at most")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{4096}));
  cmd->add_option("--rate", o.rate,
                  "Poisson arrivals at this many requests/s (default: as fast as the clients go)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--rate-scale", o.rate_scale,
                  "Use the file's arrival times divided by this (1: as written, 2: twice the load)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o.seed, "Seed of --rate's arrivals")->capture_default_str();
  cmd->add_option("-n,--max-tokens", o.max_tokens, "Tokens generated per request")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--slo-ms", o.slo_ms, "Report the share of requests with TTFT within this")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--timeout", o.timeout_s, "Seconds a request may take before it counts as failed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--api-key", o.api_key, "Sent as 'Authorization: Bearer KEY'");
  cmd->add_option("--hostile", o.hostile,
                  "Share of connections that are hostile, mixed into the stream: slow senders, bodies with "
                  "invalid UTF-8, 100,000-deep nesting or 1e400, chunked floods, garbage (the report counts "
                  "what they got; only the normal requests count in the figures)")
      ->check(CLI::Range(0.0, 0.9));
  cmd->add_option("--json", o.json_path, "Write per-request rows (JSONL) to this file");
  cmd->callback([] {
    if (o.rate > 0 && o.rate_scale > 0)
      throw CLI::ValidationError("--rate", "give --rate or --rate-scale, not both");
    run(o);
  });
}

}  // namespace depcache::cli

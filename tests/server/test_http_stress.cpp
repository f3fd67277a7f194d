// Many clients at once on the `depcache serve` binary, from its first
// request on: streamed and whole completions of distinct prompts over
// keep-alive connections, beside requests that reach the HTTP library's
// other request paths (Range headers, multipart bodies). Every reply is read
// by a strict HTTP/1.1 parser (chunk framing byte for byte, so that a
// connection can carry the next request), every byte a client gets must be
// its own (its request's id in every event, its text equal to what the same
// prompt gets alone), and a SIGTERM under the same load drains every stream
// whole and exits 0. Under ThreadSanitizer a report ends the server with
// exit code 66, which fails the test.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/server_client.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using nlohmann::json;
using test::curl;
using test::post;
using test::sample;
using test::ServeProcess;
using Clock = std::chrono::steady_clock;

// A parsed response, or the reason it could not be parsed.
struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;                            // de-chunked
  bool chunked = false;
  std::string error;  // empty when the bytes were a well-formed response
};

// A keep-alive HTTP/1.1 client connection that reads responses strictly: a
// Content-Length body exactly, or chunks whose size lines, data and CRLFs
// are all where they must be, ending with the zero chunk and its CRLF.
class Connection {
 public:
  explicit Connection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~Connection() {
    if (fd_ >= 0) ::close(fd_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  Response exchange(const std::string& request) {
    Response r;
    if (fd_ < 0) return fail(r, "no connection");
    for (std::string_view rest = request; !rest.empty();) {
      const ssize_t n = ::send(fd_, rest.data(), rest.size(), MSG_NOSIGNAL);
      if (n <= 0) return fail(r, "the request could not be sent");
      rest.remove_prefix(static_cast<size_t>(n));
    }
    const std::optional<std::string> head = until("\r\n\r\n");
    if (!head) return fail(r, "no response head");
    if (!head->starts_with("HTTP/1.1 ") || head->size() < 12) return fail(r, "bad status line: " + *head);
    r.status = std::stoi(head->substr(9, 3));
    for (size_t at = head->find("\r\n") + 2; at < head->size();) {
      const size_t end = head->find("\r\n", at);
      const std::string line = head->substr(at, end - at);
      at = end + 2;
      if (line.empty()) break;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) return fail(r, "bad header line: " + line);
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      const size_t value = line.find_first_not_of(' ', colon + 1);
      if (!r.headers.emplace(name, value == std::string::npos ? "" : line.substr(value)).second)
        return fail(r, "header given twice: " + name);
    }
    if (r.headers.contains("transfer-encoding")) {
      if (r.headers["transfer-encoding"] != "chunked" || r.headers.contains("content-length"))
        return fail(r, "bad framing headers");
      r.chunked = true;
      for (;;) {
        const std::optional<std::string> size_line = until("\r\n");
        if (!size_line || size_line->size() < 3) return fail(r, "a chunk's size line is missing");
        const std::string hex = size_line->substr(0, size_line->size() - 2);
        if (hex.empty() || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
          return fail(r, "bad chunk size line: " + hex);
        const size_t size = std::stoul(hex, nullptr, 16);
        const std::optional<std::string> data = exactly(size + 2);
        if (!data || !data->ends_with("\r\n")) return fail(r, "a chunk is cut short or not ended by CRLF");
        if (size == 0) break;  // the last chunk (no trailers)
        r.body += data->substr(0, size);
      }
    } else {
      const auto length = r.headers.find("content-length");
      if (length == r.headers.end()) return fail(r, "neither a length nor chunks");
      const std::optional<std::string> body = exactly(std::stoul(length->second));
      if (!body) return fail(r, "the body is cut short");
      r.body = *body;
    }
    return r;
  }

 private:
  static Response& fail(Response& r, std::string why) {
    r.error = std::move(why);
    return r;
  }
  bool fill() {
    pollfd p{fd_, POLLIN, 0};
    // Long enough for a sanitized server's answer; a hang fails, not blocks.
    if (::poll(&p, 1, 300000) <= 0) return false;
    char buf[16384];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    buf_.append(buf, static_cast<size_t>(n));
    return true;
  }
  // Everything up to and including `end`.
  std::optional<std::string> until(std::string_view end) {
    size_t at;
    while ((at = buf_.find(end)) == std::string::npos)
      if (!fill()) return std::nullopt;
    std::string out = buf_.substr(0, at + end.size());
    buf_.erase(0, at + end.size());
    return out;
  }
  std::optional<std::string> exactly(size_t n) {
    while (buf_.size() < n)
      if (!fill()) return std::nullopt;
    std::string out = buf_.substr(0, n);
    buf_.erase(0, n);
    return out;
  }

  int fd_ = -1;
  std::string buf_;
};

// A completion drawn at temperature 1 with a seed of its own: as repeatable
// as a greedy one, and distinct prompts get distinct texts (a random-weight
// model's greedy answers are often alike).
json completion(const std::string& prompt, int max_tokens, int64_t seed) {
  return {{"prompt", prompt},
          {"max_tokens", max_tokens},
          {"temperature", 1},
          {"seed", seed},
          {"ignore_eos", true}};
}

std::string completion_request(const std::string& prompt, int max_tokens, int64_t seed, bool stream) {
  json request = completion(prompt, max_tokens, seed);
  request["stream"] = stream;
  const std::string body = request.dump();
  return fmt::format(
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: "
      "{}\r\n\r\n{}",
      body.size(), body);
}

// What one completion reply told its client.
struct Answer {
  std::string id, text;
  int64_t completion_tokens = -1;
  std::string error;  // empty when the reply was whole and consistent
};

// A completion reply read as its client: streamed, every event must carry
// the request's one id, the last JSON event the usage, then [DONE].
Answer read_answer(const Response& r, bool stream) {
  Answer a;
  if (!r.error.empty()) {
    a.error = "malformed response: " + r.error;
    return a;
  }
  if (r.status != 200) {
    a.error = fmt::format("status {}: {}", r.status, r.body);
    return a;
  }
  if (!stream) {
    const json j = json::parse(r.body, nullptr, false);
    if (!j.is_object() || !j.contains("id")) {
      a.error = "not a completion: " + r.body;
      return a;
    }
    a.id = j["id"];
    a.text = j["choices"][0]["text"];
    a.completion_tokens = j["usage"]["completion_tokens"];
    return a;
  }
  if (!r.chunked) {
    a.error = "a stream not sent in chunks";
    return a;
  }
  bool done = false;
  for (size_t at = 0; at < r.body.size();) {
    const size_t end = r.body.find("\n\n", at);
    if (end == std::string::npos) {
      a.error = "an event is cut short: " + r.body.substr(at);
      return a;
    }
    const std::string event = r.body.substr(at, end - at);
    at = end + 2;
    if (event.starts_with(":")) continue;  // a comment while waiting
    if (done || !event.starts_with("data: ")) {
      a.error = "unexpected event: " + event;
      return a;
    }
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    const json j = json::parse(data, nullptr, false);
    if (!j.is_object() || !j.contains("id")) {
      a.error = "an event that is not a completion chunk: " + data;
      return a;
    }
    if (a.id.empty()) a.id = j["id"];
    if (j["id"] != a.id) {
      a.error = fmt::format("an event of {} in the stream of {}", j["id"].dump(), a.id);
      return a;
    }
    if (j.contains("choices") && !j["choices"].empty()) a.text += j["choices"][0]["text"].get<std::string>();
    if (j.contains("usage") && j["usage"].is_object()) a.completion_tokens = j["usage"]["completion_tokens"];
  }
  if (!done) a.error = "the stream did not end with [DONE]";
  return a;
}

std::string prompt_of(int wave, int client, int request) {
  return fmt::format("Robot {} of wave {} counted {} red shells by the lake", client, wave,
                     7 * request + client);
}
int64_t seed_of(int wave, int client, int request) { return 10000 * wave + 100 * client + request; }

// Requests of the first wave that reach the HTTP library's other paths, on
// a connection of their own: a Range header (parsed by regexes built on
// first use) and a multipart body (refused, 415, and the connection closed:
// the server takes JSON only).
void library_paths(int port, std::vector<std::string>& errors, int client) {
  Connection c(port);
  const Response range =
      c.exchange("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nRange: bytes=0-3, 5-7\r\n\r\n");
  if (!range.error.empty() || range.status / 100 != 2)
    errors.push_back(fmt::format("client {}: Range: {} {}", client, range.status, range.error));
  const std::string part = fmt::format(
      "--b{0}\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nhello {0}\r\n--b{0}--\r\n", client);
  const Response multipart =
      c.exchange(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                             "multipart/form-data; boundary=b{}\r\n"
                             "Content-Length: {}\r\n\r\n{}",
                             client, part.size(), part));
  if (!multipart.error.empty() || multipart.status != 415)
    errors.push_back(fmt::format("client {}: multipart: {} {} {}", client, multipart.status, multipart.error,
                                 multipart.body));
}

TEST(HttpStress, EveryClientGetsOnlyItsOwnBytesAndSigtermDrainsTheLoad) {
  REQUIRE_CURL();
  ServeProcess server({"-m", test::serve_model_file().string(), "-t", "2", "--drain-seconds", "600"});
  REQUIRE_SERVER(server);
  const int clients = test::kSanitized ? 8 : 16;
  const int per_client = test::kSanitized ? 3 : 4;
  const int max_tokens = test::kSanitized ? 6 : 12;

  // Wave 1, the server's first requests: each client on one keep-alive
  // connection, streamed and whole completions in turn.
  std::vector<std::vector<Answer>> answers(clients, std::vector<Answer>(per_client));
  std::vector<std::vector<std::string>> errors(clients);
  {
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        Connection conn(server.port());
        if (c % 2 == 0) library_paths(server.port(), errors[c], c);
        for (int r = 0; r < per_client; ++r) {
          const bool stream = (c + r) % 2 == 0;
          answers[c][r] = read_answer(
              conn.exchange(completion_request(prompt_of(1, c, r), max_tokens, seed_of(1, c, r), stream)),
              stream);
        }
        if (c % 2 == 1) library_paths(server.port(), errors[c], c);
      });
    for (std::thread& t : threads) t.join();
  }
  for (int c = 0; c < clients; ++c)
    for (const std::string& e : errors[c]) ADD_FAILURE() << e << "\nthe server's log:\n" << server.log();

  // Wave 2's prompts are longer answers, still running when the signal comes.
  const int drain_clients = test::kSanitized ? 4 : 8;
  const int drain_tokens = test::kSanitized ? 120 : 600;

  // What each prompt gets alone, one request at a time.
  const auto alone = [&](const std::string& prompt, int n, int64_t seed) {
    const test::Reply r = curl(server.port(), "/v1/completions", post(completion(prompt, n, seed)));
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.j()["choices"][0]["text"].get<std::string>() : std::string();
  };
  std::set<std::string> ids, texts;
  for (int c = 0; c < clients; ++c)
    for (int r = 0; r < per_client; ++r) {
      const Answer& a = answers[c][r];
      SCOPED_TRACE(fmt::format("client {} request {}", c, r));
      ASSERT_TRUE(a.error.empty()) << a.error << "\nthe server's log:\n" << server.log();
      EXPECT_TRUE(ids.insert(a.id).second) << "id " << a.id << " answered twice";
      EXPECT_EQ(a.completion_tokens, max_tokens);
      const std::string want = alone(prompt_of(1, c, r), max_tokens, seed_of(1, c, r));
      EXPECT_EQ(a.text, want);
      texts.insert(want);
    }
  // Distinct prompts must give distinct texts for the comparison to catch
  // a reply that went to the wrong client.
  EXPECT_GE(texts.size() * 10, static_cast<size_t>(clients * per_client * 9))
      << "too many prompts answer alike";
  std::vector<std::string> drain_want;
  // Their first tokens alone: hundreds of draws in a batch drift from the
  // same draws alone (logits a few ulps apart flip one in a few hundred),
  // the first ones do not (wave 1), and they tell each prompt's answer from
  // every other's.
  for (int c = 0; c < drain_clients; ++c)
    drain_want.push_back(alone(prompt_of(2, c, 0), max_tokens, seed_of(2, c, 0)));
  EXPECT_EQ(std::set<std::string>(drain_want.begin(), drain_want.end()).size(), drain_want.size())
      << "two prompts begin alike";

  // Wave 2: SIGTERM while every request streams or waits for its whole
  // answer; each still gets all of it, and the process exits 0.
  std::vector<Answer> drained(drain_clients);
  std::vector<std::thread> threads;
  for (int c = 0; c < drain_clients; ++c)
    threads.emplace_back([&, c] {
      Connection conn(server.port());
      const bool stream = c % 2 == 0;
      drained[c] = read_answer(
          conn.exchange(completion_request(prompt_of(2, c, 0), drain_tokens, seed_of(2, c, 0), stream)),
          stream);
    });
  std::string m;
  for (int i = 0; i < 1200; ++i) {
    m = server.metrics();
    if (sample(m, "depcache_requests_running") == drain_clients) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(sample(m, "depcache_requests_running"), drain_clients) << m;
  server.signal(SIGTERM);
  for (std::thread& t : threads) t.join();
  for (int c = 0; c < drain_clients; ++c) {
    SCOPED_TRACE(fmt::format("draining client {}", c));
    ASSERT_TRUE(drained[c].error.empty()) << drained[c].error << "\nthe server's log:\n" << server.log();
    EXPECT_EQ(drained[c].completion_tokens, drain_tokens);
    EXPECT_TRUE(drained[c].text.starts_with(drain_want[c])) << drained[c].text << "\ndoes not begin with\n"
                                                            << drain_want[c];
    EXPECT_TRUE(ids.insert(drained[c].id).second) << "id " << drained[c].id << " answered twice";
  }
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(120)), 0) << server.log();
  EXPECT_EQ(server.log().find("ThreadSanitizer"), std::string::npos) << server.log();
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

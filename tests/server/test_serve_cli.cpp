// The `depcache serve` binary as its users run it, in a child process: a
// bounded load test with `depcache loadgen` (mixed RAG and plain requests,
// no errors, no leaked rows, memory within the configured budgets), SIGTERM
// and SIGINT while requests run, and the remote tier's Redis killed under load.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "model/gguf.h"
#include "model/model_writer.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "retrieval/rag_request.h"
#include "server/server_client.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using nlohmann::json;
using test::curl;
using test::post;
using test::Reply;
using test::sample;
using test::ServeProcess;

// `n` RAG requests over a small pool of documents and entities, so that
// requests share context as a RAG service's do: half with 2-3 documents,
// half with 1-2 entities and their relation paths, picked with a skew.
std::filesystem::path request_file(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto pick = [&](size_t pool) {  // low indices more often
    std::uniform_real_distribution<double> u(0, 1);
    return static_cast<size_t>(pool * u(rng) * u(rng));
  };
  std::vector<RagRequest> reqs(n);
  for (size_t i = 0; i < n; ++i) {
    RagRequest& r = reqs[i];
    r.id = fmt::format("q{}", i);
    r.question = fmt::format("What did the robot number {} find?", i % 17);
    if (i % 2 == 0) {
      for (size_t k = 0, m = 2 + i % 2; r.documents.size() < m && k < 20; ++k) {
        const size_t d = pick(12);
        const std::string id = fmt::format("doc{}", d);
        if (std::none_of(r.documents.begin(), r.documents.end(), [&](auto& x) { return x.id == id; }))
          r.documents.push_back({id, fmt::format("Story {}", d),
                                 fmt::format("Robot {} walked to the lake and found {} shells by the old "
                                             "tree, then it went home to sleep.",
                                             d, 3 * d + 1)});
      }
    } else {
      for (size_t k = 0, m = 1 + i % 3 / 2; r.entities.size() < m && k < 20; ++k) {
        const size_t e = pick(8);
        const std::string name = fmt::format("robot_{}", e);
        if (std::none_of(r.entities.begin(), r.entities.end(), [&](auto& x) { return x.name == name; }))
          r.entities.push_back({name,
                                fmt::format("robot {}", e),
                                {fmt::format("robot {} -> lives in -> town {}", e, e % 3),
                                 fmt::format("robot {} -> likes -> color {} -> seen in -> sky", e, e % 4)}});
      }
    }
  }
  const auto path = test::temp_path("load").replace_extension(".jsonl");
  write_requests(path, reqs);
  return path;
}

std::string loadgen(int port, const std::filesystem::path& requests, const std::string& extra) {
  return fmt::format("{} loadgen --url http://127.0.0.1:{} --requests {} --timeout 300 {} 2>&1",
                     DEPCACHE_BINARY, port, requests.string(), extra);
}

// Many clients, mixed RAG (documents, entities) and plain requests: all
// answered, the pool whole again, nothing pinned, memory within the budgets.
TEST(ServeCli, LoadTestAnswersEveryRequestAndLeaksNothing) {
  constexpr int kPoolRows = 16384;
  constexpr int kHostMib = 16;
  ServeProcess server({"-m", test::serve_model_file().string(), "-t", "2", "-c", std::to_string(kPoolRows),
                       "--host-mib", std::to_string(kHostMib), "--max-queue", "256"});
  REQUIRE_SERVER(server);
  const size_t n = test::kSanitized ? 200 : 1000;
  const auto requests = request_file(n, 7);
  const test::CliRun load =
      test::run_shell(loadgen(server.port(), requests, "--concurrency 32 --plain-every 3 -n 3 -s depcache"));
  EXPECT_EQ(load.code, 0) << load.out;
  EXPECT_NE(load.out.find(fmt::format("{} answered, 0 failed", n)), std::string::npos) << load.out;
  EXPECT_NE(load.out.find("TTFT ms (first token): p50"), std::string::npos)
      << "the server's timings were read";
  // A burst of new connections (more than cpp-httplib's own listen backlog
  // of 5 takes; beyond it handshakes stall and some requests went unanswered),
  // within the queue limit: every one is served.
  const size_t burst = test::kSanitized ? 100 : 400;
  const test::CliRun wide = test::run_shell(
      loadgen(server.port(), requests, fmt::format("--concurrency 128 --limit {} -n 1 -s prefix", burst)));
  EXPECT_EQ(wide.code, 0) << wide.out;
  const std::string m = server.metrics();
  EXPECT_EQ(sample(m, "depcache_requests_total{outcome=\"finished\"}"), n + burst) << m;
  EXPECT_EQ(sample(m, "depcache_requests_running"), 0);
  EXPECT_EQ(sample(m, "depcache_kv_pool_free_rows"), kPoolRows) << "rows leaked";
  EXPECT_EQ(sample(m, "depcache_kv_pool_rows"), kPoolRows);
  EXPECT_EQ(sample(m, "depcache_kv_pinned_nodes"), 0) << "pins leaked";
  EXPECT_GT(sample(m, "depcache_reused_tokens_total"), 0) << "shared context was reused";
  // Memory: the model, the KV pool (f16 rows of 4 layers x 2 KV heads x 64,
  // K and V) and the host tier, plus what the process needs without them
  // (code, threads, the index, allocator slack; more under sanitizers).
  const int64_t model_bytes = static_cast<int64_t>(std::filesystem::file_size(test::serve_model_file()));
  const int64_t pool_bytes = int64_t{kPoolRows} * 4 * 2 * 2 * 64 * 2;
  // (Under sanitizers each connection's thread carries its shadow state:
  // the burst opens 128 connections, a thread each.)
  const int64_t base = (test::kSanitized ? 640 : 96) << 20;
  const int64_t budget = model_bytes + pool_bytes + (int64_t{kHostMib} << 20) + base;
  const int64_t peak = server.peak_rss_bytes();
  fmt::print("peak RSS {:.1f} MiB (model {:.1f}, pool {:.1f}, host tier {}, allowance {} MiB)\n",
             peak / 1048576.0, model_bytes / 1048576.0, pool_bytes / 1048576.0, kHostMib, base >> 20);
  EXPECT_GT(peak, 0);
  EXPECT_LT(peak, budget);
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(60)), 0) << server.log();
  std::filesystem::remove(requests);
}

// loadgen fails (exit 6) when no server answers or any request fails, and
// says why; with the key it passes.
TEST(ServeCli, LoadgenExitsNonZeroWhenRequestsFail) {
  const auto requests = request_file(6, 3);
  const test::CliRun none = test::run_shell(fmt::format(
      "{} loadgen --url http://127.0.0.1:1 --requests {} 2>&1", DEPCACHE_BINARY, requests.string()));
  EXPECT_EQ(none.code, 6) << none.out;
  EXPECT_NE(none.out.find("no server answers at http://127.0.0.1:1"), std::string::npos) << none.out;
  ServeProcess server(
      {"-m", test::serve_model_file().string(), "-t", "2", "--api-key", "k3y-0123456789abcdef"});
  REQUIRE_SERVER(server);
  const test::CliRun refused = test::run_shell(loadgen(server.port(), requests, "--concurrency 2"));
  EXPECT_EQ(refused.code, 6) << refused.out;
  EXPECT_NE(refused.out.find("6 x HTTP 401: missing or wrong API key"), std::string::npos) << refused.out;
  const test::CliRun ok =
      test::run_shell(loadgen(server.port(), requests, "--concurrency 2 --api-key k3y-0123456789abcdef"));
  EXPECT_EQ(ok.code, 0) << ok.out;
  std::filesystem::remove(requests);
}

// With reference answers in the request file, loadgen judges each streamed
// answer as `run` judges generated ones (the text up to a newline, exact
// match and token F1): the shipped QA model served through the API answers
// held-out questions under DepCache as `run` finds it does (every one), and
// the same answers checked against wrong references all count as wrong.
TEST(ServeCli, LoadgenJudgesTheAnswersAgainstTheRequestsReferences) {
  const auto dir = test::temp_path("loadgen-answers");
  std::filesystem::create_directories(dir);
  const std::string world = (dir / "world.dkg").string(), requests = (dir / "qa.jsonl").string();
  ASSERT_EQ(
      test::run_cli("kg import --synthetic --entities 300 --name-pool 1000 --seed 9101 -o " + world).code, 0);
  ASSERT_EQ(test::run_cli("workload generate --kg " + world +
                          " --pattern dataset --qa-items 12 --entities-per-request 3 --paths-per-entity 9 "
                          "--min-paths 1 --hops 2 --question-hops 1 --seed 77 --question-form cloze --out " +
                          requests)
                .code,
            0);
  const std::string model = (std::filesystem::path(DEPCACHE_MODELS_DIR) / "depcache-qa-alone.gguf").string();
  ServeProcess server({"-m", model, "-t", "2"});
  REQUIRE_SERVER(server);
  const std::string rows = (dir / "rows.jsonl").string();
  const test::CliRun load = test::run_shell(
      loadgen(server.port(), requests, "--concurrency 2 -n 12 --stop-at-eos -s depcache --json " + rows));
  ASSERT_EQ(load.code, 0) << load.out;
  EXPECT_NE(load.out.find("answers: 12 of 12 exact (100.0%), token F1 1.000"), std::string::npos) << load.out;
  std::map<std::string, std::string> answers;
  {
    std::ifstream in(rows);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      EXPECT_TRUE(j["exact_match"].get<bool>()) << line;
      const std::string text = j["text"], answer = j["answer"];  // " Basnes\n" -> "Basnes"
      EXPECT_EQ(text.substr(0, text.find('\n')).find(answer), 1u) << line;
      answers[j["id"]] = j["answer"];
    }
  }
  EXPECT_EQ(answers.size(), 12u);
  // The same questions with every reference answer changed.
  const std::string wrong = (dir / "wrong.jsonl").string();
  {
    std::ifstream in(requests);
    std::ofstream out(wrong);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      j["answers"] = {"not " + answers[j["id"]]};
      out << j.dump() << "\n";
    }
  }
  const test::CliRun judged_wrong =
      test::run_shell(loadgen(server.port(), wrong, "--concurrency 2 -n 12 --stop-at-eos -s depcache"));
  ASSERT_EQ(judged_wrong.code, 0) << judged_wrong.out;
  EXPECT_NE(judged_wrong.out.find("answers: 0 of 12 exact (0.0%)"), std::string::npos) << judged_wrong.out;
  std::filesystem::remove_all(dir);
}

// loadgen --retrieve sends questions only; a server searching its corpus in
// stages with speculative pipelining answers them all and loadgen reports
// the search time and the part no prefill overlapped. --speculate needs stages.
TEST(ServeCli, LoadgenRetrieveReportsTheSpeculativeSearch) {
  const auto corpus = test::temp_path("spec-corpus").replace_extension(".jsonl");
  {
    std::ofstream out(corpus);
    for (int d = 0; d < 30; ++d)
      out << nlohmann::json(
                 {{"text", fmt::format("Document {} tells of rivers, castles and the number {}.", d, d * 7)}})
                 .dump()
          << "\n";
  }
  const auto requests = request_file(12, 5);
  const test::CliRun bad = test::run_cli(fmt::format("serve -m {} --port 0 --corpus {} --speculate",
                                                     test::serve_model_file().string(), corpus.string()));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--search-stages 2 or more"), std::string::npos) << bad.out;
  ServeProcess server({"-m", test::serve_model_file().string(), "-t", "2", "--corpus", corpus.string(),
                       "--search-stages", "3", "--speculate", "--search-stage-latency-ms", "2"});
  REQUIRE_SERVER(server);
  const test::CliRun load =
      test::run_shell(loadgen(server.port(), requests, "--concurrency 4 -n 2 -s ragcache --retrieve 2"));
  EXPECT_EQ(load.code, 0) << load.out;
  EXPECT_NE(load.out.find("12 answered, 0 failed"), std::string::npos) << load.out;
  EXPECT_NE(load.out.find("non-overlapped ms:"), std::string::npos) << load.out;
  EXPECT_NE(load.out.find("of 12 searches answered by one"), std::string::npos) << load.out;
  EXPECT_EQ(sample(server.metrics(), "depcache_search_seconds_count"), 12);
  std::filesystem::remove(corpus);
  std::filesystem::remove(requests);
}

// The chat format at start: the model's own template, run by the Jinja
// interpreter, or a family named with --chat-template; a template the
// interpreter cannot read stops the server, naming what it cannot read.
TEST(ServeCli, TheChatTemplateIsRunNamedOrRefusedAtStart) {
  const auto llama3 = test::temp_path("llama3").replace_extension(".gguf");
  const test::CliRun made =
      test::run_cli(fmt::format("model new --preset tiny --chat-template llama3 -o {}", llama3.string()));
  ASSERT_EQ(made.code, 0) << made.out;
  {
    ServeProcess server({"-m", llama3.string(), "-t", "1", "--chat-template", "zephyr"});
    REQUIRE_SERVER(server);
    EXPECT_NE(server.log().find("chat template zephyr"), std::string::npos) << server.log();
  }
  // A template of no family: the server formats chats as it says.
  RandomModelOptions o;
  o.shape = *model_preset("tiny");
  o.chat_template = "{% for m in messages %}<<{{ m.role }}>> {{ m.content | trim }}\n{% endfor %}";
  const auto odd = test::temp_path("odd-template").replace_extension(".gguf");
  write_random_model(odd, o);
  {
    ServeProcess server({"-m", odd.string(), "-t", "1"});
    REQUIRE_SERVER(server);
    EXPECT_NE(server.log().find("chat template the model's template"), std::string::npos) << server.log();
    const Reply r =
        curl(server.port(), "/v1/chat/completions",
             post({{"messages", {{{"role", "user"}, {"content", "  Hi  "}}}}, {"max_tokens", 2}}));
    ASSERT_EQ(r.status, 200) << r.body;
    const Tokenizer tok(Vocab::from_gguf(GgufFile::open(odd)));
    EXPECT_EQ(json::parse(r.body)["usage"]["prompt_tokens"], tok.encode("<<user>> Hi\n", true, true).size());
    // The assistant's message last: the reply continues it (prefill).
    const Reply p =
        curl(server.port(), "/v1/chat/completions",
             post({{"messages",
                    {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Hello"}}}},
                   {"max_tokens", 2}}));
    ASSERT_EQ(p.status, 200) << p.body;
    EXPECT_EQ(json::parse(p.body)["usage"]["prompt_tokens"],
              tok.encode("<<user>> Hi\n<<assistant>> Hello", true, true).size());
  }
  o.chat_template = "{% include 'turns.jinja' %}";
  write_random_model(odd, o);
  ServeProcess refused({"-m", odd.string(), "-t", "1"});
  EXPECT_EQ(refused.port(), 0);
  EXPECT_EQ(refused.wait_exit(std::chrono::seconds(30)), 3) << refused.log();
  EXPECT_NE(refused.log().find("the statement 'include' is not supported"), std::string::npos)
      << refused.log();
  EXPECT_NE(refused.log().find("--chat-template"), std::string::npos) << refused.log();
  const test::CliRun bad_name =
      test::run_cli(fmt::format("serve -m {} --port 0 --chat-template nosuch", llama3.string()));
  EXPECT_NE(bad_name.code, 0) << bad_name.out;
  EXPECT_NE(bad_name.out.find("nosuch"), std::string::npos) << bad_name.out;
  std::filesystem::remove(llama3);
  std::filesystem::remove(odd);
}

// SIGTERM while several requests stream: they finish in full, new ones are
// refused, then the process exits 0. SIGINT does the same.
TEST(ServeCli, SigtermDrainsRequestsInFlightAndExitsZero) {
  for (const int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(sig == SIGTERM ? "SIGTERM" : "SIGINT");
    ServeProcess server({"-m", test::serve_model_file().string(), "-t", "2", "--drain-seconds", "300"});
    REQUIRE_SERVER(server);
    constexpr int kClients = 4;
    const int max_tokens = test::kSanitized ? 160 : 1500;
    std::vector<Reply> replies(kClients);
    std::vector<std::thread> clients;
    for (int i = 0; i < kClients; ++i)
      clients.emplace_back([&, i] {
        replies[i] = curl(server.port(), "/v1/completions",
                          post({{"prompt", fmt::format("Once {}", i)},
                                {"max_tokens", max_tokens},
                                {"temperature", 0},
                                {"ignore_eos", true},
                                {"stream", i % 2 == 0}}));
      });
    // All running, none finished: then the signal.
    const std::string before = server.metrics_when(
        [&](const std::string& m) { return sample(m, "depcache_requests_running") == kClients; });
    ASSERT_EQ(sample(before, "depcache_requests_running"), kClients) << before;
    server.signal(sig);
    // Stopped accepting: a new request gets no answer or 503, never a hang.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const Reply late = curl(server.port(), "/v1/completions", "--max-time 10 " + post({{"prompt", "late"}}));
    EXPECT_TRUE(late.status == 0 || late.status == 503) << late.status << " " << late.body;
    for (std::thread& t : clients) t.join();
    for (int i = 0; i < kClients; ++i) {
      ASSERT_EQ(replies[i].status, 200) << replies[i].body;
      const json usage =
          i % 2 == 0 ? test::read_stream(replies[i].body).second["usage"] : replies[i].j()["usage"];
      EXPECT_EQ(usage["completion_tokens"], max_tokens) << "client " << i << " got its whole answer";
    }
    EXPECT_EQ(server.wait_exit(std::chrono::seconds(60)), 0) << server.log();
    const std::string log = server.log();
    const size_t draining = log.find(sig == SIGTERM ? "SIGTERM, draining" : "SIGINT, draining");
    ASSERT_NE(draining, std::string::npos) << log;
    EXPECT_LT(draining, log.find("generated=" + std::to_string(max_tokens)))
        << "they finished after it: " << log;
    EXPECT_NE(log.find("cmpl-1 strategy=prefix prompt="), std::string::npos) << "one log line per request";
  }
}

// Redis, the remote tier, dies while requests run: every request is still
// answered (computed locally), and the outage is logged once.
TEST(ServeCli, RedisKilledUnderLoadAnswersContinue) {
  DEPCACHE_REQUIRE_REDIS(redis);
  // No host tier and a small hot tier: spans evicted go to Redis, and later
  // requests look there.
  ServeProcess server({"-m", test::serve_model_file().string(), "-t", "2", "--cache-mib", "1", "--redis",
                       fmt::format("127.0.0.1:{}", redis.port())});
  REQUIRE_SERVER(server);
  // Under a sanitizer, fewer and shorter requests: Redis still goes with
  // three quarters of them to come.
  const size_t n = test::kSanitized ? 64 : 400;
  const int max_tokens = test::kSanitized ? 8 : 24;
  const auto requests = request_file(n, 11);
  test::CliRun load;
  std::thread client([&] {
    load = test::run_shell(
        loadgen(server.port(), requests, fmt::format("--concurrency 8 -n {} -s depcache", max_tokens)));
  });
  const char* const from_redis = "depcache_index_hit_tokens_total{tier=\"remote\"}";
  const std::string before = server.metrics_when([&](const std::string& m) {
    return sample(m, "depcache_requests_total{outcome=\"finished\"}") >= static_cast<double>(n / 4) &&
           sample(m, from_redis) > 0;
  });
  EXPECT_GT(sample(before, from_redis), 0) << "requests found spans in Redis before it went:\n" << before;
  redis.stop();
  const std::string at_kill = server.metrics();
  client.join();
  EXPECT_LT(sample(at_kill, "depcache_requests_total{outcome=\"finished\"}"), static_cast<double>(n))
      << "Redis went while requests were still coming";
  EXPECT_EQ(load.code, 0) << load.out;
  EXPECT_NE(load.out.find(fmt::format("{} answered, 0 failed", n)), std::string::npos) << load.out;
  const std::string m = server.metrics();
  EXPECT_EQ(sample(m, "depcache_requests_total{outcome=\"finished\"}"), n);
  EXPECT_EQ(sample(m, "depcache_kv_pinned_nodes"), 0);
  const std::string log = server.log();
  // Logged once for the outage, not once per request that found Redis gone.
  size_t outage_lines = 0;
  for (size_t at = log.find("the remote KV tier is skipped"); at != std::string::npos;
       at = log.find("the remote KV tier is skipped", at + 1))
    ++outage_lines;
  EXPECT_EQ(outage_lines, 1u) << log;
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait_exit(std::chrono::seconds(60)), 0) << log;
  std::filesystem::remove(requests);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// The HTTP server over an engine loop in this process, through a real HTTP
// client (curl) over loopback sockets: every endpoint and error, greedy
// answers equal to `depcache generate`, chat, the RAG extension, streaming,
// concurrent clients, a full queue, and clients that go away or read slowly.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/engine_loop.h"
#include "graph_requests.h"
#include "model/model.h"
#include "model/vocab.h"
#include "prompt/prompt_parts.h"
#include "reference_forward.h"
#include "server/http_server.h"
#include "server/server_client.h"
#include "strategy/strategy.h"
#include "strategy/subgcache.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using nlohmann::json;

std::string shell(const std::string& cmd) { return test::run_shell(cmd).out; }
using test::curl;
using test::post;
using test::read_stream;
using test::Reply;
using test::sample;
const std::filesystem::path& model_file() { return test::serve_model_file(); }

// An HTTP server over an engine loop in this process, on a free port.
struct Served {
  std::shared_ptr<const Model> model = Model::load(model_file());
  std::shared_ptr<const Tokenizer> tok = std::make_shared<const Tokenizer>(Vocab::from_gguf(model->file()));
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<HttpServer> http;
  int port = 0;

  explicit Served(ServerOptions so = {}, bool make_ready = true, int max_running = 0) {
    so.port = 0;
    EngineOptions eo;
    eo.max_running = max_running;
    eo.pool_rows = 32768;
    eo.threads = 2;
    eo.tokenizer = tok;
    eo.eog_ids = tok->eog_ids();
    loop = std::make_unique<EngineLoop>(model, eo);
    http = std::make_unique<HttpServer>(so);
    port = http->listen();
    if (make_ready) ready();
  }
  // What requests may draw on (set before ready()).
  std::optional<ChatFormat> chat = ChatFormat(ChatFamily::ChatML);
  const ChunkIndex* corpus = nullptr;
  const GraphRetriever* graph = nullptr;
  RagWrapper prompt;
  void ready() { http->ready({"tiny", tok, 32768, chat, corpus, graph, prompt}, *loop); }
  // Joins the server's threads: what they read may be destroyed after this.
  void stop() { http->shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(5)); }
  ~Served() { stop(); }
};

TEST(Server, EndpointsAnswerAndGreedyTextEqualsGenerate) {
  REQUIRE_CURL();
  Served s({}, /*make_ready=*/false);
  EXPECT_EQ(curl(s.port, "/health").status, 503) << "loading";
  EXPECT_EQ(curl(s.port, "/v1/models").status, 503);
  s.ready();
  Reply h = curl(s.port, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.j()["status"], "ok");
  Reply m = curl(s.port, "/v1/models");
  ASSERT_EQ(m.status, 200) << m.body;
  EXPECT_EQ(m.j()["data"][0]["id"], "tiny");

  const std::string prompt = "Once upon a time there was a robot";
  const std::string generated = shell(fmt::format("{} generate -m {} -p '{}' -n 12 --temp 0 2>/dev/null",
                                                  DEPCACHE_BINARY, model_file().string(), prompt));
  ASSERT_EQ(generated.substr(0, prompt.size()), prompt);
  const std::string expected = generated.substr(prompt.size(), generated.size() - prompt.size() - 1);  // "\n"
  Reply c = curl(s.port, "/v1/completions",
                 post({{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}}));
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = c.j();
  EXPECT_EQ(cj["object"], "text_completion");
  EXPECT_EQ(cj["choices"][0]["text"], expected);
  const int64_t completion_tokens = cj["usage"]["completion_tokens"];
  EXPECT_EQ(cj["choices"][0]["finish_reason"], completion_tokens == 12 ? "length" : "stop");
  EXPECT_EQ(cj["usage"]["prompt_tokens"], static_cast<int64_t>(s.tok->encode(prompt, true, true).size()));
  // The server's own times, to tell its latency from the network's and the client's.
  EXPECT_GT(cj["timings"]["ttft_ms"].get<double>(), 0) << cj;
  EXPECT_GE(cj["timings"]["total_ms"].get<double>(), cj["timings"]["ttft_ms"].get<double>());

  // Streamed: the same text in pieces, the reason and usage in the last chunk.
  Reply st = curl(s.port, "/v1/completions",
                  post({{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"stream", true}}));
  ASSERT_EQ(st.status, 200) << st.body;
  const auto [text, last] = read_stream(st.body);
  EXPECT_EQ(text, expected);
  EXPECT_EQ(last["choices"][0]["finish_reason"], cj["choices"][0]["finish_reason"]);
  EXPECT_EQ(last["usage"]["completion_tokens"], completion_tokens);
  EXPECT_GT(last["timings"]["total_ms"].get<double>(), 0) << last;
  EXPECT_GT(last["usage"]["reused_tokens"].get<int64_t>(), 0) << "the prompt's prefix came from the index";

  // A stop string ends the text before it.
  const std::string stop = expected.substr(expected.size() / 2, 2);
  Reply sp = curl(s.port, "/v1/completions",
                  post({{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"stop", {stop}}}));
  ASSERT_EQ(sp.status, 200) << sp.body;
  EXPECT_EQ(sp.j()["choices"][0]["text"], expected.substr(0, expected.find(stop)));
  EXPECT_EQ(sp.j()["choices"][0]["finish_reason"], "stop");

  // The three requests in the metrics, in the Prometheus text format.
  const Reply mt = curl(s.port, "/metrics");
  ASSERT_EQ(mt.status, 200);
  const std::string& scrape = mt.body;
  EXPECT_NE(scrape.find("# TYPE depcache_time_to_first_token_seconds histogram"), std::string::npos)
      << scrape;
  EXPECT_EQ(sample(scrape, "depcache_time_to_first_token_seconds_count"), 3);
  EXPECT_EQ(sample(scrape, "depcache_request_duration_seconds_count"), 3);
  EXPECT_EQ(sample(scrape, "depcache_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 3);
  EXPECT_GT(sample(scrape, "depcache_inter_token_seconds_count"), 10);
  EXPECT_EQ(sample(scrape, "depcache_requests_total{outcome=\"finished\"}"), 3);
  EXPECT_EQ(sample(scrape, "depcache_generated_tokens_total"),
            2 * completion_tokens + static_cast<double>(sp.j()["usage"]["completion_tokens"].get<int64_t>()));
  EXPECT_GT(sample(scrape, "depcache_reused_tokens_total"), 0);
  EXPECT_EQ(sample(scrape, "depcache_reused_tokens_total"),
            sample(scrape, "depcache_reused_tokens_by_tier_total{tier=\"hot\"}"));
  EXPECT_GE(sample(scrape, "depcache_http_responses_total{code=\"200\"}"), 5);
  EXPECT_EQ(sample(scrape, "depcache_kv_pool_free_rows"), sample(scrape, "depcache_kv_pool_rows"));
  EXPECT_GT(sample(scrape, "depcache_kv_tier_bytes{tier=\"hot\"}"), 0);

  // ignore_eos: max_tokens however early the model would end. A bias that
  // makes the end-of-text token certain ends a request at its first token;
  // with ignore_eos the same request runs on to max_tokens.
  const std::string eos = std::to_string(s.tok->eos());
  const auto ended_by_bias = [&](bool ignore_eos) {
    return curl(s.port, "/v1/completions",
                post({{"prompt", "Once"},
                      {"max_tokens", 16},
                      {"logit_bias", {{eos, 100}}},
                      {"ignore_eos", ignore_eos}}));
  };
  const Reply ended = ended_by_bias(false);
  ASSERT_EQ(ended.status, 200) << ended.body;
  EXPECT_LE(ended.j()["usage"]["completion_tokens"], 1) << ended.body;
  EXPECT_EQ(ended.j()["choices"][0]["finish_reason"], "stop") << ended.body;
  const Reply ig = ended_by_bias(true);
  ASSERT_EQ(ig.status, 200) << ig.body;
  EXPECT_EQ(ig.j()["usage"]["completion_tokens"], 16) << ig.body;
  EXPECT_EQ(ig.j()["choices"][0]["finish_reason"], "length") << ig.body;
}

TEST(Server, BadRequestsGetOpenAIErrorsAndTheServerStaysUp) {
  REQUIRE_CURL();
  ServerOptions so;
  so.api_keys = {{"sesame", ""}};
  so.http.max_body_bytes = 2000;
  Served s(so);
  const std::string key = "-H 'Authorization: Bearer sesame' ";
  const auto expect_error = [&](const Reply& r, int status, const std::string& param,
                                const std::string& label) {
    EXPECT_EQ(r.status, status) << label << ": " << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << label << ": " << r.body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty()) << label;
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << label;
    }
  };
  expect_error(curl(s.port, "/v1/completions", post({{"prompt", "hi"}})), 401, "", "no key");
  expect_error(curl(s.port, "/v1/models", "-H 'Authorization: Bearer wrong'"), 401, "", "wrong key");
  EXPECT_EQ(curl(s.port, "/health").status, 200) << "health needs no key";
  expect_error(
      curl(s.port, "/v1/completions", key + "-H 'Content-Type: application/json' -d '{\"prompt\": \"hi\",'"),
      400, "", "malformed JSON");
  // A body that is not declared JSON: a web page can send such a request to
  // a server on the operator's machine without asking (no CORS preflight).
  expect_error(
      curl(s.port, "/v1/completions", key + "-H 'Content-Type: text/plain' -d '{\"prompt\": \"hi\"}'"), 415,
      "", "text/plain body");
  expect_error(curl(s.port, "/v1/completions", key + post({{"prompt", "hi"}, {"max_tokens", "many"}})), 400,
               "max_tokens", "wrong type");
  expect_error(curl(s.port, "/v1/completions", key + post({{"prompt", "hi"}, {"ignore_eos", 1}})), 400,
               "ignore_eos", "ignore_eos not a boolean");
  expect_error(curl(s.port, "/v1/completions", key + post({{"prompt", "hi"}, {"temperature", 7}})), 400,
               "temperature", "out of range");
  expect_error(curl(s.port, "/v1/completions", key + post({{"max_tokens", 3}})), 400, "prompt", "no prompt");
  expect_error(curl(s.port, "/v1/completions", key + post({{"prompt", "hi"}, {"model", "gpt-9"}})), 404,
               "model", "unknown model");
  expect_error(curl(s.port, "/v1/completions", key + post({{"prompt", "hi"}, {"max_tokens", 40000}})), 400,
               "max_tokens", "over the context");
  expect_error(curl(s.port, "/v1/completions", key + post({{"prompt", std::string(5000, 'a')}})), 413, "",
               "oversized body");
  expect_error(curl(s.port, "/v2/nothing", key), 404, "", "unknown path");
  // Still serving.
  Reply ok = curl(s.port, "/v1/completions", key + post({{"prompt", "hi"}, {"max_tokens", 2}}));
  EXPECT_EQ(ok.status, 200) << ok.body;
}

// What `depcache generate` answers greedily after `prompt` (special tokens parsed, BOS added).
std::string generate_greedy(const std::string& prompt, int n) {
  const auto file = test::temp_path("prompt");
  std::ofstream(file) << prompt;
  // The x keeps a trailing newline from being cut by $(...).
  const std::string out = shell(
      fmt::format("p=\"$(cat {}; printf x)\"; {} generate -m {} -p \"${{p%x}}\" -n {} --temp 0 2>/dev/null",
                  file.string(), DEPCACHE_BINARY, model_file().string(), n));
  std::filesystem::remove(file);
  EXPECT_EQ(out.substr(0, prompt.size()), prompt);
  return out.substr(prompt.size(), out.size() - prompt.size() - 1);  // the last "\n" is generate's
}

// The official OpenAI Node client (tests/client, installed by scripts/setup.sh)
// against the server, as an application would use it: greedy completions and
// chat, whole and streamed, equal `depcache generate`; the RAG extension in the
// body; the client's errors for a wrong key and an unknown model.
TEST(Server, TheOfficialOpenAIClientGetsWhatGenerateGives) {
  const std::filesystem::path client_dir = DEPCACHE_CLIENT_DIR;
  if (!std::filesystem::exists(client_dir / "node_modules" / "openai" / "package.json") ||
      std::system("node --version >/dev/null 2>&1") != 0)
    DEPCACHE_SKIP("node or the openai npm package missing (scripts/setup.sh installs them)");
  ServerOptions so;
  so.api_keys = {{"sk-depcache-test", ""}};
  Served s(so);
  const std::string prompt = "Once upon a time there was a robot";
  constexpr int kTokens = 12;
  const test::CliRun r =
      test::run_shell(fmt::format("node {}/openai_check.mjs http://127.0.0.1:{}/v1 tiny {} '{}' {} 2>&1",
                                  client_dir.string(), s.port, so.api_keys[0].key, prompt, kTokens));
  ASSERT_EQ(r.code, 0) << r.out;
  const json out = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(out.is_discarded()) << r.out;
  const std::string expected = generate_greedy(prompt, kTokens);
  EXPECT_EQ(out["completion"], expected);
  EXPECT_EQ(out["completion_streamed"], expected);
  EXPECT_EQ(out["completion_usage"]["prompt_tokens"],
            static_cast<int64_t>(s.tok->encode(prompt, true, true).size()));
  EXPECT_EQ(out["completion_streamed_usage"]["completion_tokens"],
            out["completion_usage"]["completion_tokens"]);
  const std::string chat_expected =
      generate_greedy("<|im_start|>system\nYou tell short stories.<|im_end|>\n<|im_start|>user\n" + prompt +
                          "<|im_end|>\n<|im_start|>assistant\n",
                      kTokens);
  EXPECT_EQ(out["chat"], chat_expected);
  EXPECT_EQ(out["chat_role"], "assistant");
  EXPECT_EQ(out["chat_streamed"], chat_expected);
  EXPECT_GT(out["rag_usage"]["reused_tokens"].get<int64_t>(), 10)
      << "the documents were reused the second time";
  EXPECT_EQ(out["wrong_key"]["status"], 401) << out;
  EXPECT_EQ(out["unknown_model"]["status"], 404) << out;
  EXPECT_NE(out["unknown_model"]["message"].get<std::string>().find("no-such-model"), std::string::npos)
      << out;
}

// A client that reads its stream slowly holds only its own connection (the
// server's writes to it block): the others are answered meanwhile, and it gets
// every token in the end.
TEST(Server, ASlowClientDelaysNoOne) {
  REQUIRE_CURL();
  Served s;
  const json request = {{"prompt", "Once upon a time"},
                        {"max_tokens", test::kSanitized ? 400 : 1000},
                        {"temperature", 0},
                        {"stream", true}};
  const Reply fast = curl(s.port, "/v1/completions", post(request));
  ASSERT_EQ(fast.status, 200);
  const std::string expected = read_stream(fast.body).first;
  // Read 1 kB per 20 ms (a quarter of that under sanitizers, where the
  // other requests are slower too): seconds for the reply, far longer than
  // it takes to make.
  ASSERT_GT(fast.body.size(), 50000u) << "the test needs a reply longer than the socket buffers hold";
  Reply slow;
  std::atomic<bool> slow_done{false};
  std::thread reader([&] {
    slow = test::slow_post(s.port, "/v1/completions", request, test::kSanitized ? 256 : 1024,
                           std::chrono::milliseconds(20));
    slow_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int i = 0; i < 4; ++i) {
    const Reply r =
        curl(s.port, "/v1/completions",
             post({{"prompt", fmt::format("Tell {}", i)}, {"max_tokens", 4}, {"stream", i % 2 == 0}}));
    EXPECT_EQ(r.status, 200) << r.body;
  }
  EXPECT_FALSE(slow_done) << "the others were answered while the slow client was still reading";
  reader.join();
  ASSERT_EQ(slow.status, 200) << slow.body;
  EXPECT_EQ(read_stream(slow.body).first, expected);
}

TEST(Server, ChatCompletionsFormatTheConversationWithTheChatTemplate) {
  REQUIRE_CURL();
  Served s;
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "Tell me about robots."}}});
  const std::string expected = generate_greedy(
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTell me about robots.<|im_end|>\n"
      "<|im_start|>assistant\n",
      10);
  const json request = {{"model", "tiny"}, {"messages", messages}, {"max_tokens", 10}, {"temperature", 0}};
  Reply c = curl(s.port, "/v1/chat/completions", post(request));
  ASSERT_EQ(c.status, 200) << c.body;
  const json cj = c.j();
  EXPECT_EQ(cj["object"], "chat.completion");
  EXPECT_EQ(cj["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(cj["choices"][0]["message"]["content"], expected);

  json streamed = request;
  streamed["stream"] = true;
  Reply st = curl(s.port, "/v1/chat/completions", post(streamed));
  ASSERT_EQ(st.status, 200) << st.body;
  const auto [text, last] = read_stream(st.body);
  EXPECT_EQ(text, expected);
  EXPECT_EQ(last["object"], "chat.completion.chunk");
  EXPECT_EQ(last["choices"][0]["finish_reason"], cj["choices"][0]["finish_reason"]);
  EXPECT_EQ(last["usage"]["completion_tokens"], cj["usage"]["completion_tokens"]);
  const size_t first = st.body.find("data: ");
  EXPECT_EQ(
      json::parse(st.body.substr(first + 6, st.body.find("\n\n") - first - 6))["choices"][0]["delta"]["role"],
      "assistant")
      << "the stream opens with the assistant's role";

  Reply bad_role = curl(s.port, "/v1/chat/completions",
                        post({{"messages", json::array({{{"role", "tool"}, {"content", "x"}}})}}));
  EXPECT_EQ(bad_role.status, 400) << bad_role.body;
  EXPECT_EQ(bad_role.j()["error"]["param"], "messages[0].role");
  // The assistant's message last is continued (prefill); a system message
  // last, or prefill with the RAG extension (whose question is the last
  // message), is refused.
  Reply ends_with_assistant =
      curl(s.port, "/v1/chat/completions",
           post({{"messages", json::array({{{"role", "user"}, {"content", "x"}},
                                           {{"role", "assistant"}, {"content", "y"}}})}}));
  EXPECT_EQ(ends_with_assistant.status, 200) << ends_with_assistant.body;
  Reply ends_with_system = curl(s.port, "/v1/chat/completions",
                                post({{"messages", json::array({{{"role", "system"}, {"content", "x"}}})}}));
  EXPECT_EQ(ends_with_system.status, 400) << ends_with_system.body;
  Reply rag_prefill = curl(
      s.port, "/v1/chat/completions",
      post({{"messages",
             json::array({{{"role", "user"}, {"content", "x"}}, {{"role", "assistant"}, {"content", "y"}}})},
            {"rag", {{"documents", json::array({{{"id", "d"}, {"text", "a document"}}})}}}}));
  EXPECT_EQ(rag_prefill.status, 400) << rag_prefill.body;
  EXPECT_NE(rag_prefill.body.find("with the 'rag' extension the last message must be the user's"),
            std::string::npos)
      << rag_prefill.body;
}

TEST(Server, ChatWithoutATemplateIsRefusedClearly) {
  REQUIRE_CURL();
  Served s({}, false);
  s.chat = std::nullopt;
  s.ready();
  Reply r = curl(s.port, "/v1/chat/completions",
                 post({{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("--chat-template"), std::string::npos) << r.body;
}

json documents_rag(const std::string& strategy, std::vector<int> order) {
  const std::vector<json> docs = {{{"id", "etna"},
                                   {"title", "Volcano"},
                                   {"text", "Mount Etna is an active volcano on the island of Sicily."}},
                                  {{"id", "aletsch"},
                                   {"title", "Glacier"},
                                   {"text", "The Aletsch Glacier is the largest glacier in the Alps."}},
                                  {{"id", "atacama"},
                                   {"title", "Desert"},
                                   {"text", "The Atacama is a desert plateau in South America."}}};
  json picked = json::array();
  for (int i : order) picked.push_back(docs[static_cast<size_t>(i)]);
  return {{"strategy", strategy}, {"documents", picked}};
}

// RAG prompts are built with the served model's template, as the model was
// trained.
TEST(Server, RagPromptsFollowTheModelsTemplate) {
  REQUIRE_CURL();
  Served s({}, false);
  s.prompt.system = "Facts:\n";
  s.prompt.task_prefix = "";
  s.prompt.task_suffix = " ->";
  s.ready();
  const json rag = documents_rag("full", {0, 1});
  Reply r = curl(s.port, "/v1/completions",
                 post({{"prompt", "Which glacier is the largest?"}, {"max_tokens", 1}, {"rag", rag}}));
  ASSERT_EQ(r.status, 200) << r.body;
  RagRequest by_hand;
  by_hand.question = "Which glacier is the largest?";
  for (const json& d : rag["documents"])
    by_hand.documents.push_back({d["id"], d.value("title", ""), d["text"]});
  EXPECT_EQ(r.j()["usage"]["prompt_tokens"], make_prompt_parts(*s.tok, by_hand, s.prompt).n_flat_tokens());
  EXPECT_NE(r.j()["usage"]["prompt_tokens"], make_prompt_parts(*s.tok, by_hand).n_flat_tokens());
  s.stop();
}

// The RAG extension: context given with the request, reused by the strategy it names.
TEST(Server, RagRequestsReuseTheirContextAsTheirStrategyAllows) {
  REQUIRE_CURL();
  Served s;
  const auto ask = [&](const json& rag, const std::string& path = "/v1/completions") {
    json body = {{"max_tokens", 6}, {"temperature", 0}, {"rag", rag}};
    if (path == "/v1/completions")
      body["prompt"] = "Which glacier is the largest?";
    else
      body["messages"] = json::array({{{"role", "user"}, {"content", "Which glacier is the largest?"}}});
    Reply r = curl(s.port, path, post(body));
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.j() : json();
  };
  const json full = ask(documents_rag("full", {0, 1, 2}));
  ASSERT_FALSE(full.is_null());
  EXPECT_EQ(full["usage"]["reused_tokens"], 0);
  EXPECT_EQ(full["usage"]["computed_tokens"], full["usage"]["prompt_tokens"]);
  // The context holds the documents: far more than the question alone.
  EXPECT_GT(full["usage"]["prompt_tokens"].get<int64_t>(), 60);
  const json prefix = ask(documents_rag("prefix", {0, 1, 2}));
  const json prefix_again = ask(documents_rag("prefix", {0, 1, 2}));
  EXPECT_EQ(prefix_again["usage"]["reused_tokens"].get<int64_t>(),
            prefix_again["usage"]["prompt_tokens"].get<int64_t>() - 1)
      << "all but the last prompt token";
  EXPECT_EQ(prefix_again["usage"]["reused_from"]["hot"], prefix_again["usage"]["reused_tokens"]);
  EXPECT_EQ(prefix_again["usage"]["prompt_tokens_details"]["cached_tokens"],
            prefix_again["usage"]["reused_tokens"]);
  EXPECT_EQ(prefix_again["choices"][0]["text"], full["choices"][0]["text"]) << "prefix reuse is exact";
  // depcache finds documents again in another order; prefix does not.
  ask(documents_rag("depcache", {0, 1, 2}));
  const json moved = ask(documents_rag("depcache", {2, 0, 1}));
  const json moved_prefix = ask(documents_rag("prefix", {2, 0, 1}));
  EXPECT_GT(moved["usage"]["reused_tokens"].get<int64_t>(),
            moved_prefix["usage"]["reused_tokens"].get<int64_t>() + 40);
  // The chunk strategies too: each document stored as computed alone, found
  // in any order, whichever chunk strategy stored it; Cache-Craft's variants
  // (computed in the context of the request that first had them) likewise.
  ask(documents_rag("fusionrag", {0, 1, 2}));
  ask(documents_rag("cachecraft", {0, 1, 2}));
  for (const char* strategy : {"fusionrag", "cacheblend", "fullreuse", "cachecraft"}) {
    const json chunked = ask(documents_rag(strategy, {2, 0, 1}));
    ASSERT_FALSE(chunked.is_null()) << strategy;
    EXPECT_GT(chunked["usage"]["reused_tokens"].get<int64_t>(),
              moved_prefix["usage"]["reused_tokens"].get<int64_t>() + 40)
        << strategy;
  }
  // In a chat, the documents sit inside the user's turn and are reused the same way.
  ask(documents_rag("depcache", {1, 2}), "/v1/chat/completions");
  const json chat = ask(documents_rag("depcache", {2, 1}), "/v1/chat/completions");
  ASSERT_FALSE(chat.is_null());
  EXPECT_GT(chat["usage"]["reused_tokens"].get<int64_t>(), 40);
  EXPECT_FALSE(chat["choices"][0]["message"]["content"].is_null());
  // Entities with relation paths.
  const json entities = {
      {"strategy", "depcache"},
      {"entities", json::array({{{"name", "glacier.n.01"},
                                 {"paths", {"glacier is a ice mass", "glacier part of mountain"}}}})}};
  ask(entities);
  EXPECT_GT(ask(entities)["usage"]["reused_tokens"].get<int64_t>(), 10);

  // Errors name the field.
  const auto expect_400 = [&](const json& rag, const std::string& param) {
    Reply r = curl(s.port, "/v1/completions", post({{"prompt", "q"}, {"rag", rag}}));
    EXPECT_EQ(r.status, 400) << r.body;
    if (r.status == 400) {
      EXPECT_EQ(r.j()["error"]["param"], param) << r.body;
    }
  };
  expect_400({{"strategy", "psychic"}}, "rag.strategy");
  expect_400({{"documents", "etna"}}, "rag");
  expect_400({{"documents", json::array({{{"id", "x"}}})}}, "rag");
  expect_400({{"retrieve", true}}, "rag.retrieve");  // this server has neither corpus nor graph
  expect_400({{"retrieve", {{"from", "web"}}}}, "rag.retrieve.from");
  expect_400({{"retrieve", true}, {"text", "context"}}, "rag.retrieve");
}

// `retrieve`: the server looks the context up in its corpus or knowledge graph.
TEST(Server, RagRetrieveDrawsContextFromTheCorpusAndTheGraph) {
  REQUIRE_CURL();
  Corpus corpus;
  corpus.docs.push_back({"a", "Volcano", "Mount Etna is an active volcano on the island of Sicily."});
  corpus.docs.push_back({"b", "Glacier", "The Aletsch Glacier is the largest glacier in the Alps."});
  corpus.docs.push_back({"c", "Desert", "The Atacama is a desert plateau in South America, very dry."});
  const KnowledgeGraph kg = test::film_graph();
  Served s({}, false);
  const ChunkIndex index = ChunkIndex::build(corpus, *s.tok);
  const GraphRetriever graph(kg);
  s.corpus = &index;
  s.graph = &graph;
  s.ready();
  // Under "full" the prompt is the flat serialization, whose size is checked.
  const auto ask = [&](const std::string& question, const json& retrieve,
                       const std::string& strategy = "full") {
    Reply r = curl(s.port, "/v1/completions",
                   post({{"prompt", question},
                         {"max_tokens", 2},
                         {"rag", {{"strategy", strategy}, {"retrieve", retrieve}}}}));
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.j()["usage"] : json();
  };
  // The prompt holds the retrieved context: as many tokens as building it by hand.
  RagRequest by_hand;
  by_hand.question = "Which glacier is the largest?";
  by_hand.documents = retrieve_documents(index, by_hand.question, 2);
  const json from_corpus = ask(by_hand.question, {{"from", "corpus"}, {"top_k", 2}});
  EXPECT_EQ(from_corpus["prompt_tokens"], make_prompt_parts(*s.tok, by_hand).n_flat_tokens());
  RagRequest graph_hand;
  graph_hand.question = "Where was the director of Titanic born?";
  graph_hand.entities = graph.retrieve(graph_hand.question, {});
  const json from_kg = ask(graph_hand.question, {{"from", "kg"}});
  EXPECT_EQ(from_kg["prompt_tokens"], make_prompt_parts(*s.tok, graph_hand).n_flat_tokens());
  ask(graph_hand.question, {{"from", "kg"}}, "depcache");
  EXPECT_GT(ask(graph_hand.question, {{"from", "kg"}}, "depcache")["reused_tokens"].get<int64_t>(), 20)
      << "the second time";
  // No entity in the question: answered without context.
  const json none = ask("zzz qqq", {{"from", "kg"}});
  RagRequest empty;
  empty.question = "zzz qqq";
  EXPECT_EQ(none["prompt_tokens"], make_prompt_parts(*s.tok, empty).n_flat_tokens());
  // Both sources loaded: the request must say which.
  Reply r = curl(s.port, "/v1/completions", post({{"prompt", "q"}, {"rag", {{"retrieve", true}}}}));
  EXPECT_EQ(r.status, 400) << r.body;
  s.stop();  // before the index and the graph go
}

// A corpus search in stages with speculative pipelining: the answer is the
// one of a server that searches in one go, and the response's timings and
// the metrics tell how the search and the prefill overlapped.
TEST(Server, SpeculativeSearchAnswersAsAPlainSearchAndReportsTheOverlap) {
  REQUIRE_CURL();
  Corpus corpus;
  for (const char* text : {"Mount Etna is an active volcano on the island of Sicily.",
                           "The Aletsch Glacier is the largest glacier in the Alps.",
                           "The Atacama is a desert plateau in South America, very dry.",
                           "Sicily is the largest island in the Mediterranean Sea.",
                           "The Alps are the highest mountain range in Europe."})
    corpus.docs.push_back({std::to_string(corpus.docs.size()), "", text});
  const auto answer = [&](ServerOptions so) {
    Served s(so, false);
    const ChunkIndex index = ChunkIndex::build(corpus, *s.tok);
    s.corpus = &index;
    s.ready();
    std::vector<json> out;
    for (const char* q :
         {"Which island has the largest volcano?", "What is the largest glacier in the Alps?"}) {
      Reply r =
          curl(s.port, "/v1/completions",
               post({{"prompt", q},
                     {"max_tokens", 4},
                     {"temperature", 0},
                     {"rag", {{"strategy", "ragcache"}, {"retrieve", {{"from", "corpus"}, {"top_k", 2}}}}}}));
      EXPECT_EQ(r.status, 200) << r.body;
      out.push_back(r.status == 200 ? r.j() : json());
    }
    out.push_back(curl(s.port, "/metrics").body);
    s.stop();
    return out;
  };
  ServerOptions plain;
  plain.search.stages = 3;
  ServerOptions speculative = plain;
  speculative.search.speculate = true;
  speculative.search.stage_latency = std::chrono::milliseconds(5);
  const std::vector<json> a = answer(plain), b = answer(speculative);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(a[i]["choices"][0]["text"], b[i]["choices"][0]["text"]);
    EXPECT_EQ(a[i]["usage"]["prompt_tokens"], b[i]["usage"]["prompt_tokens"]);
    const json& t = b[i]["timings"]["search"];
    ASSERT_TRUE(t.is_object()) << b[i];
    EXPECT_GE(t["search_ms"].get<double>(), 5.0 * t["stages"].get<double>());
    EXPECT_LE(t["non_overlapped_ms"].get<double>(), t["search_ms"].get<double>());
    EXPECT_GE(t["speculations"].get<int>(), t["accepted"].get<bool>() ? 1 : 0);
    EXPECT_EQ(a[i]["timings"]["search"]["speculations"], 0);
  }
  std::string metrics = b[2].get<std::string>();
  EXPECT_EQ(sample(metrics, "depcache_search_seconds_count"), 2);
  EXPECT_GE(sample(metrics, "depcache_speculative_prefills_total"), 1);
  EXPECT_NE(metrics.find("depcache_search_non_overlapped_seconds_bucket"), std::string::npos);
}

// strategy "subgcache": GraphRAG requests that arrive together are batched,
// clustered by subgraph and served cluster by cluster after their cluster's
// representative subgraph, computed once. One cluster per query gives each
// its own subgraph (the per-query CSV prompt, answered alike); one cluster
// for all makes the later ones reuse the first's prefill.
TEST(Server, SubgcacheBatchesGraphRequestsAndClustersThem) {
  REQUIRE_CURL();
  const KnowledgeGraph kg = test::film_graph();
  const GraphRetriever graph(kg);
  const std::vector<std::string> questions = {"Where was the director of Titanic born?",
                                              "When was Avatar released?", "Who directed Alien?",
                                              "Who directed Titanic?"};
  const auto ask_all = [&](size_t clusters) {
    ServerOptions so;
    so.subgcache.subgcache.clusters = clusters;
    so.subgcache.subgcache.batch = questions.size();
    so.subgcache.window = std::chrono::milliseconds(20000);  // the batch closes when full
    Served s(so, false);
    s.graph = &graph;
    s.ready();
    std::vector<json> out(questions.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < questions.size(); ++i)
      clients.emplace_back([&, i] {
        Reply r = curl(s.port, "/v1/completions",
                       post({{"prompt", questions[i]},
                             {"max_tokens", 3},
                             {"temperature", 0},
                             {"rag", {{"strategy", "subgcache"}, {"retrieve", {{"from", "kg"}}}}}}));
        EXPECT_EQ(r.status, 200) << r.body;
        if (r.status == 200) out[i] = r.j();
      });
    for (std::thread& t : clients) t.join();
    // Requests the batcher cannot take: no relation paths.
    Reply none = curl(s.port, "/v1/completions",
                      post({{"prompt", "zzz qqq"},
                            {"max_tokens", 1},
                            {"rag", {{"strategy", "subgcache"}, {"retrieve", {{"from", "kg"}}}}}}));
    EXPECT_EQ(none.status, 400) << none.body;
    EXPECT_NE(none.body.find("subgcache clusters GraphRAG subgraphs"), std::string::npos) << none.body;
    // The per-query prompt: each query's own subgraph as CSV, computed in full.
    std::vector<json> own;
    for (const std::string& q : questions) {
      RagRequest r;
      r.question = q;
      r.entities = graph.retrieve(q, {});
      const std::string csv = request_subgraph(r).csv();
      Reply x = curl(s.port, "/v1/completions",
                     post({{"prompt", q},
                           {"max_tokens", 3},
                           {"temperature", 0},
                           {"rag", {{"strategy", "full"}, {"text", csv}}}}));
      EXPECT_EQ(x.status, 200) << x.body;
      own.push_back(x.status == 200 ? x.j() : json());
    }
    s.stop();
    return std::make_pair(out, own);
  };
  {
    const auto [got, own] = ask_all(questions.size());
    for (size_t i = 0; i < questions.size(); ++i) {
      SCOPED_TRACE(questions[i]);
      const json& b = got[i]["timings"]["batch"];
      ASSERT_TRUE(b.is_object()) << got[i];
      EXPECT_EQ(b["size"], questions.size());
      EXPECT_EQ(b["clusters"], questions.size());
      EXPECT_EQ(got[i]["usage"]["prompt_tokens"], own[i]["usage"]["prompt_tokens"]);
      EXPECT_EQ(got[i]["choices"][0]["text"], own[i]["choices"][0]["text"]);
    }
  }
  {
    const auto [got, own] = ask_all(1);
    int64_t reused = 0;
    for (size_t i = 0; i < questions.size(); ++i) {
      EXPECT_EQ(got[i]["timings"]["batch"]["clusters"], 1);
      EXPECT_GT(got[i]["usage"]["prompt_tokens"].get<int64_t>(),
                own[i]["usage"]["prompt_tokens"].get<int64_t>())
          << "the union of every subgraph is longer than any one";
      reused += got[i]["usage"]["reused_tokens"].get<int64_t>();
    }
    EXPECT_GT(reused, 3 * 50) << "the three after the first reuse the representative";
  }
  // Alone, a request waits the window, then is served in a batch of one. With
  // subgcache as the server's default, a plain request runs under prefix.
  ServerOptions so;
  so.strategy = "subgcache";
  so.subgcache.window = std::chrono::milliseconds(150);
  Served s(so, false);
  s.graph = &graph;
  s.ready();
  Reply r = curl(s.port, "/v1/completions",
                 post({{"prompt", questions[0]},
                       {"max_tokens", 1},
                       {"rag", {{"strategy", "subgcache"}, {"retrieve", {{"from", "kg"}}}}}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j()["timings"]["batch"]["size"], 1);
  EXPECT_GE(r.j()["timings"]["batch"]["wait_ms"].get<double>(), 140.0);
  Reply plain = curl(s.port, "/v1/completions", post({{"prompt", "Once upon a time"}, {"max_tokens", 2}}));
  EXPECT_EQ(plain.status, 200) << plain.body;
  EXPECT_FALSE(plain.j()["timings"].contains("batch")) << plain.body;
  s.stop();
}

// Beyond --max-queue waiting requests, new ones are refused with 429 and Retry-After.
TEST(Server, AFullQueueAnswers429WithRetryAfter) {
  REQUIRE_CURL();
  ServerOptions so;
  so.max_queue = 1;
  Served s(so, true, /*max_running=*/1);
  const std::string long_request = post({{"prompt", "Once"}, {"max_tokens", 30000}, {"temperature", 0}});
  // One running, one waiting; the clients give up after a few seconds, which
  // cancels them. The second is sent once the first runs (a slow build may
  // take a while to admit it), so it waits rather than being refused.
  std::thread running([&] { curl(s.port, "/v1/completions", "--max-time 6 " + long_request); });
  std::string m;
  for (int i = 0; i < 100 && sample(m, "depcache_requests_running") != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    m = curl(s.port, "/metrics").body;
  }
  if (sample(m, "depcache_requests_running") != 1) {
    running.join();
    FAIL() << "the first request never ran: " << m;
  }
  std::thread waiting([&] { curl(s.port, "/v1/completions", "--max-time 4 " + long_request); });
  for (int i = 0; i < 100 && sample(m, "depcache_requests_waiting") != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    m = curl(s.port, "/metrics").body;
  }
  EXPECT_EQ(sample(m, "depcache_requests_waiting"), 1) << m;
  const auto headers = test::temp_path("headers");
  const Reply refused =
      curl(s.port, "/v1/completions",
           fmt::format("-D {} ", headers.string()) + post({{"prompt", "hi"}, {"max_tokens", 2}}));
  EXPECT_EQ(refused.status, 429);
  std::ifstream in(headers);
  const std::string header_text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(header_text.find("Retry-After: 1"), std::string::npos) << header_text;
  EXPECT_NE(refused.body.find("queue_full"), std::string::npos) << refused.body;
  running.join();
  waiting.join();
  // Neither waited for its answer: both were cancelled when their clients
  // went away (non-streamed requests too), and their rows returned.
  for (int i = 0; i < 100 && sample(m, "depcache_requests_total{outcome=\"cancelled\"}") != 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    m = curl(s.port, "/metrics").body;
  }
  EXPECT_EQ(sample(m, "depcache_requests_total{outcome=\"cancelled\"}"), 2) << m;
  EXPECT_EQ(sample(m, "depcache_kv_pool_free_rows"), sample(m, "depcache_kv_pool_rows"));
}

// A client that reads the first few events and goes away: its request is
// cancelled, and its rows and pins return.
TEST(Server, ClientGoneMidStreamFreesRowsAndPins) {
  REQUIRE_CURL();
  Served s;
  const auto file = test::temp_path("request");
  std::ofstream(file)
      << json({{"prompt", "Once"}, {"max_tokens", 30000}, {"stream", true}, {"ignore_eos", true}}).dump();
  const std::string first = shell(fmt::format(
      "curl -s -N -H 'Content-Type: application/json' --data-binary @{} http://127.0.0.1:{}/v1/completions | "
      "head -c 300",
      file.string(), s.port));
  EXPECT_NE(first.find("data: "), std::string::npos) << first;
  // Checked as an operator would: through /metrics.
  std::string m;
  for (int i = 0; i < 200; ++i) {
    m = curl(s.port, "/metrics").body;
    // The outcome, the running gauge and the duration are recorded one after
    // another: wait for all three.
    if (sample(m, "depcache_requests_total{outcome=\"cancelled\"}") == 1 &&
        sample(m, "depcache_requests_running") == 0 &&
        sample(m, "depcache_request_duration_seconds_count") == 1)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(sample(m, "depcache_requests_total{outcome=\"cancelled\"}"), 1)
      << "cancelled, not run to 30000 tokens";
  EXPECT_EQ(sample(m, "depcache_requests_total{outcome=\"finished\"}"), 0);
  EXPECT_EQ(sample(m, "depcache_kv_pool_free_rows"), sample(m, "depcache_kv_pool_rows"));
  EXPECT_EQ(sample(m, "depcache_kv_pinned_nodes"), 0);
  EXPECT_EQ(sample(m, "depcache_request_duration_seconds_count"), 1) << "the request is accounted for once";
}

TEST(Server, ConcurrentClientsGetWhatEachGetsAlone) {
  REQUIRE_CURL();
  Served s;
  constexpr int kClients = 32;
  const auto request = [](int i) {
    return json({{"prompt", fmt::format("Story {}: the robot counted to {}", i % 5, i)},
                 {"max_tokens", 8},
                 {"temperature", 0},
                 {"stream", i % 2 == 1}});
  };
  std::vector<std::string> alone;
  for (int i = 0; i < kClients; ++i) {
    const Reply r = curl(s.port, "/v1/completions", post(request(i)));
    ASSERT_EQ(r.status, 200) << r.body;
    alone.push_back(i % 2 ? read_stream(r.body).first : r.j()["choices"][0]["text"].get<std::string>());
  }
  std::vector<Reply> together(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] { together[i] = curl(s.port, "/v1/completions", post(request(i))); });
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_EQ(together[i].status, 200) << together[i].body;
    const std::string text = i % 2 ? read_stream(together[i].body).first
                                   : together[i].j()["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(text, alone[i]) << "client " << i;
  }
}

// The float64 reference's greedy continuation of `ids`: each token and the
// log-softmax it was drawn from.
struct ReferenceGreedy {
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> logprobs;
};
ReferenceGreedy reference_greedy(const Model& model, std::vector<int32_t> ids, int n) {
  ReferenceGreedy out;
  const auto n_vocab = static_cast<size_t>(model.config().n_vocab);
  const test::ReferenceWeights weights = test::ReferenceWeights::from_model(model);  // converted once
  for (int i = 0; i < n; ++i) {
    const std::vector<double> logits = test::reference_logits(weights, ids);
    const double* row = logits.data() + (ids.size() - 1) * n_vocab;
    const double max = *std::max_element(row, row + n_vocab);
    double sum = 0;
    for (size_t t = 0; t < n_vocab; ++t) sum += std::exp(row[t] - max);
    std::vector<double> lp(n_vocab);
    for (size_t t = 0; t < n_vocab; ++t) lp[t] = row[t] - max - std::log(sum);
    const auto best = static_cast<int32_t>(std::max_element(row, row + n_vocab) - row);
    out.tokens.push_back(best);
    out.logprobs.push_back(std::move(lp));
    ids.push_back(best);
  }
  return out;
}

// The id whose piece (special tokens rendered) is exactly `bytes`, as chat
// logprobs give them.
int32_t id_of_bytes(const Tokenizer& tok, const json& bytes) {
  std::string piece;
  for (const json& b : bytes) piece += static_cast<char>(b.get<int>());
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (tok.token_to_piece(id, true) == piece) return id;
  return -1;
}

// Two logprobs JSON values alike: the same tokens, log-probabilities within
// float noise (a prompt computed afresh or reused from the cache gives
// logits a few ulps apart).
void expect_logprobs_alike(const json& a, const json& b, const std::string& where = "") {
  if (a.is_number_float() || b.is_number_float()) {
    ASSERT_TRUE(a.is_number() && b.is_number()) << where << ": " << a << " vs " << b;
    EXPECT_NEAR(a.get<double>(), b.get<double>(), 1e-4) << where;
    return;
  }
  ASSERT_EQ(a.type(), b.type()) << where << ": " << a << " vs " << b;
  if (a.is_array()) {
    ASSERT_EQ(a.size(), b.size()) << where << ": " << a << " vs " << b;
    for (size_t i = 0; i < a.size(); ++i) expect_logprobs_alike(a[i], b[i], fmt::format("{}[{}]", where, i));
  } else if (a.is_object()) {
    ASSERT_EQ(a.size(), b.size()) << where << ": " << a << " vs " << b;
    for (const auto& [key, value] : a.items()) {
      ASSERT_TRUE(b.contains(key)) << where << ": " << key;
      expect_logprobs_alike(value, b[key], where + "." + key);
    }
  } else {
    EXPECT_EQ(a, b) << where;
  }
}

// logprobs on both endpoints, in OpenAI's shapes, equal the log-softmax of a
// float64 forward pass over the same tokens; streamed, each chunk carries
// its own tokens' and together they are the whole answer's.
TEST(Server, LogprobsAreTheModelsInOpenAIsShapes) {
  REQUIRE_CURL();
  Served s;
  const std::string prompt = "Once upon a time there was a robot";
  constexpr int kTokens = 6;
  const ReferenceGreedy ref = reference_greedy(*s.model, s.tok->encode(prompt, true, true), kTokens);
  const json request = {
      {"prompt", prompt}, {"max_tokens", kTokens}, {"temperature", 0}, {"logprobs", 3}, {"ignore_eos", true}};
  const Reply c = curl(s.port, "/v1/completions", post(request));
  ASSERT_EQ(c.status, 200) << c.body;
  const json lp = c.j()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(kTokens)) << lp;
  ASSERT_EQ(lp["token_logprobs"].size(), static_cast<size_t>(kTokens));
  ASSERT_EQ(lp["top_logprobs"].size(), static_cast<size_t>(kTokens));
  ASSERT_EQ(lp["text_offset"].size(), static_cast<size_t>(kTokens));
  EXPECT_EQ(lp["text_offset"][0], 0);
  for (int i = 0; i < kTokens; ++i) {
    const double logprob = lp["token_logprobs"][i];
    EXPECT_NEAR(logprob, ref.logprobs[i][ref.tokens[i]], 1e-3) << i;
    const json& top = lp["top_logprobs"][i];
    EXPECT_GE(top.size(), 3u);  // the top 3 and the picked token (by text: pieces may coincide)
    EXPECT_LE(top.size(), 4u);
    double mass = 0, best = -INFINITY;
    for (const auto& [token, value] : top.items()) {
      ASSERT_TRUE(value.is_number()) << top;
      mass += std::exp(value.get<double>());
      best = std::max(best, value.get<double>());
    }
    EXPECT_LE(mass, 1.0 + 1e-6);
    EXPECT_EQ(best, logprob) << "the greedy token is the most likely";
    if (i > 0) {
      EXPECT_GE(lp["text_offset"][i], lp["text_offset"][i - 1]);
    }
  }
  // Streamed: the chunks' logprobs, put together, are the same.
  json joined = {{"tokens", json::array()},
                 {"token_logprobs", json::array()},
                 {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
  json with_stream = request;
  with_stream["stream"] = true;
  const Reply st = curl(s.port, "/v1/completions", post(with_stream));
  ASSERT_EQ(st.status, 200) << st.body;
  for (size_t at = 0; (at = st.body.find("data: {", at)) != std::string::npos; ++at) {
    const json chunk = json::parse(st.body.substr(at + 6, st.body.find("\n\n", at) - at - 6));
    const json& l = chunk["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      for (const json& x : l[key]) joined[key].push_back(x);
  }
  expect_logprobs_alike(joined, lp);
  EXPECT_EQ(read_stream(st.body).second["choices"][0]["logprobs"], nullptr) << "the last chunk has none left";

  // Chat: content[] of {token, logprob, bytes, top_logprobs}.
  const json chat_request = {{"messages", {{{"role", "user"}, {"content", prompt}}}},
                             {"max_tokens", kTokens},
                             {"temperature", 0},
                             {"logprobs", true},
                             {"top_logprobs", 2},
                             {"ignore_eos", true}};
  const Reply ch = curl(s.port, "/v1/chat/completions", post(chat_request));
  ASSERT_EQ(ch.status, 200) << ch.body;
  const json content = ch.j()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), static_cast<size_t>(kTokens)) << ch.body;
  const ReferenceGreedy chat_ref = reference_greedy(
      *s.model,
      s.tok->encode("<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n", true, true),
      kTokens);
  for (int i = 0; i < kTokens; ++i) {
    const json& e = content[i];
    EXPECT_EQ(id_of_bytes(*s.tok, e["bytes"]), chat_ref.tokens[i]) << e;
    EXPECT_NEAR(e["logprob"].get<double>(), chat_ref.logprobs[i][chat_ref.tokens[i]], 1e-3) << e;
    ASSERT_EQ(e["top_logprobs"].size(), 2u) << e;
    EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]) << "greedy: the top one";
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_TRUE(e["top_logprobs"][1]["bytes"].is_array());
  }
  json chat_stream = chat_request;
  chat_stream["stream"] = true;
  const Reply cs = curl(s.port, "/v1/chat/completions", post(chat_stream));
  ASSERT_EQ(cs.status, 200) << cs.body;
  json streamed = json::array();
  for (size_t at = 0; (at = cs.body.find("data: {", at)) != std::string::npos; ++at) {
    const json chunk = json::parse(cs.body.substr(at + 6, cs.body.find("\n\n", at) - at - 6));
    const json& l = chunk["choices"][0]["logprobs"];
    if (l.is_null()) continue;
    std::string tokens;
    for (const json& x : l["content"]) {
      streamed.push_back(x);
      tokens += x["token"].get<std::string>();
    }
    EXPECT_EQ(tokens, chunk["choices"][0]["delta"].value("content", "")) << "a chunk's tokens are its text";
  }
  expect_logprobs_alike(streamed, content);
  // Not asked: null, as OpenAI answers.
  EXPECT_EQ(curl(s.port, "/v1/completions", post({{"prompt", prompt}, {"max_tokens", 2}}))
                .j()["choices"][0]["logprobs"],
            nullptr);
}

// logit_bias +100 makes a token the answer, -100 bans one (greedy then takes
// the runner-up the unbiased logprobs name); with penalties each token is the
// best of the raw logprobs minus OpenAI's penalties; bad values are 400s.
TEST(Server, LogitBiasAndPenaltiesShapeTheAnswerAsOpenAIDefines) {
  REQUIRE_CURL();
  Served s;
  const auto chat = [&](json extra) {
    json body = {{"messages", {{{"role", "user"}, {"content", "Tell me about the robot"}}}},
                 {"max_tokens", 24},
                 {"temperature", 0},
                 {"logprobs", true},
                 {"top_logprobs", 20},
                 {"ignore_eos", true}};
    body.update(extra);
    const Reply r = curl(s.port, "/v1/chat/completions", post(body));
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? r.j()["choices"][0] : json();
  };
  const json plain = chat(json::object());
  ASSERT_FALSE(plain.is_null());
  const std::vector<int32_t> dog = s.tok->encode("dog", false, false);
  ASSERT_EQ(dog.size(), 1u);
  const json forced =
      chat({{"logit_bias", {{std::to_string(dog[0]), 100}}}, {"max_tokens", 4}, {"temperature", 1.2}});
  EXPECT_EQ(forced["message"]["content"], " dog dog dog dog");
  // Banned: the greedy first token never comes, the runner-up does.
  const json& first = plain["logprobs"]["content"][0];
  const int32_t top1 = id_of_bytes(*s.tok, first["top_logprobs"][0]["bytes"]);
  const int32_t top2 = id_of_bytes(*s.tok, first["top_logprobs"][1]["bytes"]);
  ASSERT_GE(top1, 0);
  const json banned = chat({{"logit_bias", {{std::to_string(top1), -100}}}});
  ASSERT_FALSE(banned.is_null());
  EXPECT_EQ(id_of_bytes(*s.tok, banned["logprobs"]["content"][0]["bytes"]), top2);
  for (const json& e : banned["logprobs"]["content"]) EXPECT_NE(id_of_bytes(*s.tok, e["bytes"]), top1);
  EXPECT_NEAR(banned["logprobs"]["content"][0]["logprob"].get<double>(),
              first["top_logprobs"][1]["logprob"].get<double>(), 1e-4)
      << "logprobs are the raw model's, before the bias";

  for (const auto& [presence, frequency] :
       std::vector<std::pair<double, double>>{{0, 1.5}, {1.0, 0}, {0.5, 0.5}}) {
    SCOPED_TRACE(fmt::format("presence {} frequency {}", presence, frequency));
    const json penalized = chat({{"presence_penalty", presence}, {"frequency_penalty", frequency}});
    ASSERT_FALSE(penalized.is_null());
    std::map<int32_t, int> counts;
    int checked = 0;
    for (const json& e : penalized["logprobs"]["content"]) {
      std::vector<std::pair<double, int32_t>> adjusted;
      for (const json& t : e["top_logprobs"]) {
        const int32_t id = id_of_bytes(*s.tok, t["bytes"]);
        const int n = counts.count(id) ? counts[id] : 0;
        adjusted.emplace_back(t["logprob"].get<double>() - n * frequency - (n > 0 ? presence : 0), id);
      }
      std::sort(adjusted.rbegin(), adjusted.rend());
      // The winner is known when no token outside the top 20 can beat it
      // (positive penalties only lower them).
      const double outside = e["top_logprobs"].back()["logprob"].get<double>();
      const int32_t picked = id_of_bytes(*s.tok, e["bytes"]);
      if (adjusted[0].first > outside && adjusted[0].first - adjusted[1].first > 1e-4) {
        EXPECT_EQ(picked, adjusted[0].second);
        ++checked;
      }
      ++counts[picked];
    }
    EXPECT_GT(checked, 12);
  }

  const auto expect_400 = [&](const json& body, const std::string& param, const std::string& mentions) {
    const Reply r = curl(s.port, "/v1/completions", post(body));
    EXPECT_EQ(r.status, 400) << body << ": " << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["param"], param) << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(mentions), std::string::npos) << r.body;
  };
  expect_400({{"prompt", "hi"}, {"logit_bias", {{"999999", 5}}}}, "logit_bias", "999999");
  expect_400({{"prompt", "hi"}, {"logit_bias", {{std::to_string(s.tok->n_vocab()), 5}}}}, "logit_bias",
             std::to_string(s.tok->n_vocab()));
  expect_400({{"prompt", "hi"}, {"logit_bias", {{"dog", 5}}}}, "logit_bias", "dog");
  expect_400({{"prompt", "hi"}, {"logit_bias", {{"5", 101}}}}, "logit_bias", "100");
  expect_400({{"prompt", "hi"}, {"logit_bias", json::array({1})}}, "logit_bias", "object");
  expect_400({{"prompt", "hi"}, {"presence_penalty", 2.5}}, "presence_penalty", "-2");
  expect_400({{"prompt", "hi"}, {"frequency_penalty", "high"}}, "frequency_penalty", "number");
}

// What a server would silently drop is refused, naming the parameter;
// metadata that changes nothing is accepted.
TEST(Server, ParametersThatWouldChangeTheAnswerAreRefusedByName) {
  REQUIRE_CURL();
  Served s;
  const json messages = {{{"role", "user"}, {"content", "hi"}}};
  const std::vector<std::tuple<std::string, std::string, json>> refused = {
      {"/v1/chat/completions",
       "tools",
       {{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}}}}},
      {"/v1/chat/completions", "tool_choice", {{"tool_choice", "auto"}}},
      {"/v1/chat/completions", "functions", {{"functions", {{{"name", "f"}}}}}},
      {"/v1/chat/completions", "function_call", {{"function_call", "auto"}}},
      {"/v1/chat/completions", "response_format", {{"response_format", {{"type", "json_object"}}}}},
      {"/v1/chat/completions",
       "response_format",
       {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}}},
      {"/v1/chat/completions", "modalities", {{"modalities", {"text", "audio"}}}},
      {"/v1/chat/completions", "audio", {{"audio", {{"voice", "alloy"}, {"format", "wav"}}}}},
      {"/v1/chat/completions", "n", {{"n", 2}}},
      {"/v1/chat/completions", "store", {{"store", true}}},
      {"/v1/chat/completions", "top_logprobs", {{"top_logprobs", 2}}},
      {"/v1/chat/completions", "top_logprobs", {{"logprobs", true}, {"top_logprobs", 21}}},
      {"/v1/chat/completions", "logprobs", {{"logprobs", 3}}},
      {"/v1/chat/completions", "reasoning_effort", {{"reasoning_effort", "high"}}},
      {"/v1/chat/completions", "repetition_penalty", {{"repetition_penalty", 1.1}}},
      {"/v1/chat/completions", "stream_options.chunk_size", {{"stream_options", {{"chunk_size", 3}}}}},
      {"/v1/completions", "best_of", {{"best_of", 3}}},
      {"/v1/completions", "echo", {{"echo", true}}},
      {"/v1/completions", "suffix", {{"suffix", " the end"}}},
      {"/v1/completions", "logprobs", {{"logprobs", 21}}},
      {"/v1/completions", "logprobs", {{"logprobs", true}}},
      {"/v1/completions", "top_logprobs", {{"top_logprobs", 2}}},
      {"/v1/completions", "tools", {{"tools", json::array({1})}}},
  };
  for (const auto& [path, param, extra] : refused) {
    json body = path == "/v1/completions" ? json{{"prompt", "hi"}} : json{{"messages", messages}};
    body["max_tokens"] = 2;
    body.update(extra);
    const Reply r = curl(s.port, path, post(body));
    EXPECT_EQ(r.status, 400) << path << " " << body << ": " << r.body;
    const json j = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["param"], param) << path << " " << body << ": " << r.body;
  }
  const std::vector<std::pair<std::string, json>> accepted = {
      {"/v1/chat/completions",
       {{"user", "u-1"},
        {"metadata", {{"team", "rag"}}},
        {"store", false},
        {"response_format", {{"type", "text"}}},
        {"tools", json::array()},
        {"tool_choice", "none"},
        {"parallel_tool_calls", true},
        {"modalities", {"text"}},
        {"n", 1},
        {"logprobs", false},
        {"service_tier", "auto"},
        {"stream_options", {{"include_usage", true}}}}},
      {"/v1/completions", {{"user", "u-1"}, {"best_of", 1}, {"echo", false}, {"suffix", nullptr}, {"n", 1}}},
  };
  for (const auto& [path, extra] : accepted) {
    json body = path == "/v1/completions" ? json{{"prompt", "hi"}} : json{{"messages", messages}};
    body["max_tokens"] = 2;
    body.update(extra);
    const Reply r = curl(s.port, path, post(body));
    EXPECT_EQ(r.status, 200) << path << " " << body << ": " << r.body;
  }
}

// The official OpenAI Node client asks for logprobs, top_logprobs,
// penalties, a logit bias and a stop string, and gets them in the shapes its
// types declare; the parameters it sends that would change the answer
// unserved (JSON mode) come back as its APIError naming the parameter.
TEST(Server, TheOfficialOpenAIClientGetsLogprobsPenaltiesBiasAndStop) {
  const std::filesystem::path client_dir = DEPCACHE_CLIENT_DIR;
  if (!std::filesystem::exists(client_dir / "node_modules" / "openai" / "package.json") ||
      std::system("node --version >/dev/null 2>&1") != 0)
    DEPCACHE_SKIP("node or the openai npm package missing (scripts/setup.sh installs them)");
  Served s;
  const std::string prompt = "Once upon a time there was a robot";
  constexpr int kTokens = 8;
  const std::string expected = generate_greedy(prompt, kTokens);
  ASSERT_GE(expected.size(), 4u);
  const std::string stop = expected.substr(expected.size() / 2, 2);
  const std::vector<int32_t> dog = s.tok->encode("dog", false, false);
  ASSERT_EQ(dog.size(), 1u);
  const test::CliRun r = test::run_shell(
      fmt::format("node {}/openai_check.mjs http://127.0.0.1:{}/v1 tiny none '{}' {} sampling {} '{}' 2>&1",
                  client_dir.string(), s.port, prompt, kTokens, dog[0], stop));
  ASSERT_EQ(r.code, 0) << r.out;
  const json out = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(out.is_discarded()) << r.out;
  EXPECT_EQ(out["completion"], expected);
  const json& lp = out["completion_logprobs"];
  std::string joined;
  for (const json& t : lp["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, expected) << lp;
  ASSERT_EQ(lp["top_logprobs"].size(), lp["tokens"].size());
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["top_logprobs"][i][lp["tokens"][i].get<std::string>()], lp["token_logprobs"][i]);
    EXPECT_LE(lp["top_logprobs"][i].size(), 4u);
  }
  const json& content = out["chat_logprobs"];
  ASSERT_FALSE(content.empty()) << out;
  std::string chat_joined;
  for (const json& e : content) {
    chat_joined += e["token"].get<std::string>();
    EXPECT_LE(e["logprob"].get<double>(), 0);
    EXPECT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]);
  }
  EXPECT_EQ(chat_joined, out["chat"]);
  expect_logprobs_alike(out["chat_streamed_logprobs"], content);
  EXPECT_EQ(out["biased"], " dog dog dog dog");
  EXPECT_TRUE(out["penalized"].is_string());
  EXPECT_EQ(out["stopped"], expected.substr(0, expected.find(stop)));
  EXPECT_EQ(out["stopped_reason"], "stop");
  EXPECT_EQ(out["json_mode"]["status"], 400) << out;
  EXPECT_EQ(out["json_mode"]["param"], "response_format") << out;
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

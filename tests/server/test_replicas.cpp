// Several `depcache serve` replicas behind a real HAProxy (Debian's), routed
// by `depcache route` through the Lua hook it writes, KV events over a real
// Redis: the router learns from the events what each replica holds, a
// request goes where its context was computed (documents in any order, as
// chunk reuse keeps them), new contexts spread over the replicas, and a
// replica killed under load costs no request and changes no answer.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kv/redis_connection.h"
#include "kv/remote_store.h"
#include "server/kv_event_publisher.h"
#include "server_client.h"
#include "test_support.h"

extern char** environ;

namespace depcache::test {
namespace DEPCACHE_TEST_FILE {

using json = nlohmann::json;

// HAProxy on a configuration, in the foreground, killed on destruction.
class Haproxy {
 public:
  explicit Haproxy(const std::filesystem::path& config) : log_(temp_path("haproxy-log")) {
    std::vector<std::string> all = {"/usr/sbin/haproxy", "-f", config.string(), "-db"};
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Haproxy() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove(log_);
  }
  std::string log() const {
    std::ifstream in(log_);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

struct Answer {
  int status = 0;
  std::string replica, text;
};

// A completion through `port`, greedy; which replica answered (HAProxy's
// X-Depcache-Replica) and its text.
Answer complete(int port, const json& body, const std::string& curl_args = "") {
  const auto headers = temp_path("headers");
  const Reply r = curl(port, "/v1/completions", curl_args + post(body) + " -D " + headers.string());
  Answer a{r.status, "", r.body};
  std::ifstream in(headers);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("x-depcache-replica: ", 0) == 0 || line.rfind("X-Depcache-Replica: ", 0) == 0)
      a.replica = line.substr(20, line.find_last_not_of("\r\n") - 19);
  std::filesystem::remove(headers);
  if (r.status != 200) return a;
  // A 200 whose body is cut short (a replica killed after its answer began)
  // counts as a failure, not as an answer.
  const json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.contains("choices")) {
    a.status = -1;
    return a;
  }
  a.text = j["choices"][0]["text"].get<std::string>();
  return a;
}

// The router's view of its replicas (GET /replicas); a reply that is not
// JSON (the router gone, or a request cut) fails the test with the router's
// log instead of throwing out of it.
json replicas_state(const ServeProcess& router, const std::string& curl_args = "") {
  const Reply r = curl(router.port(), "/replicas", curl_args);
  json state = json::parse(r.body, nullptr, false);
  if (state.is_discarded() || !state.is_array()) {
    ADD_FAILURE() << "GET /replicas answered " << r.status << " '" << r.body << "'\n" << router.log();
    return json::array();
  }
  return state;
}

// Context c: three documents; `turn` picks their order and the question.
json request(int c, int turn) {
  json docs = json::array();
  for (int d = 0; d < 3; ++d)
    docs.push_back({{"id", fmt::format("c{}d{}", c, d)},
                    {"text", fmt::format("document {} of topic {}: the {} river runs past {} hills and {} "
                                         "old mills where {} millers grind wheat",
                                         d, c, c * 7 + d, d + 2, c + 3, d * 5 + c)}});
  if (turn % 2 == 1) std::swap(docs[0], docs[2]);  // reordered: chunks reused wherever they sit
  return {{"prompt", fmt::format("question {} about topic {}?", turn, c)},
          {"max_tokens", 4},
          {"temperature", 0},
          {"ignore_eos", true},
          {"rag", {{"documents", docs}}}};
}

// Replicas r1 and r2 (`extra`: more serve options) publishing KV events on
// the Redis at `redis_at`, with chunk reuse; appends to `route_args` what
// names them. Empty `replicas` tail on failure (the test has failed).
void start_replicas(const std::string& model, const std::string& redis_at,
                    const std::vector<std::string>& extra,
                    std::vector<std::unique_ptr<ServeProcess>>& replicas,
                    std::vector<std::string>& route_args) {
  for (const char* name : {"r1", "r2"}) {
    std::vector<std::string> args = {"-m", model,        "--kv-events", "--redis", redis_at, "--replica-name",
                                     name, "--strategy", "fullreuse"};
    args.insert(args.end(), extra.begin(), extra.end());
    replicas.push_back(std::make_unique<ServeProcess>(args));
    if (replicas.back()->port() <= 0) {
      ADD_FAILURE() << replicas.back()->log();
      return;
    }
    route_args.push_back("--replica");
    route_args.push_back(fmt::format("{}=http://127.0.0.1:{}", name, replicas.back()->port()));
  }
}

// A request that starts and ends between two of the publisher's ticks leaves
// running and waiting as they were, yet is news: a router counts what it
// sent to a replica until that replica's next batch. The batch comes at the
// next tick, not at the heartbeat (here an hour away).
TEST(KvEventPublisher, ARequestThatEndedIsPublishedAtTheNextTick) {
  DEPCACHE_REQUIRE_REDIS(redis);
  RedisOptions ro;
  ro.timeout_ms = 1000;
  RedisConnection sub("127.0.0.1", redis.port(), ro);
  ASSERT_TRUE(sub.open(steady_now_ms() + 1000)) << sub.error();
  const RedisReply subscribed = sub.command({"SUBSCRIBE", "test-kv-events"}, steady_now_ms() + 1000);
  ASSERT_TRUE(subscribed && subscribed->type == REDIS_REPLY_ARRAY) << sub.error();
  // The next batch's header within `ms`, or null.
  const auto next_batch = [&](int64_t ms) {
    bool timed_out = false;
    const RedisReply m = sub.receive(steady_now_ms() + ms, &timed_out);
    if (!m || m->type != REDIS_REPLY_ARRAY || m->elements != 3) return json();
    return json::parse(std::string(m->element[2]->str, m->element[2]->len), nullptr, false);
  };

  KvEventPublisherOptions po;
  po.nodes = {{"127.0.0.1", redis.port()}};
  po.channel = "test-kv-events";
  po.header = {"r1", "e1", 16};
  po.heartbeat = std::chrono::hours(1);
  std::atomic<int64_t> ended{0};
  KvEventPublisher publisher(std::make_shared<KvEventLog>(16), po, [&] {
    return ReplicaLoad{0, 0, ended.load()};
  });
  const json first = next_batch(3000);  // its first load is news
  ASSERT_TRUE(first.is_object()) << "no first batch";
  EXPECT_FALSE(next_batch(300).is_object()) << "a batch with nothing new before the heartbeat";
  ended = 1;
  const json after = next_batch(3000);
  ASSERT_TRUE(after.is_object()) << "a request that ended was not published before the heartbeat";
  EXPECT_EQ(after["running"], 0);
  EXPECT_EQ(after["waiting"], 0);
  EXPECT_GT(after["seq"].get<int64_t>(), first["seq"].get<int64_t>());
}

// Tokens of an answer still being computed when its replica is killed.
constexpr int kLongAnswer = 600;

TEST(Replicas, ThroughHaproxyRequestsFollowTheirContextAndSurviveAKilledReplica) {
  REQUIRE_CURL();
  DEPCACHE_REQUIRE_REDIS(redis);
  if (!std::filesystem::exists("/usr/sbin/haproxy"))
    DEPCACHE_SKIP("haproxy not installed (scripts/setup.sh installs it)");
  const std::string model = serve_model_file().string();
  const std::string redis_at = "127.0.0.1:" + std::to_string(redis.port());
  std::vector<std::unique_ptr<ServeProcess>> replicas;
  std::vector<std::string> route_args = {"-m", model, "--redis", redis_at, "--strategy", "fullreuse"};
  start_replicas(model, redis_at, {}, replicas, route_args);
  ASSERT_EQ(replicas.size(), 2u);
  ASSERT_GT(replicas.back()->port(), 0);
  const auto config = temp_path("haproxy").replace_extension(".cfg");
  const int proxy_port = free_port();
  route_args.insert(route_args.end(),
                    {"--haproxy-config", config.string(), "--haproxy-port", std::to_string(proxy_port)});
  // The router reads every summary afresh 30 s after its last read, which
  // is after this.
  const auto router_started = std::chrono::steady_clock::now();
  ServeProcess router(route_args, "route");
  ASSERT_GT(router.port(), 0) << router.log();
  Haproxy proxy(config);
  for (int i = 0; i < 200 && curl(proxy_port, "/health").status != 200; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  ASSERT_EQ(curl(proxy_port, "/health").status, 200) << proxy.log();
  // The router has both replicas' summaries, and keeps them for a second
  // (subscribing to the events marks every replica for another read).
  using std::chrono::milliseconds;
  using std::chrono::steady_clock;
  steady_clock::time_point synced_since{};
  json state = json::array();
  for (const auto give_up = steady_clock::now() + std::chrono::seconds(20); steady_clock::now() < give_up;) {
    state = replicas_state(router);
    const bool both = state.size() == 2 && state[0]["synced"] == true && state[1]["synced"] == true;
    if (!both)
      synced_since = {};
    else if (synced_since == steady_clock::time_point{})
      synced_since = steady_clock::now();
    else if (steady_clock::now() - synced_since >= std::chrono::seconds(1))
      break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(synced_since != steady_clock::time_point{} &&
              steady_clock::now() - synced_since >= std::chrono::seconds(1))
      << "the router never synced both replicas: " << state.dump() << "\n"
      << router.log();

  // What the router learns from KV events alone. Each replica answers a new
  // context sent to it directly, past the router, so the router's
  // bookkeeping of what it routed knows nothing of it. The router read the
  // summaries above and reads one again only when a replica's numbering
  // breaks (it is then unsynced), when no batch came for 3 s (heartbeats
  // come every second), or 30 s after the last read: so while both stay
  // synced and heard from, within 30 s of the sync, what it knows of those
  // contexts came from events. It must then hold the keys each replica says
  // it holds (GET /v1/cache/summary, read here, not by the router).
  const auto events_start = steady_clock::now();
  const int direct_context[2] = {100, 101};
  for (size_t i = 0; i < 2; ++i) {
    const Answer a = complete(replicas[i]->port(), request(direct_context[i], 0));
    ASSERT_EQ(a.status, 200) << a.text << replicas[i]->log();
  }
  const auto own_keys = [&](size_t i) {
    const json summary = json::parse(curl(replicas[i]->port(), "/v1/cache/summary").body, nullptr, false);
    return summary.is_object() && summary.contains("block_hashes") ? summary["block_hashes"].size()
                                                                   : size_t{0};
  };
  bool caught_up = false;
  // Watched for longer than a replica may go unheard (3 s): a replica
  // whose batches do not come shows it.
  while (steady_clock::now() - events_start < std::chrono::seconds(15) &&
         (!caught_up || steady_clock::now() - events_start < milliseconds(3500))) {
    state = replicas_state(router);
    ASSERT_EQ(state.size(), 2u);
    bool all_there = true;
    for (size_t i = 0; i < 2; ++i) {
      ASSERT_EQ(state[i]["name"], i == 0 ? "r1" : "r2");
      ASSERT_EQ(state[i]["synced"], true) << "the router read a summary again: " << state.dump();
      const int64_t seen = state[i]["seen_ms_ago"];
      ASSERT_TRUE(seen >= 0 && seen < 2500) << "no KV event batch from " << state[i]["name"] << " for "
                                            << seen << " ms: " << state.dump() << "\n"
                                            << replicas[i]->log();
      const size_t held = own_keys(i);
      all_there = all_there && held > 0 && state[i]["blocks"].get<size_t>() == held;
    }
    caught_up = caught_up || all_there;
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(caught_up) << "the router never held what the replicas hold: " << state.dump() << " (r1 holds "
                         << own_keys(0) << ", r2 " << own_keys(1) << ")\n"
                         << router.log();
  // The router's view names the contexts where they were computed. Each
  // POST /route counts its request's keys as held where it sends it: so one
  // question per context, and none before these.
  const auto route = [&](const json& body) {
    const Reply routed = curl(router.port(), "/route", post(body));
    const json decision = json::parse(routed.body, nullptr, false);
    EXPECT_TRUE(decision.is_object() && decision.contains("held_tokens"))
        << "POST /route answered " << routed.status << " '" << routed.body << "'\n"
        << router.log();
    return decision.is_object() && decision.contains("held_tokens") ? decision : json();
  };
  const json same = route(request(direct_context[0], 0));  // the request r1 answered
  ASSERT_FALSE(same.is_null());
  EXPECT_EQ(same["replica"], "r1") << same.dump();
  EXPECT_EQ(same["held_tokens"]["r1"], same["tokens"]) << same.dump();
  EXPECT_LT(same["held_tokens"]["r2"].get<int64_t>(), same["tokens"].get<int64_t>()) << same.dump();
  const json reordered = route(request(direct_context[1], 1));  // r2's documents, reordered
  ASSERT_FALSE(reordered.is_null());
  EXPECT_EQ(reordered["replica"], "r2") << reordered.dump();
  EXPECT_GT(reordered["held_tokens"]["r2"].get<int64_t>(), reordered["tokens"].get<int64_t>() / 2)
      << reordered.dump();
  EXPECT_GT(reordered["held_tokens"]["r2"].get<int64_t>(), reordered["held_tokens"]["r1"].get<int64_t>())
      << reordered.dump();
  ASSERT_LT(steady_clock::now() - router_started, std::chrono::seconds(25))
      << "too slow to tell events from the router's 30 s summary reads";

  // Until the router has heard from both replicas that they are idle: each
  // request is then routed on what is held alone (the unit tests weigh it
  // against load).
  const auto idle = [&] {
    for (int i = 0; i < 100; ++i) {
      const json state = replicas_state(router);
      if (state.empty()) return;
      bool quiet = true;
      for (const json& r : state)
        quiet = quiet && r["routed_since_report"] == 0 && r["running"] == 0 && r["waiting"] == 0;
      if (quiet) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  // Eight contexts, three turns each, documents reordered between turns.
  std::map<int, std::set<std::string>> served_by;
  std::map<std::pair<int, int>, std::string> reference;
  for (int c = 0; c < 8; ++c)
    for (int turn = 0; turn < 3; ++turn) {
      const Answer a = complete(proxy_port, request(c, turn));
      ASSERT_EQ(a.status, 200) << a.text << proxy.log();
      ASSERT_FALSE(a.replica.empty());
      served_by[c].insert(a.replica);
      reference[{c, turn}] = a.text;
      idle();
    }
  std::set<std::string> first;
  for (const auto& [c, replicas_of] : served_by) {
    EXPECT_EQ(replicas_of.size(), 1u) << "context " << c << " went to " << replicas_of.size() << " replicas";
    first.insert(*replicas_of.begin());
  }
  EXPECT_EQ(first.size(), 2u);  // new contexts spread over both

  // r1 killed while two clients keep asking: every request answered (by r2
  // once r1 is gone: HAProxy retries a connection refused or reset), every
  // answer the one the same request got before. One long answer is being
  // computed on r1 when it dies: nothing of it has been sent (a non-streamed
  // answer leaves whole), so HAProxy retries it on r2 too.
  int on_r1 = -1;
  for (const auto& [c, replicas_of] : served_by)
    if (*replicas_of.begin() == "r1") on_r1 = c;
  ASSERT_GE(on_r1, 0);
  json long_request = request(on_r1, 0);
  long_request["max_tokens"] = kLongAnswer;
  Answer long_answer;
  std::thread long_client([&] { long_answer = complete(proxy_port, long_request); });
  const auto generating = [&] {
    const std::string m = replicas[0]->metrics();
    return sample(m, "depcache_requests_running") >= 1;
  };
  for (int i = 0; i < 200 && !generating(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::atomic<int> failures{0}, wrong{0}, done{0};
  const auto client = [&](int offset) {
    for (int i = 0; i < 12; ++i) {
      const int c = (i + offset) % 8, turn = i % 3;
      const Answer a = complete(proxy_port, request(c, turn));
      failures += a.status != 200;
      wrong += a.status == 200 && a.text != reference[{c, turn}];
      ++done;
    }
  };
  std::thread t1(client, 0), t2(client, 4);
  while (done < 6) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  replicas[0]->signal(SIGKILL);
  t1.join();
  t2.join();
  long_client.join();
  EXPECT_EQ(failures, 0) << proxy.log();
  EXPECT_EQ(wrong, 0);
  ASSERT_EQ(long_answer.status, 200) << long_answer.text << proxy.log();
  EXPECT_EQ(long_answer.replica, "r2") << "the long answer was not cut by the kill: make it longer";
  // The same answer r2 gives when asked directly.
  const Answer again = complete(proxy_port, long_request);
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(long_answer.text, again.text);
  std::filesystem::remove(config);
  std::filesystem::remove(std::filesystem::path(config).replace_extension(".lua"));
}

std::string bearer(const std::string& key) { return "-H 'Authorization: Bearer " + key + "' "; }

// Two tenants with keys of their own namespaces behind one router: the
// router answers each only about its own scope, so a tenant cannot learn
// from it what another sent; what shows every tenant is the operator's; the
// router reads the keyed replicas' summaries with the operator key; and a
// batch published on the channel without the deployment key's seal is
// counted and changes nothing.
TEST(Replicas, KeyedTenantsSeeOnlyTheirOwnScopeAndUnsealedBatchesMoveNothing) {
  REQUIRE_CURL();
  DEPCACHE_REQUIRE_REDIS(redis);
  if (!std::filesystem::exists("/usr/sbin/haproxy"))
    DEPCACHE_SKIP("haproxy not installed (scripts/setup.sh installs it)");
  const std::string model = serve_model_file().string();
  const std::string redis_at = "127.0.0.1:" + std::to_string(redis.port());
  const std::string tenant_a = "tenant-a-0123456789", tenant_b = "tenant-b-0123456789",
                    operator_key = "operator-0123456789";
  const auto keys = temp_path("api-keys"), op = temp_path("operator-key"), cache_key = temp_path("cache-key");
  std::ofstream(keys) << tenant_a << " alpha\n" << tenant_b << " beta\n";
  std::ofstream(op) << operator_key << "\n";
  std::ofstream(cache_key) << std::string(32, 'k');
  const std::vector<std::string> keyed = {"--api-key-file", keys.string(),      "--operator-key-file",
                                          op.string(),      "--cache-key-file", cache_key.string()};
  std::vector<std::unique_ptr<ServeProcess>> replicas;
  std::vector<std::string> route_args = {"-m", model, "--redis", redis_at, "--strategy", "fullreuse"};
  route_args.insert(route_args.end(), keyed.begin(), keyed.end());
  start_replicas(model, redis_at, keyed, replicas, route_args);
  ASSERT_EQ(replicas.size(), 2u);
  ASSERT_GT(replicas.back()->port(), 0);
  const auto config = temp_path("haproxy").replace_extension(".cfg");
  const int proxy_port = free_port();
  route_args.insert(route_args.end(),
                    {"--haproxy-config", config.string(), "--haproxy-port", std::to_string(proxy_port)});
  ServeProcess router(route_args, "route");
  ASSERT_GT(router.port(), 0) << router.log();
  Haproxy proxy(config);
  for (int i = 0; i < 200 && curl(proxy_port, "/health").status != 200; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  ASSERT_EQ(curl(proxy_port, "/health").status, 200) << proxy.log();

  // The operator's endpoints, and the router's decisions, need their keys.
  for (const std::string& who : {std::string(), bearer(tenant_a)}) {
    EXPECT_EQ(curl(router.port(), "/replicas", who).status, 401) << who;
    EXPECT_EQ(curl(router.port(), "/metrics", who).status, 401) << who;
    EXPECT_EQ(curl(replicas[0]->port(), "/metrics", who).status, 401) << who;
    EXPECT_EQ(curl(replicas[0]->port(), "/v1/cache/summary", who).status, 401) << who;
  }
  EXPECT_EQ(curl(replicas[0]->port(), "/metrics", bearer(operator_key)).status, 200);
  EXPECT_EQ(curl(router.port(), "/route", post(request(1, 0))).status, 401);
  EXPECT_EQ(curl(router.port(), "/route", bearer(operator_key) + post(request(1, 0))).status, 401);

  // The router reads the keyed replicas' summaries (with the operator key).
  json state;
  for (int i = 0; i < 400; ++i) {
    state = replicas_state(router, bearer(operator_key));
    if (state.size() == 2 && state[0]["synced"] == true && state[1]["synced"] == true) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_TRUE(state.size() == 2 && state[0]["synced"] == true && state[1]["synced"] == true)
      << "the router never read the keyed replicas' summaries: " << state.dump() << "\n"
      << router.log();

  // Tenant A's context through the proxy; then each tenant asks the router
  // about the same request. A finds it where it was computed; B, in its own
  // scope, nowhere.
  const Answer answered = complete(proxy_port, request(1, 0), bearer(tenant_a));
  ASSERT_EQ(answered.status, 200) << answered.text << proxy.log();
  ASSERT_FALSE(answered.replica.empty());
  const auto ask = [&](const std::string& key) {
    const Reply r = curl(router.port(), "/route", bearer(key) + post(request(1, 0)));
    const json d = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(r.status == 200 && d.contains("held_tokens")) << r.status << " " << r.body;
    return d;
  };
  const json as_a = ask(tenant_a);
  ASSERT_TRUE(as_a.contains("held_tokens"));
  EXPECT_EQ(as_a["held_tokens"][answered.replica], as_a["tokens"]) << as_a.dump();
  const json as_b = ask(tenant_b);
  ASSERT_TRUE(as_b.contains("held_tokens"));
  for (const auto& [name, held] : as_b["held_tokens"].items())
    EXPECT_EQ(held, 0) << "tenant B learns from the router that " << name
                       << " holds A's context: " << as_b.dump();

  // Sealed batches from the replicas are taken; an unsealed one naming r1's
  // next batch with a huge queue, and one with a seal that is not the key's,
  // are counted and change nothing.
  const auto router_metric = [&](const std::string& outcome) {
    return sample(curl(router.port(), "/metrics", bearer(operator_key)).body,
                  "depcache_router_event_batches_total{outcome=\"" + outcome + "\"}");
  };
  for (int i = 0; i < 200 && router_metric("applied") < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(router_metric("applied"), 1) << router.log();
  state = replicas_state(router, bearer(operator_key));
  ASSERT_EQ(state.size(), 2u);
  const std::string forged = json{
      {"replica", "r1"},
      {"epoch", state[0]["epoch"]},
      {"seq", state[0]["seq"].get<int64_t>() + 1},
      {"block_size", 16},
      {"running", 0},
      {"waiting", 1000000},
      {"events", json::array()}}.dump();
  RedisOptions ro;
  ro.timeout_ms = 1000;
  RedisConnection publisher("127.0.0.1", redis.port(), ro);
  ASSERT_TRUE(publisher.open(steady_now_ms() + 1000)) << publisher.error();
  const double refused_before = router_metric("refused");
  for (const std::string& message : {forged, std::string(64, 'a') + forged}) {
    const RedisReply r =
        publisher.command({"PUBLISH", ro.prefix + "kv-events", message}, steady_now_ms() + 1000);
    ASSERT_TRUE(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1) << "the router is not subscribed";
  }
  for (int i = 0; i < 200 && router_metric("refused") < refused_before + 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(router_metric("refused"), refused_before + 2) << router.log();
  state = replicas_state(router, bearer(operator_key));
  ASSERT_EQ(state.size(), 2u);
  EXPECT_LT(state[0]["waiting"].get<int64_t>(), 1000) << "a forged batch set r1's queue: " << state.dump();
  EXPECT_EQ(state[0]["synced"], true);
  std::filesystem::remove(config);
  std::filesystem::remove(std::filesystem::path(config).replace_extension(".lua"));
  for (const auto& f : {keys, op, cache_key}) std::filesystem::remove(f);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache::test

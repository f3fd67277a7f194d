// The server's token counters add up, per request (usage) and in /metrics:
// reused tokens by tier sum to the reused tokens, and under one-pass
// strategies reused plus computed is the prompt. GraphRAG requests whose
// trees share path prefixes (several runs of a request place the same rows)
// through a real HTTP server on loopback, with the KV found in the hot and
// host tiers, on disk after a restart over the same directory, and in a
// real Redis by a server that never computed it.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "kv/disk_store.h"
#include "kv/remote_store.h"
#include "model/model.h"
#include "model/vocab.h"
#include "server/http_server.h"
#include "server/server_client.h"
#include "test_support.h"

namespace depcache {
namespace {

using nlohmann::json;
using test::curl;
using test::post;
using test::Reply;
using test::sample;

const char* const kTiers[RadixIndex::kTiers] = {"hot", "host", "disk", "remote"};

// The lower tiers a server runs with (each optional).
struct Tiers {
  size_t hot_bytes = size_t{1} << 30;
  size_t host_bytes = 0;
  std::optional<std::filesystem::path> disk_dir;
  int redis_port = 0;
};

// An HTTP server over an engine loop in this process, on a free port, its
// disk tier persisted when it stops (as `depcache serve` does).
struct Served {
  std::shared_ptr<const Model> model = Model::load(test::serve_model_file());
  std::shared_ptr<const Tokenizer> tok = std::make_shared<const Tokenizer>(Vocab::from_gguf(model->file()));
  std::unique_ptr<DiskSpanStore> disk;
  std::unique_ptr<RedisStore> redis;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<HttpServer> http;
  int port = 0;

  explicit Served(const Tiers& tiers) {
    if (tiers.disk_dir) disk = std::make_unique<DiskSpanStore>(*tiers.disk_dir, size_t{256} << 20);
    if (tiers.redis_port > 0) {
      RedisOptions o;
      o.port = tiers.redis_port;
      redis = std::make_unique<RedisStore>(o);
    }
    EngineOptions eo;
    eo.pool_rows = 8192;
    eo.threads = 2;
    eo.cache_bytes = tiers.hot_bytes;
    eo.tokenizer = tok;
    eo.eog_ids = tok->eog_ids();
    const size_t host_bytes = tiers.host_bytes;
    loop = std::make_unique<EngineLoop>(
        model, eo,
        [this, host_bytes](Engine& e) {
          if (host_bytes > 0) e.index().attach_host(host_bytes);
          if (disk) e.index().attach_disk(*disk);
          if (redis) e.index().attach_remote(*redis, 8);
        },
        [this](Engine& e) {
          if (disk) e.index().persist();
        });
    ServerOptions so;
    so.port = 0;
    so.strategy = "depcache";
    http = std::make_unique<HttpServer>(so);
    port = http->listen();
    test::warm_up_http_library(port);
    http->ready({"tiny", tok, 8192, std::nullopt, nullptr, nullptr, {}}, *loop);
  }
  // Stops the server, then the loop (which persists the disk tier).
  void stop() {
    if (http) http->shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(10));
    http.reset();
    loop.reset();
  }
  ~Served() { stop(); }
};

// Entities whose relation paths share prefixes ("eN -is a-> kind -" in two
// paths, "eN -" in all three), so each tree's runs share rows.
json entity_json(int n) {
  const std::string e = "entity" + std::to_string(n);
  return {{"name", e},
          {"label", e},
          {"paths",
           {e + " -is a-> kind" + std::to_string(n % 3) + " -is a-> thing",
            e + " -is a-> kind" + std::to_string(n % 3) + " -lives in-> place" + std::to_string(n % 4),
            e + " -eats-> food" + std::to_string(n % 5)}}};
}

// Request i of a stream: three of eight entities, overlapping its neighbours.
json request_body(int i) {
  json entities = json::array();
  for (int k : {0, 1, 3}) entities.push_back(entity_json((i + k) % 8));
  return {{"prompt", "Which of them eats food" + std::to_string(i % 5) + "?"},
          {"max_tokens", 2},
          {"temperature", 0},
          {"rag", {{"strategy", "depcache"}, {"entities", entities}}}};
}

struct Totals {
  int64_t prompt = 0, computed = 0, reused = 0;
  int64_t from[RadixIndex::kTiers] = {};
};

// Requests [first, first + n) one after another; each one's usage adds up.
Totals send(const Served& s, int first, int n, const std::string& label) {
  Totals t;
  for (int i = first; i < first + n; ++i) {
    const Reply r = curl(s.port, "/v1/completions", post(request_body(i)));
    EXPECT_EQ(r.status, 200) << label << ": " << r.body;
    if (r.status != 200) continue;
    const json u = r.j()["usage"];
    int64_t by_tier = 0;
    for (int k = 0; k < RadixIndex::kTiers; ++k) {
      const int64_t v = u["reused_from"][kTiers[k]];
      t.from[k] += v;
      by_tier += v;
    }
    const int64_t prompt = u["prompt_tokens"], computed = u["computed_tokens"], reused = u["reused_tokens"];
    EXPECT_EQ(by_tier, reused) << label << " #" << i << ": " << u;
    EXPECT_EQ(reused + computed, prompt) << label << " #" << i << ": " << u;
    t.prompt += prompt;
    t.computed += computed;
    t.reused += reused;
  }
  return t;
}

// The scrape's counters add up and equal what the responses said.
void expect_metrics_add_up(const Served& s, const Totals& t, const std::string& label) {
  const Reply m = curl(s.port, "/metrics");
  ASSERT_EQ(m.status, 200) << label;
  const double prompt = sample(m.body, "depcache_prompt_tokens_total");
  const double computed = sample(m.body, "depcache_computed_tokens_total");
  const double reused = sample(m.body, "depcache_reused_tokens_total");
  double by_tier = 0;
  for (int k = 0; k < RadixIndex::kTiers; ++k) {
    const double v =
        sample(m.body, fmt::format("depcache_reused_tokens_by_tier_total{{tier=\"{}\"}}", kTiers[k]));
    EXPECT_EQ(v, static_cast<double>(t.from[k])) << label << " " << kTiers[k];
    by_tier += v;
  }
  EXPECT_EQ(by_tier, reused) << label;
  EXPECT_EQ(computed + reused, prompt) << label;
  EXPECT_EQ(prompt, static_cast<double>(t.prompt)) << label;
  EXPECT_EQ(reused, static_cast<double>(t.reused)) << label;
  EXPECT_GT(reused, 0) << label;
}

// A hot tier of ~1.5 requests' KV over a host tier, then a restart over the
// same disk directory.
TEST(MetricsSum, ReusedByTierSumsToReusedThroughHostAndDiskAcrossARestart) {
  REQUIRE_CURL();
  const auto dir = test::temp_path("metrics-sum-disk");
  Totals first;
  {
    Served s({size_t{768} << 10, size_t{256} << 20, dir, 0});
    first = send(s, 0, 16, "hot and host");
    expect_metrics_add_up(s, first, "hot and host");
    EXPECT_GT(first.from[0], 0) << "hot";
    EXPECT_GT(first.from[1], 0) << "host";
  }
  {
    Served s({size_t{1} << 30, 0, dir, 0});  // restarted: what the first left is on disk
    const Totals again = send(s, 0, 16, "disk");
    expect_metrics_add_up(s, again, "disk");
    EXPECT_GT(again.from[2], 0) << "disk";
  }
  std::filesystem::remove_all(dir);
}

// One server publishes to Redis; another, which computed nothing, finds it there.
TEST(MetricsSum, ReusedByTierSumsToReusedThroughRedis) {
  REQUIRE_CURL();
  DEPCACHE_REQUIRE_REDIS(redis);
  {
    Served s({size_t{1} << 30, 0, std::nullopt, redis.port()});
    expect_metrics_add_up(s, send(s, 0, 8, "publisher"), "publisher");
  }
  Served s({size_t{1} << 30, 0, std::nullopt, redis.port()});
  const Totals t = send(s, 0, 8, "remote");
  expect_metrics_add_up(s, t, "remote");
  EXPECT_GT(t.from[3], 0) << "remote";
}

}  // namespace
}  // namespace depcache

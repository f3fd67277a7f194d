// The server's token counters add up, per request (usage) and in /metrics:
// reused tokens by tier are what the index counted in each lower tier (and
// the rest of what was placed for the hot one), scenarios whose KV sits in
// one tier report it all from there, and under one-pass strategies reused
// plus computed is the prompt. GraphRAG requests whose
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
#include <thread>
#include <vector>

#include "engine/engine_loop.h"
#include "engine_fixtures.h"
#include "kv/disk_store.h"
#include "kv/remote_store.h"
#include "model/model.h"
#include "model/vocab.h"
#include "server/http_server.h"
#include "server/server_client.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

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
          if (host_bytes > 0) EngineTestPeer::index(e).attach_host(host_bytes);
          if (disk) EngineTestPeer::index(e).attach_disk(*disk);
          if (redis) EngineTestPeer::index(e).attach_remote(*redis, 8);
        },
        [this](Engine& e) {
          if (disk) EngineTestPeer::index(e).persist();
        });
    ServerOptions so;
    so.port = 0;
    so.strategy = "depcache";
    http = std::make_unique<HttpServer>(so);
    port = http->listen();
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

// What a request reused, by tier, and what it placed in all as the computed
// tokens leave it (prompt - computed, under one-pass strategies).
struct Usage {
  int64_t from[RadixIndex::kTiers] = {};
  int64_t placed = 0;
};

struct Totals {
  int64_t prompt = 0, computed = 0, reused = 0;
  int64_t from[RadixIndex::kTiers] = {};
  std::vector<Usage> each;  // by request, in order
};

// The index's own hit counts by tier, from /metrics once the engine loop has
// reported `finished` requests ended: the loop publishes that count and the
// index's figures together, after the step that ended them.
struct IndexHits {
  int64_t tier[RadixIndex::kTiers] = {};
  int64_t finished = 0;
};
IndexHits index_hits(const Served& s, int64_t finished) {
  IndexHits h;
  for (int tries = 0; tries < 500; ++tries) {
    const Reply m = curl(s.port, "/metrics");
    h.finished = static_cast<int64_t>(sample(m.body, "depcache_requests_total{outcome=\"finished\"}"));
    if (h.finished >= finished) {
      for (int k = 0; k < RadixIndex::kTiers; ++k)
        h.tier[k] = static_cast<int64_t>(
            sample(m.body, fmt::format("depcache_index_hit_tokens_total{{tier=\"{}\"}}", kTiers[k])));
      return h;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "the engine never reported " << finished << " requests ended (" << h.finished << ")";
  return h;
}

// Requests [first, first + n) one after another; each one's usage adds up
// and agrees with what the index counted for it. A token matched in the
// host, disk or remote tier is brought to the hot tier, so only the first
// lookup of a request that uses it finds it there, and the index counts it
// in that tier exactly once, as the usage does; the tokens a later lookup
// of the same request matches again (shared path prefixes) are hot and
// placed already. So the lower tiers' usage equals the index's hits there,
// and the hot tier's is the rest of what was placed.
Totals send(const Served& s, int first, int n, const std::string& label) {
  Totals t;
  IndexHits before = index_hits(s, 0);
  for (int i = first; i < first + n; ++i) {
    const Reply r = curl(s.port, "/v1/completions", post(request_body(i)));
    EXPECT_EQ(r.status, 200) << label << ": " << r.body;
    if (r.status != 200) continue;
    const json u = r.j()["usage"];
    const int64_t prompt = u["prompt_tokens"], computed = u["computed_tokens"], reused = u["reused_tokens"];
    Usage use;
    use.placed = prompt - computed;
    for (int k = 0; k < RadixIndex::kTiers; ++k) {
      use.from[k] = u["reused_from"][kTiers[k]];
      t.from[k] += use.from[k];
    }
    const IndexHits after = index_hits(s, before.finished + 1);
    int64_t lower = 0;
    for (int k = 1; k < RadixIndex::kTiers; ++k) {
      const int64_t hits = after.tier[k] - before.tier[k];
      EXPECT_EQ(use.from[k], hits) << label << " #" << i << " " << kTiers[k] << ": " << u;
      lower += hits;
    }
    EXPECT_EQ(use.from[0], use.placed - lower) << label << " #" << i << " hot: " << u;
    EXPECT_LE(use.from[0], after.tier[0] - before.tier[0]) << label << " #" << i << " hot: " << u;
    EXPECT_EQ(reused, use.placed) << label << " #" << i << ": " << u;
    before = after;
    t.each.push_back(use);
    t.prompt += prompt;
    t.computed += computed;
    t.reused += reused;
  }
  return t;
}

// The scrape's counters equal what the responses said, and by tier what the
// index counted (the lower tiers: its hits there; hot: the rest of what was
// placed).
void expect_metrics_add_up(const Served& s, const Totals& t, const std::string& label) {
  const IndexHits hits = index_hits(s, static_cast<int64_t>(t.each.size()));
  const Reply m = curl(s.port, "/metrics");
  ASSERT_EQ(m.status, 200) << label;
  const double prompt = sample(m.body, "depcache_prompt_tokens_total");
  const double computed = sample(m.body, "depcache_computed_tokens_total");
  const double reused = sample(m.body, "depcache_reused_tokens_total");
  double by_tier[RadixIndex::kTiers] = {};
  for (int k = 0; k < RadixIndex::kTiers; ++k) {
    by_tier[k] =
        sample(m.body, fmt::format("depcache_reused_tokens_by_tier_total{{tier=\"{}\"}}", kTiers[k]));
    EXPECT_EQ(by_tier[k], static_cast<double>(t.from[k])) << label << " " << kTiers[k];
  }
  double lower = 0;
  for (int k = 1; k < RadixIndex::kTiers; ++k) {
    EXPECT_EQ(by_tier[k], static_cast<double>(hits.tier[k])) << label << " " << kTiers[k];
    lower += static_cast<double>(hits.tier[k]);
  }
  EXPECT_EQ(by_tier[0], prompt - computed - lower) << label << " hot";
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
    EXPECT_EQ(first.from[3], 0) << "no remote tier";
    EXPECT_GT(first.from[0], 0) << "hot";
    EXPECT_GT(first.from[1], 0) << "host";
  }
  {
    Served s({size_t{1} << 30, 0, dir, 0});  // restarted: what the first left is on disk
    const Totals again = send(s, 0, 16, "disk");
    expect_metrics_add_up(s, again, "disk");
    EXPECT_EQ(again.from[1], 0) << "no host tier";
    EXPECT_EQ(again.from[3], 0) << "no remote tier";
    // The first request finds its trees, all of which the first server
    // computed, on disk, and nothing else in memory than what its own
    // earlier lookups brought in (trees alone share the KV of their
    // common first tokens).
    ASSERT_FALSE(again.each.empty());
    EXPECT_GT(again.each[0].from[2], 0) << "disk";
    EXPECT_EQ(again.each[0].from[2] + again.each[0].from[0], again.each[0].placed) << "disk";
  }
  std::filesystem::remove_all(dir);
}

// One server publishes to Redis; another, which computed nothing, finds it there.
TEST(MetricsSum, ReusedByTierSumsToReusedThroughRedis) {
  REQUIRE_CURL();
  DEPCACHE_REQUIRE_REDIS(redis);
  {
    Served s({size_t{1} << 30, 0, std::nullopt, redis.port()});
    const Totals t = send(s, 0, 8, "publisher");
    expect_metrics_add_up(s, t, "publisher");
    EXPECT_EQ(t.from[3], 0) << "it holds all it published";
  }
  Served s({size_t{1} << 30, 0, std::nullopt, redis.port()});
  const Totals t = send(s, 0, 8, "remote");
  expect_metrics_add_up(s, t, "remote");
  EXPECT_EQ(t.from[1], 0) << "no host tier";
  EXPECT_EQ(t.from[2], 0) << "no disk tier";
  // The first request finds every tree it looks up in Redis (the publisher
  // computed the same request), and nothing else in memory than what its
  // own earlier lookups brought in.
  ASSERT_FALSE(t.each.empty());
  EXPECT_GT(t.each[0].from[3], 0) << "remote";
  EXPECT_EQ(t.each[0].from[3] + t.each[0].from[0], t.each[0].placed) << "remote";
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

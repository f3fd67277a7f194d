// Lower tiers read ahead of admission (SpanFetcher): with a disk or a Redis
// attached, the engine's thread never reads them itself. A Redis that
// stops answering holds up only the request that reads it: every step stays
// short and requests that look nothing up are served meanwhile; that request
// then runs with what Redis gave. Reuse from spans fetched ahead is reported
// by the tier they came from, each token once, and gives the answers
// computing gives: the counts by tier are checked against what the scenario
// left in each tier (and the index's own hit counts), not against their sum.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <utility>

#include "engine/engine.h"
#include "engine_fixtures.h"
#include "graph_requests.h"
#include "kv/disk_store.h"
#include "kv/remote_store.h"
#include "model/tokenizer.h"
#include "model/vocab.h"
#include "test_support.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using test::engine_options;
using test::graph_request;
using test::greedy;

constexpr int kHot = static_cast<int>(Tier::Hot), kDisk = static_cast<int>(Tier::Disk),
              kRemote = static_cast<int>(Tier::Remote);

RedisOptions redis_options(int port) {
  RedisOptions o;
  o.port = port;
  o.timeout_ms = 5000;   // longer than the pause below: the read waits it out
  o.retry_after_ms = 0;  // and no call is skipped
  return o;
}

struct Asked {
  std::string strategy;
  PromptParts parts;
};

std::vector<Asked> requests(const Tokenizer& tok) {
  using test::kCat;
  using test::kDog;
  using test::kOwl;
  return {{"prefix", make_prompt_parts(tok, graph_request({kDog, kCat}, "Which animals?"))},
          {"depcache", make_prompt_parts(tok, graph_request({kOwl, kDog}, "Which hunt?"))},
          {"prefix", make_prompt_parts(tok, graph_request({kDog, kCat}, "Which purr?"))},
          {"depcache", make_prompt_parts(tok, graph_request({kDog, kOwl, kCat}, "Which eat mice?"))}};
}

// Tokens placed from the index, as the computed ones leave them (one-pass
// plans): independent of the count by tier.
int64_t placed(const PrefillReport& r) { return r.prompt_tokens - r.computed_tokens; }

// The positions (namespace and token prefix) that the requests' lookups
// place, each counted once. With everything the requests look up cached in
// one lower tier and nothing in memory, each position is found there by the
// first request that uses it and is hot for any later one (or a later run of
// the same request), so this is exactly what the requests report from that
// tier. The prompt's last token is always computed: a lookup of the whole
// prompt (prefix) places all but it.
int64_t positions_placed(Engine& e, const std::vector<Asked>& asked) {
  std::set<std::pair<uint64_t, std::vector<int32_t>>> positions;
  for (const Asked& a : asked) {
    const std::vector<int32_t> prompt = a.parts.flat();
    for (const Lookup& l : e.lookups_of(a.strategy, a.parts)) {
      const size_t n = l.tokens == prompt ? l.tokens.size() - 1 : l.tokens.size();
      for (size_t t = 1; t <= n; ++t)
        positions.emplace(
            l.ns, std::vector<int32_t>(l.tokens.begin(), l.tokens.begin() + static_cast<std::ptrdiff_t>(t)));
    }
  }
  return static_cast<int64_t>(positions.size());
}

TEST(SpanFetch, ASlowRedisStallsNeitherTheEngineNorRequestsThatDoNotReadIt) {
  DEPCACHE_REQUIRE_REDIS(redis);
  const auto model = test::random_model("tiny", DType::F32, false, 4);
  const Tokenizer tok(Vocab::builtin_bytes());
  const Asked asked = requests(tok)[0];
  // Another replica computes the request and publishes its KV.
  RequestResult want;
  {
    RedisStore store(redis_options(redis.port()));
    Engine publisher(model, engine_options());
    EngineTestPeer::index(publisher).attach_remote(store, 8);
    const RequestId id = publisher.submit(asked.strategy, asked.parts, greedy(4));
    publisher.run_until_idle();
    want = publisher.result(id);
    EngineTestPeer::index(publisher).detach_remote();
  }
  RedisStore store(redis_options(redis.port()));
  Engine e(model, engine_options());
  EngineTestPeer::index(e).attach_remote(store, 8);
  RagRequest plain;
  plain.question = "What happened next?";
  plain.text = "A dog ran along the river until it reached the old mill.";
  const PromptParts other = make_prompt_parts(tok, plain);

  ASSERT_EQ(test::run_shell("redis-cli -p " + std::to_string(redis.port()) + " CLIENT PAUSE 1500 ALL").code,
            0);
  const auto paused = steady_clock::now();
  const RequestId reader = e.submit(asked.strategy, asked.parts, greedy(4));
  // Requests that look nothing up ("full") keep coming while it waits.
  std::vector<RequestId> others;
  auto longest_step = steady_clock::duration::zero();
  int served_while_paused = 0;
  while (steady_clock::now() - paused < std::chrono::seconds(20)) {
    if (steady_clock::now() - paused < milliseconds(1200) && e.n_waiting() + e.n_running() < 3)
      others.push_back(e.submit("full", other, greedy(3)));
    const auto t0 = steady_clock::now();
    const bool more = e.step();
    longest_step = std::max(longest_step, steady_clock::now() - t0);
    if (!more) break;
  }
  for (RequestId id : others) {
    const RequestResult& r = e.result(id);
    ASSERT_EQ(r.state, RequestState::Finished) << r.error;
    served_while_paused += r.done - paused < milliseconds(1300);
  }
  EXPECT_LT(longest_step, milliseconds(400)) << "a step waited on Redis";
  EXPECT_GE(served_while_paused, 3) << "requests that read nothing waited for the one reading Redis";
  const RequestResult& got = e.result(reader);
  ASSERT_EQ(got.state, RequestState::Finished) << got.error;
  EXPECT_GT(got.first_token - paused, milliseconds(1000)) << "it ran before Redis answered";
  EXPECT_EQ(got.tokens, want.tokens);
  // Nothing was in memory and the publisher computed this very prompt: every
  // token but the last (always computed) came from Redis, and the lookup
  // the index counted matched the whole prompt there.
  const auto prompt = static_cast<int64_t>(asked.parts.flat().size());
  EXPECT_EQ(placed(got.report), prompt - 1);
  for (int t = 0; t < RadixIndex::kTiers; ++t) {
    EXPECT_EQ(got.report.reused_from[t], t == kRemote ? prompt - 1 : 0) << "tier " << t;
    EXPECT_EQ(e.index().stats().hit_tokens[t], t == kRemote ? prompt : 0) << "tier " << t;
  }
  EXPECT_EQ(e.index().n_pinned(), 0u);
}

// A first replica computes every request with a disk tier and a Redis; a
// second over a copy of the directory and a third over the Redis answer
// them all at once, fetching ahead.
TEST(SpanFetch, ReuseFetchedAheadIsReportedByTheTierItCameFrom) {
  DEPCACHE_REQUIRE_REDIS(redis);
  const auto model = test::random_model("tiny", DType::F32, false, 4);
  const Tokenizer tok(Vocab::builtin_bytes());
  const auto dir = test::temp_path("span-fetch");
  const std::vector<Asked> asked = requests(tok);
  std::vector<RequestResult> want;
  {
    DiskSpanStore disk(dir / "first", 64 << 20);
    RedisStore store(redis_options(redis.port()));
    Engine first(model, engine_options());
    EngineTestPeer::index(first).attach_disk(disk);
    EngineTestPeer::index(first).attach_remote(store, 8);
    for (const Asked& a : asked) {  // one at a time: the later ones reuse the earlier ones' KV
      const RequestId id = first.submit(a.strategy, a.parts, greedy(4));
      first.run_until_idle();
      want.push_back(first.result(id));
    }
    first.save_strategy_state(dir / "first");
    EngineTestPeer::index(first).detach_remote();
    EngineTestPeer::index(first).persist();
  }
  std::filesystem::copy(dir / "first", dir / "second", std::filesystem::copy_options::recursive);
  for (const bool from_disk : {true, false}) {
    const std::string label = from_disk ? "disk" : "remote";
    std::optional<DiskSpanStore> disk;
    std::optional<RedisStore> store;
    EngineOptions o = engine_options();
    o.prefetch = 2;
    Engine e(model, o);
    if (from_disk) {
      disk.emplace(dir / "second", 64 << 20);
      EngineTestPeer::index(e).attach_disk(*disk);
      e.load_strategy_state(dir / "second");
    } else {
      store.emplace(redis_options(redis.port()));
      EngineTestPeer::index(e).attach_remote(*store, 8);
    }
    std::vector<RequestId> ids;
    for (const Asked& a : asked) ids.push_back(e.submit(a.strategy, a.parts, greedy(4)));
    e.run_until_idle();
    // The first replica computed and left everything the requests look up,
    // in the one tier this replica has besides memory.
    const int lower = from_disk ? kDisk : kRemote;
    const int64_t in_lower = positions_placed(e, asked);
    ASSERT_GT(in_lower, 0) << label;
    int64_t found = 0, hot = 0, all = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const RequestResult& r = e.result(ids[i]);
      ASSERT_EQ(r.state, RequestState::Finished) << label << ": " << r.error;
      EXPECT_EQ(r.tokens, want[i].tokens) << label << " #" << i;
      for (int t = 0; t < RadixIndex::kTiers; ++t) {
        if (t != kHot && t != lower) {
          EXPECT_EQ(r.report.reused_from[t], 0) << label << " #" << i << ": tier " << t << " is not attached";
        }
      }
      EXPECT_EQ(r.report.reused_from[kHot] + r.report.reused_from[lower], placed(r.report))
          << label << " #" << i;
      found += r.report.reused_from[lower];
      hot += r.report.reused_from[kHot];
      all += placed(r.report);
    }
    EXPECT_EQ(found, in_lower) << label << ": each token left there is reported from there once";
    EXPECT_EQ(hot, all - in_lower) << label << ": the rest was hot when found";
    EXPECT_GT(e.prefetched_tokens(), 0) << label;
    EXPECT_EQ(e.index().n_pinned(), 0u) << label;
    e.index().check_invariants();
    if (store) EngineTestPeer::index(e).detach_remote();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

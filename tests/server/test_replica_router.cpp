// The router's view of the replicas: event batches and summaries as the
// replicas write them (kv_events_json, and the summary's fields), hostile
// ones refused, gaps and restarts sending it back to the summary, and a
// request routed to the replica that holds its lookups unless its queue
// costs more than computing them elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "kv/kv_events.h"
#include "server/replica_router.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using json = nlohmann::json;

std::string summary(const std::string& name, const std::string& epoch, int64_t seq, const KvEventLog& log,
                    int64_t block = 4, int64_t running = 0) {
  json hashes = json::array();
  for (const uint64_t k : log.summary().keys) hashes.push_back(fmt::format("{:016x}", k));
  return json{{"replica", name},       {"epoch", epoch},     {"seq", seq},
              {"block_size", block},   {"running", running}, {"waiting", 0},
              {"block_hashes", hashes}}
      .dump();
}

Lookup lookup(uint64_t ns, int n, int32_t first = 1) {
  Lookup l{ns, {}};
  for (int i = 0; i < n; ++i) l.tokens.push_back(first + i);
  return l;
}

// Replicas r1 and r2 keyed in blocks of 4, a queued request counting 10 tokens.
ReplicaRouter two_replicas(RouterOptions o = {}) {
  o.block_tokens = 4;
  o.load_tokens = 10;
  return ReplicaRouter({{"r1", "http://127.0.0.1:1"}, {"r2", "http://127.0.0.1:2"}}, o);
}

// Both replicas read from summaries of `log` (epochs e1 and e2, batch 0).
void sync_both(ReplicaRouter& router, const KvEventLog& log) {
  std::string why;
  ASSERT_TRUE(router.apply_summary("r1", summary("r1", "e1", 0, log), &why)) << why;
  ASSERT_TRUE(router.apply_summary("r2", summary("r2", "e2", 0, log), &why)) << why;
}

TEST(ReplicaRouter, RoutesToTheReplicaHoldingTheLookupsUnlessItsQueueCostsMore) {
  ReplicaRouter router = two_replicas();
  KvEventLog a(4), b(4);
  const Lookup doc = lookup(7, 30), other = lookup(8, 30, 100);
  a.stored(doc.ns, doc.tokens, 0);      // r1 holds the document's 30 tokens
  b.stored(other.ns, other.tokens, 0);  // r2 another
  std::string why;
  ASSERT_TRUE(router.apply_summary("r1", summary("r1", "e1", 0, a), &why)) << why;
  ASSERT_TRUE(router.apply_summary("r2", summary("r2", "e2", 0, b), &why)) << why;
  auto d = router.route({doc, lookup(9, 5, 300)});
  EXPECT_EQ(d.replica, "r1");
  EXPECT_EQ(d.matched, (std::vector<int64_t>{30, 0}));
  EXPECT_EQ(d.total, 35);
  // Half a lookup held: the blocks up to where the chain breaks.
  Lookup longer = doc;
  for (int i = 0; i < 10; ++i) longer.tokens.push_back(500 + i);
  EXPECT_EQ(router.route({longer}).matched[0], 28);  // 7 whole blocks of 4; the end key differs
  // A queue at r1 (4 running at 10 tokens each; a report resets what was
  // routed there since) costs more than computing the 30 tokens on r2.
  ASSERT_TRUE(router.apply_summary("r1", summary("r1", "e1", 0, a, 4, 4), &why)) << why;
  EXPECT_EQ(router.route({doc}).replica, "r2");
  // Now r2 counts as holding it too (routed there), and it is idle.
  EXPECT_EQ(router.route({doc}).matched[1], 30);
}

TEST(ReplicaRouter, EventBatchesApplyInOrderAndGapsAskForTheSummary) {
  ReplicaRouter router = two_replicas();
  KvEventLog log(4);
  sync_both(router, log);
  std::string why;
  const Lookup l = lookup(3, 12);
  log.stored(l.ns, l.tokens, 0);
  const std::string first = kv_events_json({"r1", "e1", 4}, log.take());
  ASSERT_EQ(router.apply_events(first, &why), EventOutcome::Applied) << why;
  EXPECT_EQ(router.route({l}).matched[0], 12);
  EXPECT_TRUE(router.needing_sync().empty());
  log.removed(l.ns, l.tokens, 0);
  (void)log.take();  // lost on the way
  ASSERT_EQ(router.apply_events(kv_events_json({"r1", "e1", 4}, log.take()), &why), EventOutcome::Resync)
      << why;
  ASSERT_EQ(router.needing_sync().size(), 1u);  // seq 3 after 1: read r1 again
  EXPECT_EQ(router.needing_sync()[0].name, "r1");
  EXPECT_EQ(router.route({l}).replica, "r2");  // r1 is not routed to meanwhile
  ASSERT_TRUE(router.apply_summary("r1", summary("r1", "e1", 3, log), &why)) << why;
  EXPECT_TRUE(router.needing_sync().empty());
  EXPECT_EQ(router.route({lookup(3, 12)}).matched[0], 0);  // the removal holds
  // A restart: a new epoch, whatever its numbers.
  KvEventLog restarted(4);
  ASSERT_EQ(router.apply_events(kv_events_json({"r1", "e9", 4}, restarted.take()), &why),
            EventOutcome::Resync)
      << why;
  EXPECT_EQ(router.needing_sync().size(), 1u);
}

TEST(ReplicaRouter, HostileMessagesAreRefusedByName) {
  ReplicaRouter router = two_replicas();
  const std::pair<std::string, std::string> bad[] = {
      {"not json", "not a JSON object"},
      {"[1,2]", "not a JSON object"},
      {R"({"replica":"r1","epoch":"e","seq":-1,"events":[],"block_size":4})", "needs replica, epoch, seq"},
      {R"({"replica":"r9","epoch":"e","seq":1,"events":[],"block_size":4})", "no replica"},
      {R"({"replica":"r1","epoch":"e","seq":1,"events":[],"block_size":8})", "another size"},
      {R"({"replica":"r1","epoch":"e","seq":1,"events":[{"type":"BlockEaten","block_hashes":[]}],"block_size":4})",
       "unknown event type"},
      {R"({"replica":"r1","epoch":"e","seq":1,"events":[{"type":"BlockStored","block_hashes":["xyz"]}],"block_size":4})",
       "16 hex digits"},
      {R"({"replica":"r1","epoch":"e","seq":1,"events":[{"type":"BlockStored","block_hashes":[12]}],"block_size":4})",
       "16 hex digits"},
      {R"({"replica":"r1","epoch":"e","seq":1,"events":[7],"block_size":4})", "not an object"},
      {R"({"replica":"r1","epoch":"e","seq":1,"events":[],"block_size":4,"waiting":1e15})", "whole numbers"},
      {R"({"replica":"r1","epoch":"e","seq":1,"events":[],"block_size":4,"running":1048577})",
       "whole numbers"},
      {R"({"replica":"r1","epoch":"e/../x","seq":1,"events":[],"block_size":4})", "out of bounds"},
      {R"({"replica":"r1","epoch":"e","seq":9007199254740993,"events":[],"block_size":4})", "out of bounds"},
  };
  for (const auto& [message, expected] : bad) {
    std::string why;
    EXPECT_EQ(router.apply_events(message, &why), EventOutcome::Refused) << message;
    EXPECT_NE(why.find(expected), std::string::npos) << why;
  }
  std::string why;
  EXPECT_FALSE(router.apply_summary(
      "r1", R"({"replica":"r2","epoch":"e","seq":0,"block_size":4,"block_hashes":[]})", &why));
  EXPECT_NE(why.find("calls itself"), std::string::npos) << why;
  EXPECT_FALSE(router.apply_summary("r1", R"({"replica":"r1"})", &why));
  EXPECT_TRUE(router.route({lookup(1, 4)}).replica.empty());  // nothing known: the proxy decides
  EXPECT_THROW(parse_replica("r1"), Error);
  EXPECT_THROW(parse_replica("r 1=http://x:1"), Error);
  EXPECT_THROW(parse_replica("r1=ftp://x:1"), Error);
  EXPECT_EQ(parse_replica("r-1=http://127.0.0.1:80/").url, "http://127.0.0.1:80");
  EXPECT_THROW(ReplicaRouter({{"a", "http://x:1"}, {"a", "http://x:2"}}, {}), Error);
}

// What one who can publish on the channel, or read it, may try: a batch
// with no seal or a wrong one, a true batch altered, a true batch played
// again later. None of it moves the router: not the keys, not the load, not
// whether the replica counts as alive.
TEST(ReplicaRouter, ForgedAndReplayedBatchesAreCountedAndChangeNothing) {
  const auto key = std::make_shared<const MacKey>(std::vector<uint8_t>(32, 7));
  const MacKey other(std::vector<uint8_t>(32, 8));
  RouterOptions o;
  o.stale_after = std::chrono::milliseconds(300);
  o.events_key = key;
  ReplicaRouter router = two_replicas(o);
  KvEventLog log(4, key);  // names blocks as the router does
  sync_both(router, log);
  std::string why;
  const Lookup l = lookup(3, 12);
  log.stored(l.ns, l.tokens, 0);
  const std::string batch1 = kv_events_json({"r1", "e1", 4}, log.take());
  // Not sealed, sealed under another key, altered after sealing.
  EXPECT_EQ(router.apply_events(batch1, &why), EventOutcome::Refused);
  EXPECT_NE(why.find("unsealed"), std::string::npos) << why;
  EXPECT_EQ(router.apply_events(seal_kv_events(&other, batch1), &why), EventOutcome::Refused);
  EXPECT_NE(why.find("does not match"), std::string::npos) << why;
  std::string altered = seal_kv_events(key.get(), batch1);
  altered.replace(altered.find("\"running\":0"), 11, "\"running\":9");
  EXPECT_EQ(router.apply_events(altered, &why), EventOutcome::Refused);
  EXPECT_EQ(router.apply_events(std::string(64, 'z') + batch1, &why), EventOutcome::Refused);
  EXPECT_EQ(router.route({l}).matched[0], 0) << "a refused batch's keys were taken";
  // The true one applies.
  const std::string sealed1 = seal_kv_events(key.get(), batch1);
  ASSERT_EQ(router.apply_events(sealed1, &why), EventOutcome::Applied) << why;
  EXPECT_EQ(router.route({l}).matched[0], 12);
  // Replayed once r1 has reported a heavy load and removed the keys: still
  // removed, the load still the later one.
  log.removed(l.ns, l.tokens, 0);
  KvEventHeader busy{"r1", "e1", 4, 50, 50};
  ASSERT_EQ(router.apply_events(seal_kv_events(key.get(), kv_events_json(busy, log.take())), &why),
            EventOutcome::Applied)
      << why;
  EXPECT_EQ(router.apply_events(sealed1, &why), EventOutcome::Stale);
  EXPECT_NE(why.find("replay"), std::string::npos) << why;
  EXPECT_EQ(router.route({lookup(3, 12)}).matched[0], 0) << "a replay brought removed keys back";
  EXPECT_EQ(router.route({lookup(5, 12, 900)}).replica, "r2") << "a replay took r1's load back to idle";
  // A dead replica is not kept alive by its own batches played again.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(router.apply_events(sealed1, &why), EventOutcome::Stale);
  const auto needing = router.needing_sync();
  EXPECT_TRUE(std::any_of(needing.begin(), needing.end(), [](const ReplicaAddress& r) {
    return r.name == "r1";
  })) << "r1 looks alive on a replay";
  const auto counts = router.event_counts();
  EXPECT_EQ(counts[static_cast<size_t>(EventOutcome::Refused)], 4);
  EXPECT_EQ(counts[static_cast<size_t>(EventOutcome::Stale)], 2);
  EXPECT_EQ(counts[static_cast<size_t>(EventOutcome::Applied)], 2);
  // A router without the key refuses sealed batches by name.
  ReplicaRouter unkeyed = two_replicas();
  EXPECT_EQ(unkeyed.apply_events(sealed1, &why), EventOutcome::Refused);
  EXPECT_NE(why.find("--cache-key-file"), std::string::npos) << why;
}

// A batch of a past epoch played again after a restart sends the router to
// the replica's summary, which says which epoch is current; meanwhile the
// replica stays routed to (replays cannot take it out of service).
TEST(ReplicaRouter, AnotherEpochAsksTheSummaryWithoutTakingTheReplicaOut) {
  ReplicaRouter router = two_replicas();
  KvEventLog log(4);
  std::string why;
  const Lookup l = lookup(3, 12);
  log.stored(l.ns, l.tokens, 0);
  ASSERT_TRUE(router.apply_summary("r1", summary("r1", "e2", 5, log), &why)) << why;
  ASSERT_TRUE(router.apply_summary("r2", summary("r2", "e2", 0, KvEventLog(4)), &why)) << why;
  KvEventLog old(4);
  EXPECT_EQ(router.apply_events(kv_events_json({"r1", "e1", 4}, old.take()), &why), EventOutcome::Resync);
  ASSERT_EQ(router.needing_sync().size(), 1u);
  EXPECT_EQ(router.route({l}).replica, "r1") << "a batch of another epoch took r1 out of routing";
  ASSERT_TRUE(router.apply_summary("r1", summary("r1", "e2", 5, log), &why)) << why;
  EXPECT_TRUE(router.needing_sync().empty());
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

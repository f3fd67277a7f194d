// The router's view of the replicas: event batches and summaries as the
// replicas write them (kv_events_json, and the summary's fields), hostile
// ones refused, gaps and restarts sending it back to the summary, and a
// request routed to the replica that holds its lookups unless its queue
// costs more than computing them elsewhere.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kv/kv_events.h"
#include "server/replica_router.h"
#include "util/error.h"

namespace depcache {
namespace {

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

ReplicaRouter two_replicas() {
  RouterOptions o;
  o.block_tokens = 4;
  o.load_tokens = 10;
  return ReplicaRouter({{"r1", "http://127.0.0.1:1"}, {"r2", "http://127.0.0.1:2"}}, o);
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
  std::string why;
  ASSERT_TRUE(router.apply_summary("r1", summary("r1", "e1", 0, log), &why)) << why;
  ASSERT_TRUE(router.apply_summary("r2", summary("r2", "e2", 0, log), &why)) << why;
  const Lookup l = lookup(3, 12);
  log.stored(l.ns, l.tokens, 0);
  const std::string first = kv_events_json({"r1", "e1", 4}, log.take());
  ASSERT_TRUE(router.apply_events(first, &why)) << why;
  EXPECT_EQ(router.route({l}).matched[0], 12);
  EXPECT_TRUE(router.needing_sync().empty());
  log.removed(l.ns, l.tokens, 0);
  (void)log.take();  // lost on the way
  ASSERT_TRUE(router.apply_events(kv_events_json({"r1", "e1", 4}, log.take()), &why)) << why;
  ASSERT_EQ(router.needing_sync().size(), 1u);  // seq 3 after 1: read r1 again
  EXPECT_EQ(router.needing_sync()[0].name, "r1");
  EXPECT_EQ(router.route({l}).replica, "r2");  // r1 is not routed to meanwhile
  ASSERT_TRUE(router.apply_summary("r1", summary("r1", "e1", 3, log), &why)) << why;
  EXPECT_TRUE(router.needing_sync().empty());
  EXPECT_EQ(router.route({lookup(3, 12)}).matched[0], 0);  // the removal holds
  // A restart: a new epoch, whatever its numbers.
  KvEventLog restarted(4);
  ASSERT_TRUE(router.apply_events(kv_events_json({"r1", "e9", 4}, restarted.take()), &why)) << why;
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
  };
  for (const auto& [message, expected] : bad) {
    std::string why;
    EXPECT_FALSE(router.apply_events(message, &why)) << message;
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

}  // namespace
}  // namespace depcache

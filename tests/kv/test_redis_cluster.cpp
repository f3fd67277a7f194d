// The remote tier over a real Redis Cluster (Debian's redis-server, started
// by the tests on loopback ports): slots as the servers compute them, keys
// spread over every master, redirects while a slot migrates, a master killed
// while requests keep coming, and what a hostile or misconfigured server
// gets. The slot map parser is also a fuzz target (fuzz/cluster_slots_fuzz.cpp).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <chrono>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kv/redis_cluster_store.h"
#include "kv/redis_connection.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::RedisServer;

RedisOptions cluster_options(std::string prefix = "depcache:") {
  RedisOptions o;
  o.prefix = std::move(prefix);
  o.timeout_ms = 200;
  o.retry_after_ms = 300;
  return o;
}

std::vector<uint8_t> record_of(uint64_t key, size_t size) {
  std::vector<uint8_t> v(size);
  std::mt19937_64 rng(key);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// `resp` read by hiredis's reader, guarded as every connection's is
// (*refused: the count of an array the guard refused, else 0).
struct ReadResp {
  int status;        // redisReaderGetReply's
  RedisReply reply;  // what it gave, null when none
};
ReadResp read_resp(const std::string& resp, int64_t* refused) {
  redisReader* r = redisReaderCreate();
  RespGuard guard;
  guard_resp_reader(r, &guard);
  redisReaderFeed(r, resp.data(), resp.size());
  void* out = nullptr;
  const int status = redisReaderGetReply(r, &out);
  redisReaderFree(r);
  *refused = guard.refused_array;
  return {status, RedisReply(static_cast<redisReply*>(out))};
}

// A RESP reply as hiredis reads it off the wire.
RedisReply reply_of(const std::string& resp) {
  int64_t refused = 0;
  ReadResp r = read_resp(resp, &refused);
  if (r.status != REDIS_OK || !r.reply) throw std::runtime_error("not a whole RESP reply");
  return std::move(r.reply);
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

TEST(RedisClusterSlots, TheSpecsExampleAndHashTags) {
  EXPECT_EQ(redis_cluster_slot("123456789"), 0x31C3);  // the specification's CRC16 check value
  // Only a non-empty {tag} is hashed, and only the first.
  EXPECT_EQ(redis_cluster_slot("{user1000}.following"), redis_cluster_slot("user1000"));
  EXPECT_EQ(redis_cluster_slot("foo{}{bar}"), redis_cluster_slot("foo{}{bar}"));
  EXPECT_NE(redis_cluster_slot("foo{}{bar}"), redis_cluster_slot("bar"));
  EXPECT_EQ(redis_cluster_slot("foo{{bar}}zap"), redis_cluster_slot("{bar"));
  EXPECT_EQ(redis_cluster_slot("foo{bar}{zap}"), redis_cluster_slot("bar"));
}

// The server is the independent computation: CLUSTER KEYSLOT for keys of
// every shape, tags and odd bytes included.
TEST(RedisClusterSlots, AgreeWithTheServersKeyslot) {
  const auto conf = test::temp_path("keyslot");
  // A bus port of its own: port + 10000 may be taken, and the node would
  // exit after taking its first connection.
  RedisServer node({"--cluster-enabled", "yes", "--cluster-config-file", conf.string(), "--cluster-port",
                    RedisServer::kFreePort});
  if (node.port() == 0) DEPCACHE_SKIP("redis-server not installed (scripts/setup.sh installs it)");
  RedisOptions o;
  RedisConnection conn("127.0.0.1", node.port(), o);
  ASSERT_TRUE(conn.open(steady_now_ms() + 2000)) << conn.error();
  std::mt19937 rng(7);
  const std::string alphabet = "ab{}:_\x01\xff 0123456789";
  for (int i = 0; i < 300; ++i) {
    std::string key = i < 100 ? redis_key("depcache:", rng() * 0x9e3779b97f4a7c15ull + i) : "";
    for (int n = static_cast<int>(rng() % 12); i >= 100 && n > 0; --n)
      key += alphabet[rng() % alphabet.size()];
    const RedisReply r = conn.command({"CLUSTER", "KEYSLOT", key}, steady_now_ms() + 2000);
    ASSERT_TRUE(r && r->type == REDIS_REPLY_INTEGER) << conn.error();
    EXPECT_EQ(redis_cluster_slot(key), r->integer) << "key of " << key.size() << " bytes";
  }
  node.stop();
  std::filesystem::remove(conf);
}
TEST(RedisClusterSlots, HostileMapsAreRefusedByName) {
  const RedisAddress asked{"10.0.0.1", 7000};
  std::string why;
  auto ok = parse_cluster_slots(*reply_of("*2\r\n*3\r\n:0\r\n:8191\r\n*2\r\n$0\r\n\r\n:7000\r\n"
                                          "*4\r\n:8192\r\n:16383\r\n*3\r\n$9\r\n127.0.0.2\r\n:7001\r\n$"
                                          "2\r\nid\r\n*2\r\n$1\r\nx\r\n:7002\r\n"),
                                asked, &why);
  ASSERT_TRUE(ok) << why;
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].master, asked);  // an empty host is the node asked
  EXPECT_EQ((*ok)[1].master, (RedisAddress{"127.0.0.2", 7001}));
  EXPECT_EQ((*ok)[1].last, 16383);
  const std::pair<const char*, const char*> bad[] = {
      {"+OK\r\n", "did not answer with a list"},
      {"*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\na\r\n:1\r\n", "covers slots 0..16384"},
      {"*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\na\r\n:1\r\n", "covers slots 5..4"},
      {"*2\r\n*3\r\n:0\r\n:10\r\n*2\r\n$1\r\na\r\n:1\r\n*3\r\n:10\r\n:11\r\n*2\r\n$1\r\nb\r\n:1\r\n",
       "gives slot 10 twice"},
      {"*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\na\r\n:0\r\n", "names no master"},
      {"*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\na\r\n:65536\r\n", "names no master"},
      {"*1\r\n*2\r\n:0\r\n:1\r\n", "is not [first, last"},
      {"*1\r\n*3\r\n$1\r\n0\r\n:1\r\n*2\r\n$1\r\na\r\n:1\r\n", "is not [first, last"},
  };
  for (const auto& [resp, expected] : bad) {
    why.clear();
    EXPECT_FALSE(parse_cluster_slots(*reply_of(resp), asked, &why)) << resp;
    EXPECT_NE(why.find(expected), std::string::npos) << why;
  }
}

// hiredis allocates an array's slots when it reads the count: every reader
// of ours refuses a count past the bound before that, and says what it saw.
TEST(RespReader, AnArrayCountPastTheBoundIsRefusedBeforeAnyAllocation) {
  const std::pair<std::string, int64_t> cases[] = {
      {"*2000000000\r\n", 2000000000},
      {fmt::format("*{}\r\n", kMaxRespArrayElements + 1), kMaxRespArrayElements + 1},
      {"*1\r\n*1\r\n*1500000000\r\n", 1500000000},  // nested
      {"*-7\r\n", 0},                               // hiredis itself refuses counts below -1 and past INT_MAX
      {"*4294967297\r\n", 0},
  };
  for (const auto& [resp, announced] : cases) {
    int64_t refused = 0;
    const ReadResp r = read_resp(resp, &refused);
    EXPECT_EQ(r.status, REDIS_ERR) << resp;
    EXPECT_EQ(r.reply, nullptr);
    EXPECT_EQ(refused, announced) << resp;
  }
  // At the bound, and the null array, are replies.
  EXPECT_EQ(reply_of("*-1\r\n")->type, REDIS_REPLY_NIL);
  EXPECT_EQ(reply_of("*0\r\n")->elements, 0u);
  EXPECT_EQ(reply_of("*2\r\n:1\r\n*1\r\n:2\r\n")->element[1]->element[0]->integer, 2);
}

// 300 keys go to the masters their slots name, every master gets some, and
// one fetch of all of them (a pipeline per node) returns every record.
TEST(RedisClusterStore, KeysSpreadOverEveryMasterAndComeBack) {
  DEPCACHE_REQUIRE_REDIS_CLUSTER(cluster, 3, 1);
  RedisClusterStore store(parse_redis_addresses(cluster.seeds()), cluster_options());
  std::vector<uint64_t> keys;
  std::map<std::string, int> per_master;
  for (uint64_t i = 0; i < 300; ++i) {
    keys.push_back(i * 0x9e3779b97f4a7c15ull);
    store.put(keys.back(), record_of(keys.back(), 64 + i));
    const auto owner = store.owner(keys.back());
    ASSERT_TRUE(owner);
    ++per_master[owner->host + ":" + std::to_string(owner->port)];
  }
  EXPECT_EQ(per_master.size(), 3u);
  for (const auto& [address, n] : per_master) {
    const int port = std::stoi(address.substr(address.rfind(':') + 1));
    EXPECT_EQ(trim(cluster.cli(port, "dbsize")), std::to_string(n)) << address;  // where the map says
  }
  const auto got = store.get_many(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i]) << i;
    EXPECT_EQ(*got[i], record_of(keys[i], 64 + i)) << i;
  }
  EXPECT_FALSE(store.get(12345));
  store.remove(keys[0]);
  EXPECT_FALSE(store.get(keys[0]));
  const auto s = store.stats();
  EXPECT_EQ(s.failures, 0) << store.last_error();
  EXPECT_EQ(s.moved + s.asked + s.unserved, 0);
}

// A slot moved between masters while the store works: keys still on the
// source are read there, keys already on the target through ASK, new keys
// are written to the target, and once the slot is the target's, MOVED
// sends the store there, which then asks the target directly.
TEST(RedisClusterStore, FollowsAskAndMovedWhileASlotMigrates) {
  DEPCACHE_REQUIRE_REDIS_CLUSTER(cluster, 3, 0);
  // One hash tag: every key of this store is in one slot.
  RedisClusterStore store(parse_redis_addresses(cluster.seeds()), cluster_options("t{m}:"));
  const int slot = redis_cluster_slot("m");
  const auto source = store.owner(1);
  ASSERT_TRUE(source);
  int target_port = 0;
  for (const int p : cluster.masters())
    if (p != source->port) target_port = p;
  const std::string source_id = trim(cluster.cli(source->port, "cluster myid"));
  const std::string target_id = trim(cluster.cli(target_port, "cluster myid"));
  store.put(1, record_of(1, 100));
  store.put(2, record_of(2, 100));
  const std::string s = std::to_string(slot);
  ASSERT_EQ(trim(cluster.cli(target_port, "cluster setslot " + s + " importing " + source_id)), "OK");
  ASSERT_EQ(trim(cluster.cli(source->port, "cluster setslot " + s + " migrating " + target_id)), "OK");
  // Key 2 moves now; key 1 stays on the source for the moment.
  ASSERT_EQ(trim(cluster.cli(source->port, "migrate 127.0.0.1 " + std::to_string(target_port) +
                                               " t{m}:" + redis_key("", 2) + " 0 5000")),
            "OK");
  EXPECT_EQ(store.get(1), record_of(1, 100));
  EXPECT_EQ(store.get(2), record_of(2, 100));  // ASK: the target, after ASKING
  store.put(3, record_of(3, 50));              // a new key goes to the target
  EXPECT_EQ(trim(cluster.cli(target_port, "dbsize")), "2");
  EXPECT_GE(store.stats().asked, 2);
  EXPECT_EQ(store.stats().moved, 0);
  ASSERT_EQ(trim(cluster.cli(source->port, "migrate 127.0.0.1 " + std::to_string(target_port) +
                                               " t{m}:" + redis_key("", 1) + " 0 5000")),
            "OK");
  for (const int p : cluster.masters())
    ASSERT_EQ(trim(cluster.cli(p, "cluster setslot " + s + " node " + target_id)), "OK") << p;
  const auto got = store.get_many(std::vector<uint64_t>{1, 2, 3});
  EXPECT_EQ(got[0], record_of(1, 100));
  EXPECT_EQ(got[1], record_of(2, 100));
  EXPECT_EQ(got[2], record_of(3, 50));
  EXPECT_GE(store.stats().moved, 1);
  EXPECT_EQ(store.owner(1)->port, target_port);  // the map followed
  const int64_t moved = store.stats().moved;
  EXPECT_EQ(store.get(1), record_of(1, 100));
  EXPECT_EQ(store.stats().moved, moved);  // asked directly now
  EXPECT_EQ(store.stats().failures, 0) << store.last_error();
}

// A master killed while requests keep coming: each fetch ends within its
// deadline, the other masters' keys are still served, nothing served is
// wrong, and once the cluster has promoted the dead master's replica the
// store finds it and every key is served again.
TEST(RedisClusterStore, AMasterKilledUnderLoadFailsOverAndNothingWrongIsServed) {
  DEPCACHE_REQUIRE_REDIS_CLUSTER(cluster, 3, 1);
  RedisClusterStore store(parse_redis_addresses(cluster.seeds()), cluster_options());
  std::vector<uint64_t> keys;
  for (uint64_t i = 0; i < 240; ++i) {
    keys.push_back(i * 0x2545f4914f6cdd1dull + 1);
    store.put(keys.back(), record_of(keys.back(), 200));
  }
  // Replication is asynchronous: wait until every replica holds its master's keys.
  const auto replicated = [&] {
    int n = 0;
    for (const int p : cluster.ports())
      if (cluster.cli(p, "role").rfind("slave", 0) == 0) n += std::stoi(cluster.cli(p, "dbsize"));
    return n;
  };
  for (int i = 0; i < 100 && replicated() < 240; ++i) std::this_thread::sleep_for(50ms);
  ASSERT_EQ(replicated(), 240);
  const int victim = store.owner(keys[0])->port;
  cluster.kill(victim);
  const auto killed = Clock::now();
  int min_served = 240, max_served = 0;
  double slowest_ms = 0;
  std::chrono::milliseconds recovered{-1};
  for (int i = 0; Clock::now() - killed < 20s; ++i) {
    const auto t0 = Clock::now();
    const auto got = store.get_many(keys);
    slowest_ms = std::max(slowest_ms, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    int served = 0;
    for (size_t k = 0; k < keys.size(); ++k)
      if (got[k]) {
        ASSERT_EQ(*got[k], record_of(keys[k], 200)) << "key " << k << " after " << i << " fetches";
        ++served;
      }
    store.put(1000000 + i, record_of(i, 10));  // writes go on too (lost or landed, never an error)
    min_served = std::min(min_served, served);
    max_served = std::max(max_served, served);
    if (served == 240 && i > 0) {
      recovered = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  std::printf(
      "[cluster] fetches of 240 keys: served %d..%d during the outage, slowest %.0f ms, all back "
      "after %lld ms\n",
      min_served, max_served, slowest_ms, static_cast<long long>(recovered.count()));
  EXPECT_GT(min_served, 0);              // the other masters' keys were served throughout
  EXPECT_LT(min_served, 240);            // the victim's were not, for a while
  EXPECT_LT(slowest_ms, 2 * 200 + 100);  // a node connect and a fetch, each within the deadline
  EXPECT_GE(recovered.count(), 0) << "the store never saw the failover";
  EXPECT_GE(store.stats().failures, 1);
  EXPECT_GE(store.stats().refreshes, 2);
  EXPECT_NE(store.owner(keys[0])->port, victim);
}

// A seed that is a plain Redis, one that wants a password, and one that is
// not there: the first two are configuration errors said by name at
// construction; the last is a warning, and every call a miss.
TEST(RedisClusterStore, MisconfiguredAndUnreachableSeeds) {
  DEPCACHE_REQUIRE_REDIS(plain);
  try {
    RedisClusterStore store({{"127.0.0.1", plain.port()}}, cluster_options());
    ADD_FAILURE() << "a plain Redis was taken for a cluster";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("is not a cluster node"), std::string::npos) << e.what();
  }
  RedisServer locked({"--requirepass", "sesame"});
  try {
    RedisClusterStore store({{"127.0.0.1", locked.port()}}, cluster_options());
    ADD_FAILURE() << "a server that wants a password was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refuses commands: NOAUTH"), std::string::npos) << e.what();
  }
  RedisOptions wrong = cluster_options();
  wrong.password = "wrong";
  EXPECT_THROW(RedisClusterStore({{"127.0.0.1", locked.port()}}, wrong), Error);
  const int nobody = test::free_port();
  RedisClusterStore store({{"127.0.0.1", nobody}}, cluster_options());
  const auto t0 = Clock::now();
  EXPECT_FALSE(store.get(1));
  store.put(1, record_of(1, 10));
  EXPECT_FALSE(store.get_many(std::vector<uint64_t>{1, 2})[0]);
  EXPECT_LT(Clock::now() - t0, 500ms);
  EXPECT_GE(store.stats().unserved, 3);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

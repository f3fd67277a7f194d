// KV events: the keys a replica announces are the content keys computed at
// once (span_content_key), the live set kept from the index's insertions and
// evictions equals the one read from the index afresh, and a summary plus
// the batches after it rebuild that set on the other side.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "kv/kv_events.h"
#include "kv/radix_index.h"
#include "kv/span_record.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using Tokens = std::vector<int32_t>;

std::set<uint64_t> as_set(const std::vector<uint64_t>& v) { return {v.begin(), v.end()}; }

TEST(KvEvents, ChainKeysAreTheContentKeysAtBlockEndsAndTheEnd) {
  Tokens t(45);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i * 7 + 1);
  const uint64_t ns = 0xabcdef;
  const auto keys = chain_keys(ns, t, 0, 16);
  ASSERT_EQ(keys.size(), 3u);  // 16, 32, 45
  EXPECT_EQ(keys[0], span_content_key(ns, std::span(t).first(16)));
  EXPECT_EQ(keys[1], span_content_key(ns, std::span(t).first(32)));
  EXPECT_EQ(keys[2], span_content_key(ns, t));
  // From inside a block: the blocks that end after it, and the end.
  EXPECT_EQ(chain_keys(ns, t, 20, 16), std::vector<uint64_t>(keys.begin() + 1, keys.end()));
  EXPECT_EQ(chain_keys(ns, t, 32, 16), std::vector<uint64_t>{keys[2]});
  EXPECT_TRUE(chain_keys(ns, t, 45, 16).empty());
  // A sequence that ends on a block boundary has that key once.
  EXPECT_EQ(chain_keys(ns, std::span(t).first(32), 0, 16),
            std::vector<uint64_t>(keys.begin(), keys.begin() + 2));
  EXPECT_NE(chain_keys(ns + 1, t, 0, 16)[0], keys[0]);  // the namespace is in every key
}

// Random inserts (shared prefixes, splits, several namespaces) into an index
// whose budget keeps evicting: the log kept along the way holds the keys a
// log attached at the end reads from the index, and a key set rebuilt from
// an early summary plus every batch after it holds them too.
TEST(KvEvents, TheLiveSetFollowsInsertionsAndEvictions) {
  RadixIndex index(/*byte_budget=*/40 * 64);  // 64 bytes a token: about 40 tokens fit
  auto log = std::make_shared<KvEventLog>(8);
  index.set_observer(log);
  std::mt19937 rng(3);
  std::set<uint64_t> rebuilt;
  int64_t applied = 0;
  const auto apply = [&](const KvEventBatch& b) {
    ASSERT_EQ(b.seq, applied + 1);
    applied = b.seq;
    for (const KvEvent& e : b.events)
      for (const uint64_t k : e.keys) {
        if (e.type == KvEvent::Type::Stored)
          rebuilt.insert(k);
        else
          rebuilt.erase(k);
      }
  };
  int64_t removed_events = 0;
  for (int i = 0; i < 300; ++i) {
    const uint64_t ns = rng() % 3;
    Tokens t(1 + rng() % 30);
    const int shared = static_cast<int>(rng() % 4);  // a few common first tokens: shared prefixes, splits
    for (size_t j = 0; j < t.size(); ++j)
      t[j] = static_cast<int32_t>(j < static_cast<size_t>(shared) ? j : rng() % 50);
    index.insert_virtual(ns, t, 64, 1.0);
    if (i == 100) {  // a late subscriber: the summary, then the batches after it
      const KvEventBatch b = log->take();
      for (const KvEvent& e : b.events) removed_events += e.type == KvEvent::Type::Removed;
      const KvEventLog::Summary s = log->summary();
      rebuilt = as_set(s.keys);
      applied = s.seq;
    } else if (i % 7 == 0) {
      const KvEventBatch b = log->take();
      for (const KvEvent& e : b.events) removed_events += e.type == KvEvent::Type::Removed;
      if (i > 100) apply(b);
    }
  }
  const KvEventBatch last = log->take();
  apply(last);
  EXPECT_GT(removed_events, 10);  // the budget evicted, and said so
  auto fresh = std::make_shared<KvEventLog>(8);
  index.set_observer(fresh);
  const auto expected = as_set(fresh->summary().keys);
  EXPECT_GT(expected.size(), 5u);
  EXPECT_EQ(as_set(log->summary().keys), expected);
  EXPECT_EQ(rebuilt, expected);
  index.evict_to(0);
  EXPECT_EQ(fresh->n_keys(), 0u);  // everything left, and each key was said to go
}

TEST(KvEvents, BatchesAsJson) {
  KvEventLog log(4);
  const Tokens t{1, 2, 3, 4, 5, 6};
  log.stored(9, t, 4);
  log.removed(9, t, 4);
  const std::string json = kv_events_json({"r1", "e1", 4, 1, 2}, log.take());
  for (const char* part : {R"("type":"BlockStored")", R"("type":"BlockRemoved")", R"("replica":"r1")",
                           R"("seq":1)", R"("block_size":4)", R"("parent_block_hash":")"})
    EXPECT_NE(json.find(part), std::string::npos) << part << " in " << json;
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

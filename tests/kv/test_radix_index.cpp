// The radix index: match, insert with node splits, pins, leaf-only LRU
// eviction under a byte budget, and random operation sequences checked
// against a reference map of what should be cached.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <random>
#include <unordered_map>

#include "kv/radix_index.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using Tokens = std::vector<int32_t>;

// A span whose K bytes of token i hold the sequence offset i, so tests can
// see which tokens a piece refers to.
RadixIndex::SpanMaker offsets_maker() {
  return [](int64_t begin, int64_t end) {
    KvSpan s(1, 1, DType::F32, end - begin);
    for (int64_t i = begin; i < end; ++i) {
      const float v = static_cast<float>(i);
      std::memcpy(s.k(0) + (i - begin) * 4, &v, 4);
      s.positions()[i - begin] = static_cast<int32_t>(i);
    }
    return s;
  };
}

float offset_at(const RadixIndex& index, const RadixIndex::Piece& p, int64_t i) {
  float v;
  std::memcpy(&v, index.span(p.node).k(0) + (p.offset + i) * 4, 4);
  return v;
}

TEST(RadixIndex, MatchInsertAndSplit) {
  RadixIndex index(1 << 20);
  EXPECT_EQ(index.match(1, Tokens{1, 2, 3}).length, 0);
  EXPECT_EQ(index.insert(1, Tokens{1, 2, 3, 4}, offsets_maker()), 4);
  EXPECT_EQ(index.match(1, Tokens{1, 2, 3, 4, 5}).length, 4);
  EXPECT_EQ(index.match(2, Tokens{1, 2, 3, 4}).length, 0);  // other namespace
  // Diverging at 2 splits the node into [1 2] and [3 4].
  EXPECT_EQ(index.insert(1, Tokens{1, 2, 9}, offsets_maker()), 1);
  index.check_invariants();
  const RadixIndex::Match m = index.match(1, Tokens{1, 2, 9, 7});
  EXPECT_EQ(m.length, 3);
  ASSERT_EQ(m.pieces.size(), 2u);
  EXPECT_EQ(m.pieces[0].length, 2);
  EXPECT_EQ(m.pieces[1].length, 1);
  // Spans follow the tokens: [1 2] came from the first insert (offsets 0, 1),
  // [9] from the second (offset 2).
  EXPECT_EQ(offset_at(index, m.pieces[0], 1), 1.0f);
  EXPECT_EQ(offset_at(index, m.pieces[1], 0), 2.0f);
  const RadixIndex::Match partial = index.match(1, Tokens{1, 2, 3, 8});
  EXPECT_EQ(partial.length, 3);
  EXPECT_EQ(partial.pieces.back().length, 1);  // a prefix of [3 4]
  // Inserting what is there adds nothing.
  EXPECT_EQ(index.insert(1, Tokens{1, 2}, offsets_maker()), 0);
  EXPECT_EQ(index.n_nodes(), 4u);  // root, [1 2], [3 4], [9]
  index.check_invariants();
}

TEST(RadixIndex, EvictsLeastRecentlyUsedLeavesOnly) {
  const size_t span_bytes = KvSpan(1, 1, DType::F32, 2).bytes();  // a 2-token span
  RadixIndex index(3 * span_bytes);
  index.insert(1, Tokens{1, 2}, offsets_maker());
  index.insert(1, Tokens{1, 2, 3, 4}, offsets_maker());  // child of [1 2]
  index.insert(1, Tokens{5, 6}, offsets_maker());
  EXPECT_EQ(index.bytes(), 3 * span_bytes);
  index.match(1, Tokens{5, 6});                    // [5 6] is now the most recent
  index.insert(1, Tokens{7, 8}, offsets_maker());  // over budget by one span
  index.check_invariants();
  EXPECT_LE(index.bytes(), index.budget());
  // [1 2] is older but not a leaf; its leaf [3 4] goes first.
  EXPECT_EQ(index.match(1, Tokens{1, 2, 3, 4}).length, 2);
  EXPECT_EQ(index.match(1, Tokens{5, 6}).length, 2);
  EXPECT_EQ(index.match(1, Tokens{7, 8}).length, 2);
}

TEST(RadixIndex, PinnedNodesAreNotEvicted) {
  const size_t span_bytes = KvSpan(1, 1, DType::F32, 2).bytes();
  RadixIndex index(2 * span_bytes);
  index.insert(1, Tokens{1, 2}, offsets_maker());
  index.insert(1, Tokens{3, 4}, offsets_maker());
  const RadixIndex::Match pinned = index.match(1, Tokens{1, 2});
  index.pin(pinned);
  index.match(1, Tokens{3, 4});
  index.insert(1, Tokens{5, 6}, offsets_maker());
  // [1 2] is the LRU leaf but pinned: [3 4] goes instead.
  EXPECT_EQ(index.match(1, Tokens{1, 2}).length, 2);
  EXPECT_EQ(index.match(1, Tokens{3, 4}).length, 0);
  index.unpin(pinned);
  EXPECT_THROW(index.unpin(pinned), Error);
  index.insert(1, Tokens{7, 8}, offsets_maker());
  EXPECT_LE(index.bytes(), index.budget());
  index.check_invariants();
}

// A pinned node split by a later insert stays pinned (as the tail); after
// unpinning, the index is back within its budget.
TEST(RadixIndex, PinsSurviveSplitsAndUnpinRestoresTheBudget) {
  const size_t token_bytes = KvSpan(1, 1, DType::F32, 1).bytes();
  RadixIndex index(6 * token_bytes);
  index.insert(1, Tokens{1, 2, 3, 4}, offsets_maker());
  const RadixIndex::Match m = index.match(1, Tokens{1, 2, 3, 4});
  index.pin(m);
  index.insert(1, Tokens{1, 2, 9}, offsets_maker());     // splits [1 2 3 4]
  index.insert(1, Tokens{7, 7, 7, 7}, offsets_maker());  // over budget; only unpinned leaves may go
  index.check_invariants();
  EXPECT_GT(index.bytes(), index.budget());  // the pinned path and the new leaf hold the excess
  EXPECT_EQ(index.match(1, Tokens{1, 2, 3, 4}).length, 4);
  index.unpin(m);
  EXPECT_LE(index.bytes(), index.budget());
  index.check_invariants();
}

TEST(RadixIndex, SpanLargerThanTheBudgetIsNotStored) {
  RadixIndex index(KvSpan(1, 1, DType::F32, 2).bytes());
  index.insert(1, Tokens{1, 2, 3, 4, 5}, offsets_maker());
  EXPECT_EQ(index.bytes(), 0u);
  EXPECT_EQ(index.match(1, Tokens{1, 2}).length, 0);
  EXPECT_EQ(index.stats().oversized[static_cast<int>(Tier::Hot)], 1) << "the skip is counted, not silent";
  index.insert(1, Tokens{1, 2}, offsets_maker());
  EXPECT_EQ(index.stats().oversized[static_cast<int>(Tier::Hot)], 1);
}

// A remote tier in memory, shared by the indexes of a test as by processes.
class MemoryRemote final : public RemoteStore {
 public:
  std::optional<std::vector<uint8_t>> get(uint64_t key) override {
    const std::lock_guard lk(mu_);
    const auto it = records_.find(key);
    if (it == records_.end()) return std::nullopt;
    return it->second;
  }
  void put(uint64_t key, std::span<const uint8_t> record) override {
    const std::lock_guard lk(mu_);
    records_[key].assign(record.begin(), record.end());
  }
  void remove(uint64_t key) override {
    const std::lock_guard lk(mu_);
    records_.erase(key);
  }

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, std::vector<uint8_t>> records_;
};

// A match under the caller's lock reads the remote tier in place and keeps
// its pieces as found (nothing can have moved). A remote block that is too
// large for the hot tier is refused, and must be refused before the insert
// that adopts it touches the tree: splitting the matched node first would
// leave the match naming the split's tail, another sequence's K.
TEST(RadixIndex, ARefusedOversizedInsertLeavesTheTreeAsItWas) {
  const size_t token_bytes = offsets_maker()(0, 1).bytes();
  Tokens x(16), y(64);
  for (int64_t i = 0; i < 64; ++i) y[i] = static_cast<int32_t>(i < 8 ? i : 100 + i);
  for (int64_t i = 0; i < 16; ++i)
    x[i] = static_cast<int32_t>(i < 8 ? i : 200 + i);  // y's first 8, then its own
  MemoryRemote remote;
  RadixIndex publisher(1 << 20);
  publisher.attach_remote(remote, 64);
  publisher.insert(1, y, offsets_maker());  // one block: y[0, 64)
  publisher.flush_remote();

  RadixIndex index(32 * token_bytes);  // x fits; y's 56 own tokens never do
  index.attach_remote(remote, 64);
  EXPECT_EQ(index.insert(1, x, offsets_maker()), 16);
  {
    const auto lk = index.lock();
    const RadixIndex::Match m = index.match(1, y);
    EXPECT_EQ(m.length, 8);
    int64_t at = 0;
    for (const RadixIndex::Piece& p : m.pieces) {
      ASSERT_GE(index.span(p.node).n_tokens(), p.offset + p.length) << "a piece beyond its node's span";
      for (int64_t i = 0; i < p.length; ++i, ++at)
        ASSERT_EQ(offset_at(index, p, i), static_cast<float>(at)) << "K of another sequence's rows";
    }
    EXPECT_EQ(at, m.length);
  }
  EXPECT_EQ(index.stats().oversized[static_cast<int>(Tier::Hot)], 1);
  EXPECT_EQ(index.n_nodes(), 2u) << "root and x's node: no split left behind";
  // The same refusal through a direct insert.
  EXPECT_EQ(index.insert(1, y, offsets_maker()), 0);
  EXPECT_EQ(index.stats().oversized[static_cast<int>(Tier::Hot)], 2);
  EXPECT_EQ(index.n_nodes(), 2u);
  const RadixIndex::Match whole_x = index.match(1, x);
  ASSERT_EQ(whole_x.pieces.size(), 1u);
  EXPECT_EQ(whole_x.length, 16);
  index.check_invariants();
}

// Random inserts, matches and pins over a small alphabet (lots of sharing
// and splitting): invariants hold, the budget holds, and whatever matches
// carries the right span content.
TEST(RadixIndex, RandomOperationsKeepInvariants) {
  std::mt19937 rng(3);
  const size_t token_bytes = KvSpan(1, 1, DType::F32, 1).bytes();
  RadixIndex index(60 * token_bytes);
  std::vector<RadixIndex::Match> pins;
  for (int step = 0; step < 3000; ++step) {
    Tokens seq(1 + rng() % 10);
    for (auto& t : seq) t = static_cast<int32_t>(rng() % 3);
    const uint64_t ns = rng() % 2;
    switch (rng() % 4) {
      case 0:
      case 1:
        index.insert(ns, seq, offsets_maker());
        break;
      case 2: {
        const RadixIndex::Match m = index.match(ns, seq);
        int64_t at = 0;
        for (const auto& p : m.pieces)
          for (int64_t i = 0; i < p.length; ++i, ++at)
            ASSERT_EQ(offset_at(index, p, i), static_cast<float>(at));
        ASSERT_EQ(at, m.length);
        if (rng() % 3 == 0) {
          index.pin(m);
          pins.push_back(m);
        }
        break;
      }
      default:
        if (!pins.empty()) {
          index.unpin(pins.back());
          pins.pop_back();
        }
    }
    if (pins.empty()) {
      ASSERT_LE(index.bytes(), index.budget()) << "step " << step;
    }
    if (step % 100 == 0) index.check_invariants();
  }
  for (const auto& m : pins) index.unpin(m);
  index.evict_to(0);
  EXPECT_EQ(index.bytes(), 0u);
  index.check_invariants();
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// The disk tier's span files: round trip across a restart, and every way a
// file can go bad — corrupt, truncated, foreign, other tokens, interrupted
// writes, a writer killed mid-stream — detected and dropped, never served.
// Then the layer-wise loader reading a file on a thread of its own.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kv/disk_store.h"
#include "kv/layer_loader.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

KvSpan make_span(int64_t n, uint32_t seed, DType type = DType::F16) {
  KvSpan s(3, 8, type, n);
  const auto r = test::randn(s.data().size(), seed);
  for (size_t i = 0; i < s.data().size(); ++i)
    s.data()[i] = static_cast<uint8_t>(static_cast<int>(r[i] * 50) & 0xff);
  for (int64_t i = 0; i < n; ++i) s.positions()[i] = static_cast<int32_t>(100 + i);
  return s;
}

std::vector<int32_t> tokens_of(int64_t n, int salt) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(i * 7 + salt);
  return t;
}

class DiskStore : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::temp_path("disk-store"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path file_of(uint64_t key) const {
    char name[32];
    std::snprintf(name, sizeof name, "%016llx.kvspan", static_cast<unsigned long long>(key));
    return dir_ / name;
  }
  std::filesystem::path dir_;
};

TEST_F(DiskStore, RoundTripSurvivesARestart) {
  const KvSpan a = make_span(5, 1), b = make_span(3, 2, DType::F32);
  {
    DiskSpanStore store(dir_, 1 << 20);
    ASSERT_TRUE(store.put(11, tokens_of(5, 1), a));
    ASSERT_TRUE(store.put(22, tokens_of(3, 2), b));
    EXPECT_EQ(store.n_files(), 2u);
  }
  DiskSpanStore store(dir_, 1 << 20);  // a new process, the same directory
  EXPECT_EQ(store.n_files(), 2u);
  const auto got = store.get(11, tokens_of(5, 1));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->data(), a.data());
  EXPECT_EQ(got->positions(), a.positions());
  EXPECT_EQ(got->type(), DType::F16);
  const auto got_b = store.get(22, tokens_of(3, 2));
  ASSERT_TRUE(got_b.has_value());
  EXPECT_EQ(got_b->data(), b.data());
  EXPECT_FALSE(store.get(33, tokens_of(3, 2)).has_value());
}

TEST_F(DiskStore, BadFilesAreDroppedNeverServed) {
  DiskSpanStore store(dir_, 1 << 20);
  for (uint64_t key = 1; key <= 5; ++key) ASSERT_TRUE(store.put(key, tokens_of(4, key), make_span(4, key)));
  // 1: a flipped byte in the K/V data.
  {
    std::fstream f(file_of(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x5a');
  }
  // 2: truncated.
  std::filesystem::resize_file(file_of(2), std::filesystem::file_size(file_of(2)) - 10);
  // 3: foreign content under a span file's name.
  std::ofstream(file_of(3), std::ios::trunc) << "not a span at all";
  // 4: the file of key 5 copied over key 4 (sound file, wrong key).
  std::filesystem::copy_file(file_of(5), file_of(4), std::filesystem::copy_options::overwrite_existing);
  for (uint64_t key = 1; key <= 4; ++key) EXPECT_FALSE(store.get(key, tokens_of(4, key)).has_value()) << key;
  EXPECT_EQ(store.n_dropped(), 4);
  for (uint64_t key = 1; key <= 4; ++key) EXPECT_FALSE(std::filesystem::exists(file_of(key))) << key;
  // 5: sound, but asked for other tokens (a key collision): a miss, kept.
  EXPECT_FALSE(store.get(5, tokens_of(4, 99)).has_value());
  EXPECT_TRUE(store.get(5, tokens_of(4, 5)).has_value());
}

// A file read one layer at a time: the head is checked when it is opened,
// each layer on its own when it is read, in any order; a bad layer fails
// alone (the others still check), and the reader reads on after the store
// has deleted the file.
TEST_F(DiskStore, LayersAreReadAndCheckedOneByOne) {
  const KvSpan span = make_span(6, 4);
  DiskSpanStore store(dir_, 1 << 20);
  for (uint64_t key = 1; key <= 3; ++key) ASSERT_TRUE(store.put(key, tokens_of(6, 4), span));
  std::vector<uint8_t> head(kSpanRecordHeader);
  std::ifstream(file_of(1), std::ios::binary).read(reinterpret_cast<char*>(head.data()), head.size());
  const std::optional<SpanRecordHeader> h = decode_span_record_header(head);
  ASSERT_TRUE(h.has_value());
  ASSERT_EQ(h->n_layer, 3);
  const auto flip = [&](uint64_t key, size_t at) {
    std::fstream f(file_of(key), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    const char c = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x10));
  };

  std::optional<DiskSpanStore::LayerReader> reader = store.open_layers(1, 0, tokens_of(6, 4), 0);
  ASSERT_TRUE(reader.has_value());
  EXPECT_EQ(reader->span().positions(), span.positions());
  store.remove(1);  // the open file reads on
  for (const int il : {2, 0, 1}) EXPECT_TRUE(reader->read_layer(il)) << il;
  EXPECT_EQ(reader->span().data(), span.data());
  EXPECT_FALSE(reader->read_layer(3));

  flip(2, h->head_bytes() + h->layer_bytes() + 5);  // layer 1 of key 2
  reader = store.open_layers(2, 0, tokens_of(6, 4), 0);
  ASSERT_TRUE(reader.has_value()) << "the head is intact";
  EXPECT_TRUE(reader->read_layer(0));
  EXPECT_FALSE(reader->read_layer(1));
  EXPECT_TRUE(reader->read_layer(2));
  EXPECT_FALSE(store.get(2, tokens_of(6, 4)).has_value()) << "a whole read checks every layer";
  EXPECT_FALSE(std::filesystem::exists(file_of(2)));

  flip(3, kSpanRecordHeader + 4 * 6 + 2);  // a position, in the head
  EXPECT_FALSE(store.open_layers(3, 0, tokens_of(6, 4), 0).has_value());
  EXPECT_FALSE(std::filesystem::exists(file_of(3)));
  EXPECT_EQ(store.n_dropped(), 2);
}

TEST_F(DiskStore, RecordsCarryNamespaceAndContext) {
  const std::vector<int32_t> path = tokens_of(9, 3);  // 6 context tokens, then the span's 3
  const KvSpan span = make_span(3, 7);
  {
    DiskSpanStore store(dir_, 1 << 20);
    ASSERT_TRUE(store.put(5, 77, path, 6, span));
    std::ofstream(dir_ / "00000000000000aa.kvspan", std::ios::trunc) << "short";  // unreadable header
  }
  DiskSpanStore store(dir_, 1 << 20);
  const auto found = store.scan();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].key, 5u);
  EXPECT_EQ(found[0].ns, 77u);
  EXPECT_EQ(found[0].prefix, 6);
  EXPECT_EQ(found[0].tokens, path);
  EXPECT_EQ(store.n_dropped(), 1);
  EXPECT_FALSE(store.get(5, 78, path, 6).has_value());  // other namespace
  EXPECT_FALSE(store.get(5, 77, path, 5).has_value());  // other split of context and span
  const auto got = store.get(5, 77, path, 6);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->data(), span.data());
  EXPECT_EQ(got->positions(), span.positions());
}

TEST_F(DiskStore, BudgetAndOrphans) {
  const size_t one = span_record_bytes(4, make_span(4, 1), false);
  DiskSpanStore store(dir_, 3 * one);
  for (uint64_t key = 1; key <= 3; ++key) ASSERT_TRUE(store.put(key, tokens_of(4, key), make_span(4, key)));
  ASSERT_TRUE(store.get(1, tokens_of(4, 1)).has_value());       // 1 is now the most recent
  ASSERT_TRUE(store.put(4, tokens_of(4, 4), make_span(4, 4)));  // evicts 2, the least recent
  EXPECT_LE(store.bytes(), store.budget());
  EXPECT_TRUE(store.contains(1));
  EXPECT_FALSE(store.contains(2));
  EXPECT_FALSE(std::filesystem::exists(file_of(2)));
  EXPECT_FALSE(store.put(9, tokens_of(40, 9), make_span(40, 9)));  // alone over the budget
  EXPECT_EQ(store.remove_orphans({1, 4}), 1u);                     // 3 is unknown to the index
  EXPECT_EQ(store.n_files(), 2u);
  // A smaller budget at the next start trims the oldest files.
  DiskSpanStore smaller(dir_, one);
  EXPECT_EQ(smaller.n_files(), 1u);
}

// A writer killed with SIGKILL in the middle of a stream of writes leaves at
// most a partial file, which the next start removes; whatever is found reads
// back intact or not at all.
TEST_F(DiskStore, KillDuringWritesLeavesNothingCorruptServed) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    DiskSpanStore store(dir_, 1 << 30);
    for (uint64_t key = 1;; ++key) store.put(key, tokens_of(64, static_cast<int>(key)), make_span(64, key));
  }
  // Let a few writes land (however slow the disk), then kill mid-stream.
  const auto spans_on_disk = [&] {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec))
      n += e.path().extension() == ".kvspan";
    return n;
  };
  for (int i = 0; i < 1000 && spans_on_disk() < 3; ++i) usleep(10 * 1000);
  usleep(20 * 1000);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  DiskSpanStore store(dir_, 1 << 30);
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    EXPECT_FALSE(e.path().string().ends_with(".partial")) << e.path();
  ASSERT_GT(store.n_files(), 0u);
  size_t good = 0;
  for (uint64_t key = 1; key <= store.n_files() + 1; ++key) {
    const auto got = store.get(key, tokens_of(64, static_cast<int>(key)));
    if (got) {
      EXPECT_EQ(got->data(), make_span(64, key).data()) << key;
      ++good;
    }
  }
  EXPECT_GT(good, 0u);
  EXPECT_EQ(store.n_dropped(), 0);  // rename is atomic: no half-written span file
}

// Write-behind: put() returns before the file exists; a read of a span
// still being written waits for it and gets it whole; what was forgotten
// before its write landed leaves no file; a span held in memory stays within
// the limit (one at a time here); the next process finds exactly what was
// kept. Threads: run under TSan.
TEST_F(DiskStore, WritesBehindAndNothingForgottenOutlivesItsEntry) {
  const size_t one = span_record_bytes(64, make_span(64, 1), false);
  {
    DiskSpanStore store(dir_, 1 << 26);
    store.write_behind(make_span(64, 1).bytes());  // room for one span waiting
    for (uint64_t key = 1; key <= 300; ++key) {
      ASSERT_TRUE(store.put(key, tokens_of(64, static_cast<int>(key)), make_span(64, key)));
      if (key % 3 == 0) store.remove(key);  // before or while its write lands
      if (key % 3 == 1) {
        const auto got = store.get(key, tokens_of(64, static_cast<int>(key)));
        ASSERT_TRUE(got.has_value()) << key;
        EXPECT_EQ(got->data(), make_span(64, key).data()) << key;
      }
    }
    EXPECT_EQ(store.n_files(), 200u);
    EXPECT_EQ(store.bytes(), 200 * one);
    store.flush();
    EXPECT_EQ(store.n_write_failures(), 0);
  }
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().extension(), ".kvspan") << e.path();
    ++files;
  }
  EXPECT_EQ(files, 200u) << "a forgotten span's file outlived it, or a kept one was not written";
  DiskSpanStore again(dir_, 1 << 26);
  for (uint64_t key = 1; key <= 300; ++key) {
    const auto got = again.get(key, tokens_of(64, static_cast<int>(key)));
    EXPECT_EQ(got.has_value(), key % 3 != 0) << key;
    if (got) {
      EXPECT_EQ(got->data(), make_span(64, key).data()) << key;
    }
  }
}

TEST_F(DiskStore, UnusableDirectoryIsAClearError) {
  std::ofstream(dir_) << "a file, not a directory";
  EXPECT_THROW(DiskSpanStore(dir_, 1 << 20), Error);
  std::filesystem::remove(dir_);
}

// Layer-wise preload (Cache-Craft): the loader's layers match a whole read
// byte for byte; a consumer waiting layer by layer, as a forward pass does,
// sees each one in order; a bad layer fails it and every later one, never
// an earlier one; a loader dropped half way joins cleanly. Run under TSan.
class LayerLoad : public DiskStore {
 protected:
  static constexpr int kLayers = 24;
  static KvSpan deep_span(int64_t n, uint32_t seed) {
    KvSpan s(kLayers, 64, DType::F16, n);
    const auto r = test::randn(s.data().size(), seed);
    for (size_t i = 0; i < s.data().size(); ++i)
      s.data()[i] = static_cast<uint8_t>(static_cast<int>(r[i] * 50));
    for (int64_t i = 0; i < n; ++i) s.positions()[i] = static_cast<int32_t>(i);
    return s;
  }
};

TEST_F(LayerLoad, LayersArriveInOrderAndMatchAWholeRead) {
  const KvSpan span = deep_span(40, 9);
  DiskSpanStore store(dir_, 16 << 20);
  ASSERT_TRUE(store.put(1, tokens_of(40, 1), span));
  for (const int preload : {0, 1, 5, kLayers, kLayers + 3}) {
    SCOPED_TRACE(preload);
    std::optional<DiskSpanStore::LayerReader> reader = store.open_layers(1, 0, tokens_of(40, 1), 0);
    ASSERT_TRUE(reader.has_value());
    depcache::LayerLoader loader(std::move(*reader), preload);
    EXPECT_GE(loader.ready(), std::min(preload, kLayers));
    const size_t layer_bytes = 2 * 40 * span.row_bytes();
    for (int il = 0; il < kLayers; ++il) {
      ASSERT_TRUE(loader.wait(il)) << il;
      EXPECT_EQ(std::memcmp(loader.span().k(il), span.k(il), layer_bytes), 0) << il;
    }
    EXPECT_FALSE(loader.wait(kLayers));
    EXPECT_FALSE(loader.failed());
    const KvSpan whole = loader.take();
    EXPECT_EQ(whole.data(), span.data());
    EXPECT_EQ(whole.positions(), span.positions());
  }
}

TEST_F(LayerLoad, ABadLayerFailsItAndTheLaterOnesOnly) {
  const KvSpan span = deep_span(16, 3);
  DiskSpanStore store(dir_, 16 << 20);
  ASSERT_TRUE(store.put(1, tokens_of(16, 1), span));
  std::vector<uint8_t> head(kSpanRecordHeader);
  std::ifstream(file_of(1), std::ios::binary).read(reinterpret_cast<char*>(head.data()), head.size());
  const std::optional<SpanRecordHeader> h = decode_span_record_header(head);
  ASSERT_TRUE(h.has_value());
  {
    std::fstream f(file_of(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(h->head_bytes() + 17 * h->layer_bytes() + 3));
    f.put('\x7f');
    f.seekp(static_cast<std::streamoff>(h->head_bytes() + 17 * h->layer_bytes() + 4));
    f.put('\x01');
  }
  for (const int preload : {2, 20}) {
    SCOPED_TRACE(preload);
    std::optional<DiskSpanStore::LayerReader> reader = store.open_layers(1, 0, tokens_of(16, 1), 0);
    ASSERT_TRUE(reader.has_value());
    depcache::LayerLoader loader(std::move(*reader), preload);
    for (int il = 0; il < 17; ++il) EXPECT_TRUE(loader.wait(il)) << il;
    for (int il = 17; il < kLayers; ++il) EXPECT_FALSE(loader.wait(il)) << il;
    EXPECT_TRUE(loader.failed());
    EXPECT_EQ(loader.ready(), 17);
    EXPECT_EQ(loader.take().n_tokens(), 0);
  }
}

TEST_F(LayerLoad, ALoaderDroppedHalfWayStopsAndJoins) {
  const KvSpan span = deep_span(200, 5);
  DiskSpanStore store(dir_, 64 << 20);
  ASSERT_TRUE(store.put(1, tokens_of(200, 1), span));
  for (int round = 0; round < 20; ++round) {
    std::optional<DiskSpanStore::LayerReader> reader = store.open_layers(1, 0, tokens_of(200, 1), 0);
    ASSERT_TRUE(reader.has_value());
    depcache::LayerLoader loader(std::move(*reader), 1);
    EXPECT_TRUE(loader.wait(round % kLayers));
  }  // each loader goes with layers still unread
}

TEST(LayerLoadDepth, TheLastLayerSetsHowManyToReadFirst) {
  EXPECT_EQ(preload_depth(10, 1.0, 2.0), 1);   // reading is faster: start at once
  EXPECT_EQ(preload_depth(10, 2.0, 2.0), 1);   // as fast: each layer in just in time
  EXPECT_EQ(preload_depth(10, 2.0, 1.0), 6);   // ceil(10 - 9 / 2)
  EXPECT_EQ(preload_depth(10, 3.0, 1.0), 7);   // ceil(10 - 9 / 3)
  EXPECT_EQ(preload_depth(10, 5.0, 0.0), 10);  // nothing to hide behind
  EXPECT_EQ(preload_depth(1, 5.0, 1.0), 1);
  EXPECT_EQ(preload_depth(0, 5.0, 1.0), 0);
  EXPECT_EQ(preload_depth(10, std::nan(""), 1.0), 1);
  // The rule holds: with that depth no layer is needed before it is in.
  for (const double load : {1.5, 2.0, 4.0, 9.0}) {
    const int d = preload_depth(32, load, 1.0);
    for (int i = 0; i < 32; ++i) EXPECT_LE((i + 1) * load, d * load + i * 1.0 + 1e-9) << load << " " << i;
    if (d > 1) {
      EXPECT_GT(32 * load, (d - 1) * load + 31 * 1.0) << "one fewer would wait";
    }
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

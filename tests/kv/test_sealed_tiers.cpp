// The shared tiers against whoever can write to them: records planted in the
// cache directory or in Redis with valid checksums but wrong K/V, sealed
// under another key, or of another shape are refused, counted and
// recomputed, never served; Redis AUTH; and a slow Redis costs at most its
// deadline, and only the requests that read from it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "kv/disk_store.h"
#include "kv/radix_index.h"
#include "kv/remote_store.h"
#include "kv/span_record.h"
#include "kv_rig.h"
#include "test_support.h"
#include "util/error.h"
#include "util/mac.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using namespace kv_rig;
using std::chrono::steady_clock;
constexpr int kMac = 0, kShapeReason = 1;  // reject_index(RecordStatus::Mac / Shape)

std::shared_ptr<const MacKey> key_of(char fill) {
  return std::make_shared<const MacKey>(std::vector<uint8_t>(32, static_cast<uint8_t>(fill)));
}

void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::filesystem::path file_for(const std::filesystem::path& dir, uint64_t key) {
  return dir / fmt::format("{:016x}.kvspan", key);
}

int64_t rejected(const RadixIndex& index, int tier, int reason) {
  return index.stats().rejected[tier][reason];
}

class SealedTiers : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_path("sealed-tiers");
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST(MacKey, ShortOrMissingKeyFileIsAClearError) {
  const std::filesystem::path dir = test::temp_path("mac-key");
  std::filesystem::create_directories(dir);
  write_bytes(dir / "short", std::vector<uint8_t>(31, 7));
  write_bytes(dir / "good", std::vector<uint8_t>(32, 7));
  for (const char* name : {"short", "missing"}) {
    try {
      MacKey::from_file(dir / name);
      ADD_FAILURE() << name << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
      EXPECT_NE(std::string(e.what()).find((dir / name).string()), std::string::npos) << e.what();
    }
  }
  const MacKey key = MacKey::from_file(dir / "good");
  const std::vector<uint8_t> msg = {1, 2, 3};
  EXPECT_TRUE(key.check(key.tag({msg}), {msg}));
  EXPECT_FALSE(key_of('x')->check(key.tag({msg}), {msg}));
  std::filesystem::remove_all(dir);
}

// Names are SipHash-2-4: the reference vector of its authors (key 00..0f,
// message 00..07), and a name depends on the key and the content key.
TEST(MacKey, NamesAreSipHashUnderTheKey) {
  SipKey k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(siphash24(k, 0x0706050403020100ull), 0x93f5f5799a932462ull);
  const auto a = key_of('a'), b = key_of('b');
  EXPECT_EQ(a->name(42), key_of('a')->name(42));
  EXPECT_NE(a->name(42), b->name(42));
  EXPECT_NE(a->name(42), a->name(43));
  EXPECT_NE(a->name(42), 42u);
}

// A planted file with a valid checksum but wrong K/V is refused, counted
// and recomputed: when the directory is opened, and when a file the index
// adopted is replaced under it.
TEST_F(SealedTiers, ForgedDiskRecordIsNeverServed) {
  const auto key = key_of('k');
  const Tokens s = sequence(1, 12), t = sequence(2, 12);
  const uint64_t ks = span_content_key(3, s), kt = span_content_key(3, t);
  {
    // A sound record of t (the deployment's key) and a forged one of s
    // (checksummed, as anyone can).
    DiskSpanStore disk(dir_, 1 << 20, key);
    ASSERT_TRUE(disk.put(kt, 3, t, 0, span_of(t, 0, 12)));
  }
  write_bytes(file_for(dir_, stored_name(key.get(), ks)),
              encode_span_record(ks, 3, s, 0, span_of(s, 0, 12, 99)));
  DiskSpanStore disk(dir_, 1 << 20, key);
  RadixIndex index(1 << 20);
  index.expect_span_shape(kShape);
  index.attach_disk(disk);
  EXPECT_EQ(rejected(index, RadixIndex::kRejectDisk, kMac), 1);  // refused when scanned
  EXPECT_FALSE(std::filesystem::exists(file_for(dir_, stored_name(key.get(), ks))));
  EXPECT_EQ(index.match(3, s).length, 0);
  // t was adopted; its file is now replaced by a forgery of the same size,
  // sealed under another key.
  ASSERT_TRUE(std::filesystem::exists(file_for(dir_, stored_name(key.get(), kt))));
  write_bytes(file_for(dir_, stored_name(key.get(), kt)),
              encode_span_record(kt, 3, t, 0, span_of(t, 0, 12, 55), key_of('z').get()));
  const RadixIndex::Match m = index.match(3, t);
  EXPECT_EQ(m.length, 0);
  EXPECT_EQ(rejected(index, RadixIndex::kRejectDisk, kMac), 2);
  // Recomputed and served from memory, true K/V.
  index.insert(3, t, maker(t));
  const RadixIndex::Match again = index.match(3, t);
  EXPECT_EQ(again.length, 12);
  expect_true_kv(index, again, t);
  index.check_invariants();
}

// A file of the previous format (DKVSPAN4) is not misread: dropped when the
// directory is opened, counted as `other`.
TEST_F(SealedTiers, OlderFormatIsDroppedNotMisread) {
  const Tokens s = sequence(6, 8);
  const uint64_t k = span_content_key(1, s);
  std::vector<uint8_t> record = encode_span_record(k, 1, s, 0, span_of(s, 0, 8));
  record[7] = '4';
  write_bytes(file_for(dir_, k), record);
  DiskSpanStore disk(dir_, 1 << 20);
  RadixIndex index(1 << 20);
  index.attach_disk(disk);
  EXPECT_EQ(disk.n_files(), 0u);
  EXPECT_EQ(rejected(index, RadixIndex::kRejectDisk, 2), 1);  // other
  EXPECT_EQ(index.match(1, s).length, 0);
}

// A layer whose bytes were changed after sealing fails its own tag when the
// layer-wise preload reads it.
TEST_F(SealedTiers, ForgedLayerFailsTheLayerWiseRead) {
  const auto key = key_of('k');
  const Tokens s = sequence(4, 10);
  const uint64_t k = span_content_key(1, s);
  std::vector<uint8_t> record = encode_span_record(k, 1, s, 0, span_of(s, 0, 10), key.get());
  record[record.size() - 5] ^= 1;  // the last layer's K/V
  write_bytes(file_for(dir_, stored_name(key.get(), k)), record);
  DiskSpanStore disk(dir_, 1 << 20, key);
  ASSERT_EQ(disk.n_files(), 1u);  // the head is sound: adopted
  std::optional<DiskSpanStore::LayerReader> reader = disk.open_layers(k, 1, s, 0);
  ASSERT_TRUE(reader);
  EXPECT_TRUE(reader->read_layer(0));
  EXPECT_FALSE(reader->read_layer(1));
  EXPECT_FALSE(disk.get(k, 1, s, 0).has_value());
  EXPECT_EQ(disk.n_rejected(kMac), 1);
}

TEST_F(SealedTiers, WrongShapeDiskRecordIsDroppedAndRecomputed) {
  const auto key = key_of('k');
  const Tokens s = sequence(5, 9);
  const uint64_t k = span_content_key(2, s);
  // Authentic (the deployment's key) but of another model: one more layer.
  write_bytes(
      file_for(dir_, stored_name(key.get(), k)),
      encode_span_record(k, 2, s, 0, span_of(s, 0, 9, 0, {kLayers + 1, kRowElems, DType::F16}), key.get()));
  DiskSpanStore disk(dir_, 1 << 20, key);
  RadixIndex index(1 << 20);
  index.expect_span_shape(kShape);
  index.attach_disk(disk);
  EXPECT_EQ(index.match(2, s).length, 0);
  EXPECT_EQ(rejected(index, RadixIndex::kRejectDisk, kShapeReason), 1);
  index.insert(2, s, maker(s));
  expect_true_kv(index, index.match(2, s), s);
}

// Whether `needle` occurs anywhere in `hay`.
bool contains_bytes(const std::vector<uint8_t>& hay, std::span<const uint8_t> needle) {
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Tokens no record would hold by chance: each a distinct 4-byte pattern.
Tokens marked_sequence(int64_t n) {
  Tokens t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(0x7e570000 + 0x0101 * i);
  return t;
}

// Whatever of `seq` and its K/V a stored record shows in clear: its token
// values, one by one, and 16-byte runs of its first layer's K.
int64_t clear_traces(const std::vector<uint8_t>& bytes, const Tokens& seq, const KvSpan& span) {
  int64_t found = 0;
  for (const int32_t t : seq)
    found += contains_bytes(bytes, {reinterpret_cast<const uint8_t*>(&t), sizeof t});
  for (size_t at = 0; at + 16 <= span.row_bytes() * static_cast<size_t>(span.n_tokens()); at += 16)
    found += contains_bytes(bytes, {span.k(0) + at, 16});
  return found;
}

// A reader of the cache directory learns sizes and nothing else: no token,
// no K/V, no namespace, and file names that cannot be computed from a
// guessed prompt. Without a key every one of them is there in clear (the
// check can fail). The store still reads its files back after a restart.
TEST_F(SealedTiers, ADiskRecordShowsAReaderNothingButItsSize) {
  const Tokens s = marked_sequence(24);
  const uint64_t ns = 0x5ca1ab1e;
  const uint64_t k = span_content_key(ns, s);
  const KvSpan span = span_of(s, 0, 24);
  for (const bool keyed : {false, true}) {
    std::filesystem::remove_all(dir_);
    const auto key = keyed ? key_of('k') : nullptr;
    {
      DiskSpanStore disk(dir_, 1 << 20, key);
      ASSERT_TRUE(disk.put(k, ns, s, 0, span_of(s, 0, 24)));
    }
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) files.push_back(e.path());
    ASSERT_EQ(files.size(), 1u);
    const std::vector<uint8_t> bytes = read_bytes(files[0]);
    const int64_t traces = clear_traces(bytes, s, span);
    const bool named_by_content = files[0].filename() == file_for(dir_, k).filename();
    const bool shows_ns = contains_bytes(bytes, {reinterpret_cast<const uint8_t*>(&ns), sizeof ns});
    if (!keyed) {
      EXPECT_GT(traces, 24) << "the check finds nothing even in clear";
      EXPECT_TRUE(named_by_content);
      EXPECT_TRUE(shows_ns);
      continue;
    }
    EXPECT_EQ(traces, 0) << "a sealed record shows tokens or K/V";
    EXPECT_FALSE(named_by_content) << "a sealed record is filed under its content key";
    EXPECT_FALSE(shows_ns) << "a sealed record shows its namespace";
    // Read back after a restart, whole and layer by layer.
    DiskSpanStore disk(dir_, 1 << 20, key);
    const std::vector<DiskSpanStore::StoredSpan> found = disk.scan();
    ASSERT_EQ(found.size(), 1u);
    EXPECT_EQ(found[0].key, k);
    EXPECT_EQ(found[0].ns, ns);
    EXPECT_EQ(found[0].tokens, s);
    const std::optional<KvSpan> got = disk.get(k, ns, s, 0);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->data(), span.data());
    EXPECT_EQ(got->positions(), span.positions());
    // A file of the same name and size from under another key is refused.
    write_bytes(files[0], encode_span_record(k, ns, s, 0, span, key_of('z').get()));
    EXPECT_FALSE(disk.get(k, ns, s, 0).has_value());
    EXPECT_EQ(disk.n_rejected(kMac), 1);
  }
}

struct KeyedIndexes {
  KeyedIndexes(int port, std::shared_ptr<const MacKey> key)
      : store_a(options(port)), store_b(options(port)), a(1 << 20), b(1 << 20) {
    a.expect_span_shape(kShape);
    b.expect_span_shape(kShape);
    a.attach_remote(store_a, 8, key);
    b.attach_remote(store_b, 8, key);
  }
  static RedisOptions options(int port) {
    RedisOptions o;
    o.port = port;
    o.timeout_ms = 2000;
    return o;
  }
  RedisStore store_a, store_b;
  RadixIndex a, b;
};

TEST(RemoteSealed, ForgedRedisRecordIsNeverServed) {
  DEPCACHE_REQUIRE_REDIS(redis);
  const auto key = key_of('k');
  KeyedIndexes two(redis.port(), key);
  const Tokens s = sequence(1, 24);
  // Block 0 published by a replica; blocks 1 and 2 planted: one with a
  // valid checksum, one sealed under another key.
  two.a.insert(7, Tokens(s.begin(), s.begin() + 8), maker(s));
  two.a.flush_remote();
  const std::span<const int32_t> seq(s);
  const uint64_t k1 = span_content_key(7, seq.first(16)), k2 = span_content_key(7, seq.first(24));
  two.store_a.put(stored_name(key.get(), k1),
                  encode_span_record(k1, 7, seq.first(16), 8, span_of(s, 8, 16, 77)));
  two.store_a.put(stored_name(key.get(), k2),
                  encode_span_record(k2, 7, seq, 16, span_of(s, 16, 24, 77), key_of('z').get()));
  RadixIndex::Match m = two.b.match(7, s);
  EXPECT_EQ(m.length, 8);  // block 0 only
  expect_true_kv(two.b, m, s);
  EXPECT_EQ(rejected(two.b, RadixIndex::kRejectRemote, kMac), 1);
  EXPECT_FALSE(two.store_a.get(stored_name(key.get(), k1)).has_value());  // deleted for everyone
  two.b.insert(7, s, maker(s));                                           // recomputed
  // Block 2 is next: refused too.
  RadixIndex c(1 << 20);
  c.expect_span_shape(kShape);
  RedisStore store_c(KeyedIndexes::options(redis.port()));
  c.attach_remote(store_c, 8, key);
  two.b.flush_remote();  // b published blocks 1 and 2 (block 2 kept: NX)
  m = c.match(7, s);
  EXPECT_EQ(m.length, 16);
  expect_true_kv(c, m, s);
  EXPECT_EQ(rejected(c, RadixIndex::kRejectRemote, kMac), 1);
}

TEST(RemoteSealed, WrongShapeRedisRecordIsDroppedAndRecomputed) {
  DEPCACHE_REQUIRE_REDIS(redis);
  const auto key = key_of('k');
  KeyedIndexes two(redis.port(), key);
  const Tokens s = sequence(2, 8);
  const uint64_t k = span_content_key(1, s);
  // Authentic, but F32 rows where this model keeps F16: placing it would
  // fail every request with this prefix.
  two.store_a.put(
      stored_name(key.get(), k),
      encode_span_record(k, 1, s, 0, span_of(s, 0, 8, 0, {kLayers, kRowElems, DType::F32}), key.get()));
  EXPECT_EQ(two.b.match(1, s).length, 0);
  EXPECT_EQ(rejected(two.b, RadixIndex::kRejectRemote, kShapeReason), 1);
  EXPECT_FALSE(two.store_a.get(stored_name(key.get(), k)).has_value());
  two.b.insert(1, s, maker(s));
  expect_true_kv(two.b, two.b.match(1, s), s);
}

// As on disk, in Redis: the values hold no token and no K/V, and no key is
// a content key (which anyone could compute from a guessed prompt).
TEST(RemoteSealed, ARedisRecordShowsAReaderNothingButItsSize) {
  DEPCACHE_REQUIRE_REDIS(redis);
  const auto key = key_of('k');
  KeyedIndexes two(redis.port(), key);
  const Tokens s = marked_sequence(24);
  two.a.insert(9, s, maker(s));
  two.a.flush_remote();
  std::vector<std::string> names;
  {
    redisContext* c = redisConnect("127.0.0.1", redis.port());
    ASSERT_TRUE(c && !c->err);
    auto* r = static_cast<redisReply*>(redisCommand(c, "KEYS *"));
    ASSERT_TRUE(r && r->type == REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < r->elements; ++i) names.emplace_back(r->element[i]->str, r->element[i]->len);
    freeReplyObject(r);
    redisFree(c);
  }
  ASSERT_EQ(names.size(), 3u);  // three blocks of 8
  const std::span<const int32_t> seq(s);
  for (int64_t end = 8; end <= 24; end += 8) {
    const std::string content =
        redis_key(KeyedIndexes::options(0).prefix, span_content_key(9, seq.first(end)));
    EXPECT_EQ(std::count(names.begin(), names.end(), content), 0) << "filed under its content key";
    const std::optional<std::vector<uint8_t>> v =
        two.store_a.get(stored_name(key.get(), span_content_key(9, seq.first(end))));
    ASSERT_TRUE(v) << "block ending at " << end;
    EXPECT_EQ(clear_traces(*v, s, span_of(s, end - 8, end)), 0) << "block ending at " << end;
  }
  // And b reads them.
  const RadixIndex::Match m = two.b.match(9, s);
  EXPECT_EQ(m.length, 24);
  expect_true_kv(two.b, m, s);
}

// One command on a fresh hiredis connection (for setting the server up).
void redis_admin(int port, std::initializer_list<const char*> args) {
  redisContext* c = redisConnect("127.0.0.1", port);
  ASSERT_TRUE(c && !c->err);
  std::vector<const char*> argv(args);
  auto* r =
      static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), nullptr));
  ASSERT_TRUE(r);
  EXPECT_NE(r->type, REDIS_REPLY_ERROR) << r->str;
  freeReplyObject(r);
  redisFree(c);
}

std::string construction_error(const RedisOptions& o) {
  try {
    RedisStore store(o);
    return "";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    return e.what();
  }
}

TEST(RemoteAuth, RightPasswordWorksWrongOrMissingIsAStartupError) {
  DEPCACHE_REQUIRE_REDIS(redis);
  redis_admin(redis.port(), {"ACL", "SETUSER", "replica", "on", ">user-secret", "~*", "+@all"});
  redis_admin(redis.port(), {"CONFIG", "SET", "requirepass", "default-secret"});
  RedisOptions o = KeyedIndexes::options(redis.port());
  EXPECT_NE(construction_error(o).find("--redis-password-file"), std::string::npos) << construction_error(o);
  o.password = "wrong";
  EXPECT_NE(construction_error(o).find("refused AUTH"), std::string::npos) << construction_error(o);
  o.password = "default-secret";
  {
    RedisStore store(o);
    store.put(1, std::vector<uint8_t>{1, 2, 3});
    EXPECT_EQ(store.get(1), std::vector<uint8_t>({1, 2, 3}));
    EXPECT_EQ(store.n_failures(), 0);
  }
  o.user = "replica";
  EXPECT_NE(construction_error(o).find("as user 'replica'"), std::string::npos) << construction_error(o);
  o.password = "user-secret";
  RedisStore store(o);
  EXPECT_EQ(store.get(1), std::vector<uint8_t>({1, 2, 3}));
  EXPECT_EQ(store.n_failures(), 0);
}

// A server that answers a connection's first read with `reply`, one byte
// every `per_byte` (or at once).
class CannedServer {
 public:
  explicit CannedServer(std::string reply, std::chrono::milliseconds per_byte = {})
      : reply_(std::move(reply)), per_byte_(per_byte) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      fail(ErrorKind::Internal, "canned server: cannot listen");
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~CannedServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      if (::recv(c, buf, sizeof buf, 0) > 0) {
        if (per_byte_.count() == 0) {
          ::send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL);
        } else {
          for (char ch : reply_) {
            if (stop_ || ::send(c, &ch, 1, MSG_NOSIGNAL) != 1) break;
            std::this_thread::sleep_for(per_byte_);
          }
        }
      }
      ::close(c);
    }
  }
  std::string reply_;
  std::chrono::milliseconds per_byte_;
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(RemoteDeadline, ATrickledReplyEndsAtTheDeadline) {
  // No single read waits long; the whole reply would take 2 s.
  CannedServer server("$100\r\n" + std::string(100, 'x') + "\r\n", std::chrono::milliseconds(20));
  RedisOptions o;
  o.port = server.port();
  o.timeout_ms = 150;
  o.retry_after_ms = 0;  // every call tries again
  const auto t0 = steady_clock::now();
  RedisStore store(o);  // its PING trickles too: a warning, not an error
  EXPECT_FALSE(store.get(42).has_value());
  const auto took = steady_clock::now() - t0;
  // Two commands (PING, GET) of 150 ms each; the whole reply would take 2 s.
  EXPECT_LT(took, std::chrono::milliseconds(1000));
  EXPECT_GE(store.n_failures(), 2);
  EXPECT_NE(store.last_error().find("no whole reply within 150 ms"), std::string::npos) << store.last_error();
}

// A server that announces a two-billion-element array (hiredis would
// allocate 16 GB for its slots at once) is a failed call naming the count,
// and the tier a miss.
TEST(RemoteHostile, AHugeArrayCountIsRefusedByName) {
  CannedServer server("*2000000000\r\n");
  RedisOptions o;
  o.port = server.port();
  o.retry_after_ms = 0;
  RedisStore store(o);
  EXPECT_FALSE(store.get(42).has_value());
  EXPECT_GE(store.n_failures(), 1);
  EXPECT_NE(store.last_error().find("announced an array of 2000000000 elements"), std::string::npos)
      << store.last_error();
}

// A value larger than the read expects is refused as it arrives, not held
// whole first (a fetch's bound is the record size of the model's shape);
// within its bound the same reply is read.
TEST(RemoteHostile, AValuePastTheReadsBoundIsRefusedByName) {
  const std::string value(200000, 'v');
  CannedServer server("*1\r\n$200000\r\n" + value + "\r\n");
  RedisOptions o;
  o.port = server.port();
  o.retry_after_ms = 0;
  RedisStore store(o);
  const std::vector<uint64_t> keys{42};
  // The canned server answers once per connection: the connection the
  // store opened first may be spent, so a call can fail on it first.
  for (int i = 0; i < 3 && store.last_error().find("more than") == std::string::npos; ++i)
    EXPECT_FALSE(store.get_many(keys, 1000)[0].has_value());
  EXPECT_NE(store.last_error().find("sent a reply of more than 1000 bytes"), std::string::npos)
      << store.last_error();
  std::optional<std::vector<uint8_t>> got;
  for (int i = 0; i < 3 && !got; ++i) got = store.get_many(keys, 300000)[0];
  ASSERT_TRUE(got.has_value()) << store.last_error();
  EXPECT_EQ(got->size(), value.size());
}

// While one request waits on a paused Redis, another that finds all it
// needs locally, and an insert (publishing is queued), go through at once.
TEST(RemoteDeadline, SlowRedisDoesNotStallRequestsThatDoNotReadIt) {
  DEPCACHE_REQUIRE_REDIS(redis);
  RedisOptions o = KeyedIndexes::options(redis.port());
  o.timeout_ms = 5000;
  RedisStore store(o);
  RadixIndex index(1 << 20);
  index.expect_span_shape(kShape);
  index.attach_remote(store, 8, key_of('k'));
  const Tokens local = sequence(1, 16), remote = sequence(2, 16), fresh = sequence(3, 16);
  index.insert(1, local, maker(local));
  index.flush_remote();
  redis_admin(redis.port(), {"CLIENT", "PAUSE", "1500", "ALL"});
  const auto t0 = steady_clock::now();
  auto slow = std::async(std::launch::async, [&] { return index.match(1, remote).length; });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it is inside its GET now
  const auto t1 = steady_clock::now();
  const RadixIndex::Match m = index.match(1, local);
  EXPECT_EQ(m.length, 16);
  index.insert(1, fresh, maker(fresh));
  EXPECT_EQ(index.peek(1, fresh).length, 16);
  const auto fast = steady_clock::now() - t1;
  EXPECT_LT(fast, std::chrono::milliseconds(300)) << "a local request waited on Redis";
  EXPECT_EQ(slow.get(), 0);  // a miss, after the pause
  EXPECT_GT(steady_clock::now() - t0, std::chrono::milliseconds(1000));
  index.flush_remote();
  index.check_invariants();
}

// A match that reads many blocks asks Redis once (MGET), so the whole read
// has one deadline, however many blocks it spans.
TEST(RemoteDeadline, AFetchOfManyBlocksIsOneCommand) {
  DEPCACHE_REQUIRE_REDIS(redis);
  KeyedIndexes two(redis.port(), key_of('k'));
  const Tokens s = sequence(1, 8 * 20);
  two.a.insert(7, s, maker(s));
  two.a.flush_remote();
  const auto calls = [&](const std::string& command) {
    const std::string info =
        test::run_shell("redis-cli -p " + std::to_string(redis.port()) + " INFO commandstats").out;
    const auto at = info.find("cmdstat_" + command + ":calls=");
    return at == std::string::npos ? 0L : std::stol(info.substr(at + command.size() + 15));
  };
  const long gets = calls("get"), mgets = calls("mget");
  const RadixIndex::Match m = two.b.match(7, s);
  EXPECT_EQ(m.length, 8 * 20);
  EXPECT_EQ(m.tokens_from[static_cast<int>(Tier::Remote)], 8 * 20);
  EXPECT_EQ(calls("mget"), mgets + 1);
  EXPECT_EQ(calls("get"), gets);
  expect_true_kv(two.b, m, s);
}

// A remote store whose first get_many after arm() reads, then holds its
// caller until release(): the read a match makes with the index's lock
// released, kept open while the test changes the tree.
class LatchedStore final : public RemoteStore {
 public:
  explicit LatchedStore(RemoteStore& inner) : inner_(inner) {}
  std::optional<std::vector<uint8_t>> get(uint64_t key) override { return inner_.get(key); }
  using RemoteStore::get_many;
  std::vector<std::optional<std::vector<uint8_t>>> get_many(std::span<const uint64_t> keys,
                                                            size_t max_value_bytes) override {
    auto got = inner_.get_many(keys, max_value_bytes);
    std::unique_lock lk(mu_);
    if (armed_) {
      armed_ = false;
      held_ = true;
      cv_.notify_all();
      cv_.wait(lk, [&] { return released_; });
    }
    return got;
  }
  void put(uint64_t key, std::span<const uint8_t> record) override { inner_.put(key, record); }
  void remove(uint64_t key) override { inner_.remove(key); }

  void arm() {
    const std::lock_guard lk(mu_);
    armed_ = true;
  }
  bool wait_held(std::chrono::seconds timeout) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return held_; });
  }
  void release() {
    const std::lock_guard lk(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  RemoteStore& inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, held_ = false, released_ = false;
};

// A match holding the index's lock alone reads the remote blocks with it
// released. While that read is held open, another request inserts a
// sibling that diverges inside the matched prefix, splitting its node. The
// blocks are then adopted against the tree as it is now: they are counted
// as read without the lock, the match names the split's head, and every
// row it serves is the true K and V.
TEST(RemoteDeadline, BlocksReadWithoutTheLockAreAdoptedIntoTheTreeAsItIsThen) {
  DEPCACHE_REQUIRE_REDIS(redis);
  const auto key = key_of('k');
  const Tokens a = sequence(1, 40);
  Tokens sibling = sequence(2, 24);
  std::copy_n(a.begin(), 8, sibling.begin());  // a's first 8 tokens, then its own
  RedisStore store_p(KeyedIndexes::options(redis.port())), redis_store(KeyedIndexes::options(redis.port()));
  LatchedStore store(redis_store);
  RadixIndex publisher(1 << 20), index(1 << 20);
  publisher.expect_span_shape(kShape);
  index.expect_span_shape(kShape);
  publisher.attach_remote(store_p, 8, key);
  index.attach_remote(store, 8, key);
  publisher.insert(1, a, maker(a));
  publisher.flush_remote();
  index.insert(1, Tokens(a.begin(), a.begin() + 16), maker(a));  // one node; blocks 2-4 are remote only
  index.flush_remote();
  ASSERT_EQ(index.stats().unlocked_remote_blocks, 0);

  store.arm();
  RadixIndex::Match m;
  std::thread reader([&] { m = index.match(1, a); });
  const bool held = store.wait_held(std::chrono::seconds(30));
  // The sibling's insert needs the lock: it finishes only if the read let go of it.
  auto split = std::async(std::launch::async, [&] {
    if (held) index.insert(1, sibling, maker(sibling));
  });
  const bool inserted_during_read = split.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  store.release();
  split.get();
  reader.join();
  ASSERT_TRUE(held) << "the match never read the remote store";
  ASSERT_TRUE(inserted_during_read) << "the remote read held the index's lock";

  EXPECT_EQ(index.stats().unlocked_remote_blocks, 3) << "blocks [16, 24), [24, 32), [32, 40)";
  EXPECT_EQ(m.length, 40);
  EXPECT_EQ(m.tokens_from[static_cast<int>(Tier::Hot)], 16);
  EXPECT_EQ(m.tokens_from[static_cast<int>(Tier::Remote)], 24);
  ASSERT_FALSE(m.pieces.empty());
  EXPECT_EQ(m.pieces[0].length, 8) << "the match names the node as split during the read";
  expect_true_kv(index, m, a);  // nothing was inserted since: its pieces still hold
  const RadixIndex::Match s = index.match(1, sibling);
  EXPECT_EQ(s.length, 24);
  expect_true_kv(index, s, sibling);
  index.check_invariants();
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// The index's tiers: spans move hot -> host -> disk under their budgets and
// come back intact on a match; the disk tier survives a restart; corrupt
// files, a full disk and a writer killed mid-stream never make the index
// serve wrong K/V; random operation sequences keep every tier within its
// budget, never move pinned nodes, and keep the index and the disk store in
// agreement.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "kv/radix_index.h"
#include "kv/span_record.h"
#include "kv_rig.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using namespace kv_rig;

// An index over a disk store in `dir` takes the sequences and shuts down
// cleanly: the next one to open `dir` finds them all on disk.
void persist_all(const std::filesystem::path& dir, const std::vector<Tokens>& seqs, uint64_t ns,
                 size_t hot_bytes) {
  DiskSpanStore disk(dir, 1 << 20);
  RadixIndex index(hot_bytes);
  index.attach_disk(disk);
  for (const Tokens& s : seqs) index.insert(ns, s, maker(s));
  index.persist();  // a clean shutdown: what is in memory goes to disk
  index.check_invariants();
  EXPECT_EQ(index.bytes(Tier::Hot), 0u);
}

class Tiers : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::temp_path("tiers"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(Tiers, SpansMoveDownAndComeBackIntact) {
  const size_t tb = token_bytes();
  DiskSpanStore disk(dir_, 1 << 20);
  RadixIndex index(40 * tb);
  index.attach_host(40 * tb);
  index.attach_disk(disk);
  std::vector<Tokens> seqs;
  for (int i = 0; i < 8; ++i) seqs.push_back(sequence(i, 20, 8));  // 8 shared tokens, then 12 own
  for (const Tokens& s : seqs) {
    index.insert(1, s, maker(s));
    index.check_invariants();
    EXPECT_LE(index.bytes(Tier::Hot), index.budget(Tier::Hot));
    EXPECT_LE(index.bytes(Tier::Host), index.budget(Tier::Host));
  }
  EXPECT_GT(index.n_nodes(Tier::Host), 0u);
  EXPECT_GT(index.n_nodes(Tier::Disk), 0u);
  EXPECT_EQ(disk.n_files(), index.n_nodes(Tier::Disk));
  // The oldest went furthest; a match brings it back whole.
  const RadixIndex::Match m = index.match(1, seqs[0]);
  EXPECT_EQ(m.length, 20);
  EXPECT_GT(m.tokens_from[static_cast<int>(Tier::Disk)], 0);
  expect_true_kv(index, m, seqs[0]);
  for (const RadixIndex::Piece& p : m.pieces) EXPECT_GT(index.span(p.node).n_tokens(), 0);
  EXPECT_GT(index.stats().promoted_bytes, 0);
  index.check_invariants();
}

// Swap-out-once (RAGCache): the first eviction from the hot tier copies a
// span to the host tier; brought back, the span keeps that copy, so the
// next eviction copies nothing. Without it every eviction copies. The K/V
// served is the same either way; the copies count against the host budget
// and go first when it is short (the span stays hot).
TEST_F(Tiers, SwapOutOnceCopiesASpanToTheHostTierOnlyOnce) {
  const size_t tb = token_bytes();
  const Tokens a = sequence(1, 10), b = sequence(2, 10), c = sequence(3, 10);
  for (bool once : {false, true}) {
    RadixIndex index(10 * tb);
    index.attach_host(20 * tb, once);
    index.insert(1, a, maker(a));
    index.insert(1, b, maker(b));  // a swapped out: one copy
    EXPECT_EQ(index.stats().swapped_out_bytes, static_cast<int64_t>(10 * tb));
    for (int round = 0; round < 3; ++round) {
      const RadixIndex::Match m = index.match(1, a);  // a back in, b out
      EXPECT_EQ(m.length, 10);
      expect_true_kv(index, m, a);
      index.check_invariants();
      const RadixIndex::Match n = index.match(1, b);  // b back in, a out
      expect_true_kv(index, n, b);
      index.check_invariants();
      EXPECT_LE(index.bytes(Tier::Host), index.budget(Tier::Host));
    }
    // 7 evictions in all (b, then a and b three times each): each copies
    // without swap-out-once; with it only the first of each span does.
    EXPECT_EQ(index.stats().swapped_out_bytes, static_cast<int64_t>((once ? 2 : 7) * 10 * tb)) << once;
    EXPECT_EQ(index.stats().swap_outs_saved, once ? 5 : 0);
    if (!once) continue;
    // b is hot with its copy; a in the host tier: the host tier is full.
    EXPECT_EQ(index.bytes(Tier::Host), 20 * tb);
    index.insert(1, c, maker(c));  // b goes down onto its copy; c hot
    index.check_invariants();
    const RadixIndex::Match m = index.match(1, a);  // a up with its copy, c down: a copy is dropped for it
    expect_true_kv(index, m, a);
    index.check_invariants();
    EXPECT_LE(index.bytes(Tier::Host), index.budget(Tier::Host));
    EXPECT_EQ(index.peek(1, b).length + index.peek(1, c).length, 20) << "nothing cached was lost";
  }
}

TEST_F(Tiers, DiskTierSurvivesARestart) {
  const size_t tb = token_bytes();
  std::vector<Tokens> seqs;
  for (int i = 0; i < 6; ++i) seqs.push_back(sequence(i, 16, 5));
  persist_all(dir_, seqs, 7, 30 * tb);
  DiskSpanStore disk(dir_, 1 << 20);
  RadixIndex index(30 * tb);
  index.attach_disk(disk);
  index.check_invariants();
  for (const Tokens& s : seqs) {
    const RadixIndex::Match m = index.match(7, s);
    EXPECT_EQ(m.length, 16);
    expect_true_kv(index, m, s);
    index.check_invariants();
  }
  EXPECT_EQ(index.match(8, seqs[0]).length, 0);  // another namespace has nothing
}

// Layer-wise preload in match: a piece on disk comes back with a loader
// (its first layer read, the node still on disk); every layer it reads
// equals the stored K/V, and adopting it makes the node hot with that span
// and removes its file. Prefetch still reads whole.
TEST_F(Tiers, ALayeredMatchReadsDiskPiecesLayerByLayerThenAdoptsThem) {
  const size_t tb = token_bytes();
  std::vector<Tokens> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(sequence(i, 16, 5));
  persist_all(dir_, seqs, 7, 30 * tb);
  DiskSpanStore disk(dir_, 1 << 20);
  RadixIndex index(30 * tb);
  index.attach_disk(disk);
  index.set_layer_preload({RadixIndex::LayerPreload::Mode::Fixed, 1});
  const RadixIndex::Match m = index.match(7, seqs[0]);
  ASSERT_EQ(m.length, 16);
  ASSERT_EQ(m.loading.size(), m.pieces.size());
  int64_t at = 0;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const RadixIndex::Piece& p = m.pieces[i];
    ASSERT_NE(m.loading[i], nullptr) << i;
    LayerLoader& loader = *m.loading[i];
    EXPECT_GE(loader.ready(), 1);
    EXPECT_EQ(index.span(p.node).n_tokens(), 0) << "still on disk";
    const KvSpan want = span_of(seqs[0], at, at + p.length);
    for (int il = 0; il < kLayers; ++il) {
      ASSERT_TRUE(loader.wait(il));
      EXPECT_EQ(std::memcmp(loader.span().k(il), want.k(il), 2 * want.row_bytes() * p.length), 0) << il;
    }
    EXPECT_TRUE(index.adopt_loaded(p.node, loader));
    EXPECT_FALSE(index.adopt_loaded(p.node, loader)) << "adopted once";
    at += p.length;
  }
  index.check_invariants();
  expect_true_kv(index, index.match(7, seqs[0]), seqs[0]);
  EXPECT_EQ(index.prefetch(7, seqs[1]), 16 - 5);  // whole: the shared 5 are hot already
  index.check_invariants();
}

// Layered loads and the requests holding them: the runs of one request
// share a node's loader (the file is read once; the second run counts the
// tokens as found in memory), another request gets its own. A bad load
// drops the node while both requests still pin it: it leaves the tree at
// once (no match finds it), and its id is freed only at the last unpin.
TEST_F(Tiers, ABadLoadLeavesTheTreeAtOnceAndItsIdAtTheLastUnpin) {
  const size_t tb = token_bytes();
  const std::vector<Tokens> seqs = {sequence(1, 16, 5)};
  persist_all(dir_, seqs, 7, 30 * tb);
  DiskSpanStore disk(dir_, 1 << 20);
  RadixIndex index(30 * tb);
  index.attach_disk(disk);
  index.set_layer_preload({RadixIndex::LayerPreload::Mode::Fixed, 0});
  const uint64_t first = index.begin_request(), second = index.begin_request();
  const RadixIndex::Match a = index.match(7, seqs[0], first);
  const RadixIndex::Match a_again = index.match(7, seqs[0], first);
  const RadixIndex::Match b = index.match(7, seqs[0], second);
  ASSERT_EQ(a.length, 16);
  ASSERT_EQ(a.loading.size(), a.pieces.size());
  EXPECT_EQ(a_again.loading[0], a.loading[0]) << "one read per request";
  EXPECT_NE(b.loading[0], a.loading[0]) << "another request reads for itself";
  EXPECT_EQ(a.tokens_from[static_cast<int>(Tier::Disk)], 16);
  EXPECT_EQ(a_again.tokens_from[static_cast<int>(Tier::Disk)], 0);
  index.pin(a);
  index.pin(b);
  const RadixIndex::NodeId node = a.pieces[0].node;
  EXPECT_TRUE(index.drop_bad_load(node, a.loading[0]->key()));
  EXPECT_FALSE(index.drop_bad_load(node, a.loading[0]->key())) << "gone already";
  EXPECT_EQ(index.stats().dropped_bad, 1);
  EXPECT_EQ(index.peek(7, seqs[0]).length, 0) << "out of the tree at once";
  index.check_invariants();
  EXPECT_FALSE(index.adopt_loaded(node, *b.loading[0])) << "a dropped node takes no span";
  index.unpin(a);
  // Still named by b: new nodes must not take its id.
  index.insert(7, seqs[0], maker(seqs[0]));
  const RadixIndex::Match c = index.match(7, seqs[0]);
  for (const RadixIndex::Piece& p : c.pieces) EXPECT_NE(p.node, node);
  index.unpin(b);
  index.check_invariants();
  expect_true_kv(index, index.match(7, seqs[0]), seqs[0]);
}

TEST_F(Tiers, OrphansAndForeignFilesAreNotAdopted) {
  const size_t tb = token_bytes();
  const Tokens a = sequence(1, 12, 4), b = sequence(2, 12, 4);
  {
    DiskSpanStore disk(dir_, 1 << 20);
    RadixIndex index(100 * tb);
    index.attach_disk(disk);
    index.insert(3, a, maker(a));
    index.insert(3, b, maker(b));  // splits: shared 4, then two leaves of 8
    index.persist();
    EXPECT_EQ(disk.n_files(), 3u);
  }
  // Remove the shared parent's file: both leaves lose their context.
  {
    DiskSpanStore disk(dir_, 1 << 20);
    const auto found = disk.scan();
    for (const auto& f : found)
      if (f.prefix == 0) disk.remove(f.key);
  }
  DiskSpanStore disk(dir_, 1 << 20);
  RadixIndex index(100 * tb);
  index.attach_disk(disk);
  EXPECT_EQ(disk.n_files(), 0u);  // orphans deleted
  EXPECT_EQ(index.match(3, a).length, 0);
  index.check_invariants();
}

TEST_F(Tiers, CorruptDiskFileIsDroppedWithItsSubtreeNeverServed) {
  const size_t tb = token_bytes();
  DiskSpanStore disk(dir_, 1 << 20);
  RadixIndex index(20 * tb);
  index.attach_disk(disk);
  const Tokens a = sequence(1, 18, 6), b = sequence(2, 18, 6);
  index.insert(1, a, maker(a));
  index.insert(1, b, maker(b));
  for (int i = 3; i < 6; ++i) {
    const Tokens c = sequence(i, 18);
    index.insert(1, c, maker(c));  // pushes a and b to disk
  }
  ASSERT_GT(disk.n_files(), 0u);
  // Flip a byte in every span file.
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  const RadixIndex::Match m = index.match(1, a);
  expect_true_kv(index, m, a);  // whatever is served is right
  EXPECT_LT(m.length, 18);      // and the corrupt part is not served
  EXPECT_GT(index.stats().dropped_bad, 0);
  index.check_invariants();
  // Recomputed and inserted again, it is whole.
  index.insert(1, a, maker(a));
  const RadixIndex::Match again = index.match(1, a);
  EXPECT_EQ(again.length, 18);
  expect_true_kv(index, again, a);
}

TEST_F(Tiers, FullDiskDegradesToRecomputation) {
  const size_t tb = token_bytes();
  // A file size limit makes every write past it fail as a full disk would.
  signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  for (const bool behind : {false, true}) {
    const std::string label = behind ? "written behind" : "written at once";
    std::filesystem::remove_all(dir_);
    DiskSpanStore disk(dir_, 1 << 20);
    if (behind) disk.write_behind(1 << 20);
    RadixIndex index(250 * tb);
    index.attach_disk(disk);
    std::vector<Tokens> seqs;
    for (int i = 0; i < 10; ++i) seqs.push_back(sequence(i, 100));  // 100-token files exceed 4 KiB
    for (const Tokens& s : seqs) {
      index.insert(2, s, maker(s));
      index.check_invariants();
    }
    disk.flush();
    EXPECT_GT(index.stats().disk_write_failures, 0) << label;
    for (const auto& entry : std::filesystem::directory_iterator(dir_))
      ADD_FAILURE() << label << ": left behind: " << entry.path();
    for (const Tokens& s : seqs) {
      const RadixIndex::Match m = index.match(2, s);
      expect_true_kv(index, m, s);
      index.check_invariants();
    }
    // Written behind, a failed span is found missing when read: dropped then.
    EXPECT_EQ(disk.n_files(), 0u) << label;
  }
  setrlimit(RLIMIT_FSIZE, &old);
}

// A process demoting spans to disk is killed at random moments; the next
// process adopts what it finds and serves only correct K/V.
TEST_F(Tiers, KilledWriterLeavesNothingWrongBehind) {
  const size_t tb = token_bytes();
  for (int round = 0; round < 3; ++round) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // A hot tier of two sequences: every insert demotes an older one to
      // disk, so the writer is always writing files when it is killed. The
      // sequences share no prefix: a file whose context stayed in memory
      // would be an orphan after the kill (adopted only after persist()).
      DiskSpanStore disk(dir_, 1 << 20);
      RadixIndex index(80 * tb);
      index.attach_disk(disk);
      for (int i = 0;; ++i) {
        const Tokens s = sequence(i % 50, 40);
        index.insert(4, s, maker(s));
      }
    }
    // Kill it once it has written a few files (at most 10 s: a slow build
    // under a sanitizer), a little later each round.
    const auto n_span_files = [&] {
      size_t n = 0;
      for (const auto& e : std::filesystem::directory_iterator(dir_)) n += e.path().extension() != ".partial";
      return n;
    };
    for (int wait = 0; wait < 2000 && (!std::filesystem::exists(dir_) || n_span_files() < 3); ++wait)
      usleep(5000);
    usleep(static_cast<useconds_t>(3000 * round));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    DiskSpanStore disk(dir_, 1 << 20);
    EXPECT_GT(disk.n_files(), 0u) << "round " << round << ": the writer left no span files";
    RadixIndex index(1 << 20);
    index.attach_disk(disk);
    index.check_invariants();
    int64_t matched = 0, from_disk = 0;
    for (int i = 0; i < 50; ++i) {
      const Tokens s = sequence(i, 40);
      const RadixIndex::Match m = index.match(4, s);
      expect_true_kv(index, m, s);  // byte-exact, or not matched at all
      matched += m.length;
      from_disk += m.tokens_from[static_cast<int>(Tier::Disk)];
    }
    EXPECT_GT(matched, 40) << "round " << round << ": nothing the writer left was reusable";
    EXPECT_GT(from_disk, 0) << "round " << round;
    index.check_invariants();
  }
}

// Random inserts, matches, pins, unpins and prefetches over three tiers:
// budgets hold (beyond what pins hold), pinned nodes stay hot, served K/V is
// right, and the index agrees with the disk store after every step.
TEST_F(Tiers, RandomOperationsKeepTheTiersConsistent) {
  const size_t tb = token_bytes();
  for (const std::string policy :
       {"lru", "lfu", "pgdsf", "lacr", "lru+swap-out-once", "pgdsf+swap-out-once"}) {
    std::filesystem::remove_all(dir_);
    DiskSpanStore disk(dir_, 300 * span_record_bytes(1, span_of({1}, 0, 1), false));
    const bool once = policy.find("+swap-out-once") != std::string::npos;
    RadixIndex index(60 * tb, make_policy(policy.substr(0, policy.find('+'))));
    index.attach_host(60 * tb, once);
    index.attach_disk(disk);
    if (policy.starts_with("lfu") || policy.starts_with("pgdsf")) disk.write_behind(8 * tb);
    std::mt19937 rng(42);
    struct Pinned {
      uint64_t ns;
      Tokens seq;
      RadixIndex::Match m;
    };
    std::vector<Pinned> pinned;
    for (int step = 0; step < 600; ++step) {
      const int id = static_cast<int>(rng() % 30);
      const Tokens s = sequence(id, 5 + static_cast<int64_t>(rng() % 25), static_cast<int64_t>(rng() % 12));
      const int op = static_cast<int>(rng() % 10);
      if (op < 4) {
        index.insert(1 + id % 2, s, maker(s));
      } else if (op < 7) {
        const RadixIndex::Match m = index.match(1 + id % 2, s);
        expect_true_kv(index, m, s);
        if (rng() % 3 == 0 && pinned.size() < 4) {
          index.pin(m);
          pinned.push_back({static_cast<uint64_t>(1 + id % 2), s, m});
        }
      } else if (op < 8) {
        index.prefetch(1 + id % 2, s);
      } else if (!pinned.empty()) {
        index.unpin(pinned.back().m);
        pinned.pop_back();
      }
      ASSERT_NO_THROW(index.check_invariants()) << policy << " step " << step;
      // Pieces of a pinned match go stale when an insert splits a node;
      // the sequence itself stays whole and hot.
      for (const Pinned& p : pinned) {
        const RadixIndex::Match now = index.peek(p.ns, p.seq);
        ASSERT_GE(now.length, p.m.length) << policy << " step " << step;
        expect_true_kv(index, now, p.seq);
      }
      if (pinned.empty()) {
        ASSERT_LE(index.bytes(Tier::Hot), index.budget(Tier::Hot)) << policy << " step " << step;
      }
      ASSERT_LE(index.bytes(Tier::Host), index.budget(Tier::Host)) << policy << " step " << step;
      ASSERT_LE(disk.bytes(), disk.budget()) << policy << " step " << step;
    }
    for (const Pinned& p : pinned) index.unpin(p.m);
    index.check_invariants();
  }
}

// A prefetch brings a span from disk to the hot tier; the match that then
// uses it reports it as found on disk (where the request's KV came from),
// once: the next match finds it hot.
TEST_F(Tiers, APrefetchedSpanIsReportedInTheTierItCameFrom) {
  const size_t tb = token_bytes();
  const std::vector<Tokens> seqs = {sequence(1, 16, 5), sequence(2, 12, 5)};
  persist_all(dir_, seqs, 7, 40 * tb);
  DiskSpanStore disk(dir_, 1 << 20);
  RadixIndex index(40 * tb);
  index.attach_disk(disk);
  EXPECT_EQ(index.prefetch(7, seqs[0]), 16);
  EXPECT_EQ(index.n_nodes(Tier::Disk), 1u) << "the other sequence's own tokens";
  const RadixIndex::Match first = index.match(7, seqs[0]);
  EXPECT_EQ(first.tokens_from[static_cast<int>(Tier::Disk)], 16);
  EXPECT_EQ(first.tokens_from[static_cast<int>(Tier::Hot)], 0);
  expect_true_kv(index, first, seqs[0]);
  const RadixIndex::Match again = index.match(7, seqs[0]);
  EXPECT_EQ(again.tokens_from[static_cast<int>(Tier::Hot)], 16);
  // The shared 5 were reported already; the rest of the other one comes from disk in the match.
  const RadixIndex::Match other = index.match(7, seqs[1]);
  EXPECT_EQ(other.tokens_from[static_cast<int>(Tier::Hot)], 5);
  EXPECT_EQ(other.tokens_from[static_cast<int>(Tier::Disk)], 7);
  EXPECT_EQ(index.stats().hit_tokens[static_cast<int>(Tier::Disk)], 16 + 7);
  index.check_invariants();
}

// Holds the disk reads of one thread. install(), called on that thread,
// puts a seccomp filter on it that hands each of its pread64 calls to
// supervise(): a file's head (read under the index's lock) goes through at
// once, the first read of a layer (made with the lock released) waits there
// until `during` has run. The store's own code reads, unchanged.
class LayerReadLatch {
 public:
  ~LayerReadLatch() {
    if (listener_ >= 0) ::close(listener_);
  }
  // False where the kernel or a sandbox does not allow it.
  bool install() {
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return false;
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_pread64, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(filter)), filter};
    const long fd = ::syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    listener_ = static_cast<int>(fd);
    return fd >= 0;
  }
  void set_listener_ready() {
    const std::lock_guard lk(mu_);
    ready_ = true;
    cv_.notify_all();
  }
  bool wait_listener() {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(30), [&] { return ready_; });
  }
  bool installed() const { return listener_ >= 0; }
  // Answers the held thread's reads until `done`; runs `during` (once) while
  // the first layer read waits. Returns whether it ran.
  bool supervise(const std::atomic<bool>& done, const std::function<void()>& during) {
    bool ran = false;
    while (!done) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0 || !(p.revents & POLLIN)) continue;
      seccomp_notif req{};
      if (::ioctl(listener_, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) continue;
      if (!ran && req.data.args[3] > kSpanRecordHeader) {  // past the head: a layer
        during();
        ran = true;
      }
      seccomp_notif_resp resp{};
      resp.id = req.id;
      resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;  // the read itself, as asked
      ::ioctl(listener_, SECCOMP_IOCTL_NOTIF_SEND, &resp);
    }
    return ran;
  }

 private:
  int listener_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false;
};

// A prefetch or a match holding the index's lock alone reads the layers of
// the spans it found on disk with the lock released. While that read is
// held open, another request inserts a sibling that diverges on the path:
// inside the hot node above the spans (both spans are still on disk and
// are adopted), or inside the first span (the sibling's insert brings that
// one in itself: only the second is adopted). Each adoption is counted as a
// read without the lock, the next match finds the spans where the read left
// them, and every row served is the true K and V.
TEST_F(Tiers, SpansReadWithoutTheLockAreAdoptedIntoTheTreeAsItIsThen) {
  const size_t tb = token_bytes();
  // a: [0, 8) hot, [8, 24) and [24, 40) on disk (b and c fix the cuts).
  const Tokens a = sequence(1, 40);
  const auto branch = [&](int id, int64_t shared, int64_t n) {
    Tokens t = sequence(id, n);
    std::copy_n(a.begin(), shared, t.begin());
    return t;
  };
  const Tokens b = branch(2, 24, 32), c = branch(3, 8, 16);
  struct Case {
    int64_t sibling_shares;         // of a's tokens, then its own
    bool prefetch;                  // else a match
    int64_t adopted;                // spans the read brought in
    int64_t hot_found, disk_found;  // what the next counted match of a reports
  };
  // A prefetch marks what it brought in as found on disk; a match reports it then.
  for (const Case& k : {Case{4, true, 2, 8, 32}, Case{16, false, 1, 40, 0}}) {
    SCOPED_TRACE(k.prefetch ? "prefetch, sibling inside the hot node"
                            : "match, sibling inside the first span");
    std::filesystem::remove_all(dir_);
    persist_all(dir_, {a, b, c}, 7, 200 * tb);
    DiskSpanStore disk(dir_, 1 << 22);
    RadixIndex index(200 * tb);
    index.attach_disk(disk);
    ASSERT_EQ(index.match(7, Tokens(a.begin(), a.begin() + 8)).length, 8);  // [0, 8) to the hot tier
    ASSERT_EQ(index.n_nodes(Tier::Disk), 4u);
    const int64_t unlocked_before = index.stats().unlocked_disk_reads;
    const Tokens sibling = branch(4, k.sibling_shares, k.sibling_shares + 12);

    LayerReadLatch latch;
    std::atomic<bool> done{false};
    RadixIndex::Match m;
    std::thread reader([&] {
      const bool installed = latch.install();
      latch.set_listener_ready();
      if (installed) {
        if (k.prefetch)
          index.prefetch(7, a);
        else
          m = index.match(7, a);
      }
      done = true;
    });
    ASSERT_TRUE(latch.wait_listener());
    if (!latch.installed()) {
      reader.join();
      GTEST_SKIP() << "seccomp user notification is not available here";
    }
    bool inserted_during_read = false;
    std::future<void> split;
    const bool held = latch.supervise(done, [&] {
      // The sibling's insert needs the lock: it finishes only if the read let go of it.
      split = std::async(std::launch::async, [&] { index.insert(7, sibling, maker(sibling)); });
      inserted_during_read = split.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
    });
    reader.join();
    if (split.valid()) split.get();
    ASSERT_TRUE(held) << "no layer was read";
    ASSERT_TRUE(inserted_during_read) << "the layers were read under the index's lock";

    EXPECT_EQ(index.stats().unlocked_disk_reads - unlocked_before, k.adopted);
    if (!k.prefetch) {
      EXPECT_EQ(m.length, 40);
      expect_true_kv(index, m, a);  // nothing was inserted since: its pieces still hold
    }
    const auto lk = index.lock();
    const RadixIndex::Match again = index.match(7, a);
    EXPECT_EQ(again.length, 40);
    EXPECT_EQ(again.tokens_from[static_cast<int>(Tier::Hot)], k.hot_found);
    EXPECT_EQ(again.tokens_from[static_cast<int>(Tier::Disk)], k.disk_found);
    EXPECT_EQ(again.pieces.size(), 4u) << "a's three nodes, one of them split";
    expect_true_kv(index, again, a);
    const RadixIndex::Match s = index.match(7, sibling);
    EXPECT_EQ(s.length, static_cast<int64_t>(sibling.size()));
    expect_true_kv(index, s, sibling);
    index.check_invariants();
    EXPECT_EQ(index.stats().dropped_bad, 0);
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// The remote tier, against a real redis-server.
RedisOptions redis_at(int port, int retry_after_ms = 2000) {
  RedisOptions o;
  o.port = port;
  o.retry_after_ms = retry_after_ms;
  return o;
}

// Two indexes, as two processes would have, each with its own connection.
struct TwoIndexes {
  explicit TwoIndexes(int port, int retry_after_ms = 2000)
      : store_a(redis_at(port, retry_after_ms)),
        store_b(redis_at(port, retry_after_ms)),
        a(1000 * token_bytes()),
        b(1000 * token_bytes()) {
    a.attach_remote(store_a, 8);
    b.attach_remote(store_b, 8);
  }
  RedisStore store_a, store_b;
  RadixIndex a, b;
};

TEST(RemoteTier, TwoIndexesShareSpansThroughRedis) {
  DEPCACHE_REQUIRE_REDIS(redis);
  TwoIndexes two(redis.port());
  RadixIndex &a = two.a, &b = two.b;
  const Tokens s1 = sequence(1, 30, 10), s2 = sequence(2, 27, 10);
  a.insert(5, s1, maker(s1));
  a.insert(5, s2, maker(s2));
  a.flush_remote();                              // publishing runs on a thread of its own
  EXPECT_EQ(a.stats().remote_published, 4 + 3);  // 30 -> blocks 0..3; 27 -> blocks 1..3 are new
  // The other process (index) has nothing locally and finds everything remotely.
  const RadixIndex::Match m = b.match(5, s1);
  EXPECT_EQ(m.length, 30);
  EXPECT_EQ(m.tokens_from[static_cast<int>(Tier::Remote)], 30);
  expect_true_kv(b, m, s1);
  // A partial local match is extended from the block it ends in.
  const RadixIndex::Match m2 = b.match(5, s2);
  EXPECT_EQ(m2.length, 27);
  EXPECT_EQ(m2.tokens_from[static_cast<int>(Tier::Hot)], 10);
  expect_true_kv(b, m2, s2);
  EXPECT_EQ(b.match(6, s1).length, 0);  // namespaces stay apart remotely too
  b.check_invariants();
}

TEST(RemoteTier, RedisStoppedMidRunDegradesAndRecovers) {
  DEPCACHE_REQUIRE_REDIS(redis);
  const size_t tb = token_bytes();
  TwoIndexes two(redis.port(), 50);
  RadixIndex &a = two.a, &b = two.b;
  RedisStore &store_a = two.store_a, &store_b = two.store_b;
  const Tokens s1 = sequence(1, 20), s2 = sequence(2, 20);
  a.insert(1, s1, maker(s1));
  a.flush_remote();
  redis.stop();
  a.insert(1, s2, maker(s2));  // publishing fails quietly
  RadixIndex::Match m;
  ASSERT_NO_THROW(m = b.match(1, s1));
  EXPECT_EQ(m.length, 0);  // computed locally instead
  EXPECT_GT(store_a.n_failures() + store_b.n_failures(), 0);
  EXPECT_FALSE(store_b.last_error().empty());
  b.insert(1, s1, maker(s1));
  EXPECT_EQ(b.match(1, s1).length, 20);  // the local cache still works
  redis.start();                         // back (empty: no persistence)
  usleep(100000);                        // past the retry delay
  const Tokens s3 = sequence(3, 20);
  a.insert(1, s3, maker(s3));
  a.flush_remote();
  RadixIndex c(1000 * tb);
  RedisStore store_c(redis_at(redis.port()));
  c.attach_remote(store_c, 8);
  const RadixIndex::Match m3 = c.match(1, s3);
  EXPECT_EQ(m3.length, 20);
  expect_true_kv(c, m3, s3);
}

TEST(RemoteTier, SlowRedisTimesOutToAMiss) {
  // A server that accepts connections and never answers.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  RedisOptions o = redis_at(ntohs(addr.sin_port));
  o.timeout_ms = 100;
  RedisStore store(o);
  RadixIndex index(1 << 20);
  index.attach_remote(store, 8);
  const Tokens s = sequence(1, 20);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(index.match(1, s).length, 0);
  index.insert(1, s, maker(s));
  EXPECT_EQ(index.match(1, s).length, 20);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_GT(store.n_failures(), 0);
  ::close(fd);
}

TEST(RemoteTier, CorruptRecordIsDroppedNeverServed) {
  DEPCACHE_REQUIRE_REDIS(redis);
  TwoIndexes two(redis.port());
  RadixIndex &a = two.a, &b = two.b;
  RedisStore& store_a = two.store_a;
  const Tokens s = sequence(1, 24);
  a.insert(2, s, maker(s));
  a.flush_remote();
  // Damage the second block's record in place.
  const uint64_t key = span_content_key(2, std::span<const int32_t>(s).first(16));
  std::vector<uint8_t> record = *store_a.get(key);
  record[record.size() - 3] ^= 0x40;
  store_a.remove(key);
  store_a.put(key, record);
  const RadixIndex::Match m = b.match(2, s);
  EXPECT_EQ(m.length, 8);  // the first block only
  expect_true_kv(b, m, s);
  EXPECT_EQ(b.stats().dropped_bad, 1);
  EXPECT_FALSE(store_a.get(key).has_value());  // and it is gone for everyone
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

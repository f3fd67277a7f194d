// KnowledgeGraph: interning, dedup, adjacency, the binary file and text loaders.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "retrieval/knowledge_graph.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

std::vector<std::string> strings(std::span<const std::string> s) { return {s.begin(), s.end()}; }

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::filesystem::path& p, const std::string& data) {
  std::ofstream(p, std::ios::binary) << data;
}

// The error a call throws, or a failure if it throws none.
template <typename Fn>
Error error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no depcache::Error thrown";
  return Error(ErrorKind::Internal, "");
}

// A small graph: a cycle a->b->c->a, a self loop, a duplicate and aliases.
KnowledgeGraph small_graph() {
  KnowledgeGraph g;
  g.add_triple("a", "r1", "b");
  g.add_triple("b", "r1", "c");
  g.add_triple("c", "r2", "a");
  g.add_triple("a", "r2", "c");
  g.add_triple("a", "r1", "b");  // duplicate
  g.add_triple("a", "r0", "c");
  g.add_triple("d", "same", "d");  // self loop
  g.add_entity("lonely");
  g.set_label(*g.find_entity("a"), "Alpha");
  g.add_alias(*g.find_entity("a"), "first letter");
  g.add_alias(*g.find_entity("a"), "first letter");  // duplicate alias
  g.add_alias(*g.find_entity("a"), "Alpha");         // equal to the label
  g.add_alias(*g.find_entity("b"), "beta");
  g.finalize();
  return g;
}

TEST(KnowledgeGraph, InternsNamesAndRelations) {
  KnowledgeGraph g;
  const EntityId a = g.add_entity("a");
  EXPECT_EQ(g.add_entity("b"), a + 1);
  EXPECT_EQ(g.add_entity("a"), a);
  const RelationId r = g.add_relation("likes");
  EXPECT_EQ(g.add_relation("likes"), r);
  EXPECT_EQ(g.n_entities(), 2u);
  EXPECT_EQ(g.n_relations(), 1u);
  EXPECT_EQ(g.entity_name(a), "a");
  EXPECT_EQ(g.relation_name(r), "likes");
  EXPECT_EQ(g.find_entity("b"), a + 1);
  EXPECT_FALSE(g.find_entity("c").has_value());
  EXPECT_EQ(g.find_relation("likes"), r);
  EXPECT_FALSE(g.find_relation("hates").has_value());
  EXPECT_EQ(error_of([&] { g.add_entity(""); }).kind(), ErrorKind::InvalidInput);
}

TEST(KnowledgeGraph, DedupsAndBuildsAdjacencyBothWays) {
  const KnowledgeGraph g = small_graph();
  EXPECT_EQ(g.n_entities(), 5u);
  EXPECT_EQ(g.n_relations(), 4u);
  EXPECT_EQ(g.n_triples(), 6u) << "the duplicate a-r1-b is dropped";
  const EntityId a = *g.find_entity("a"), b = *g.find_entity("b"), c = *g.find_entity("c");
  const RelationId r0 = *g.find_relation("r0"), r1 = *g.find_relation("r1"), r2 = *g.find_relation("r2");

  // Out edges of a: sorted by (relation, target); r1 < r2 < r0 by id.
  const auto out_a = g.out_edges(a);
  ASSERT_EQ(out_a.size(), 3u);
  EXPECT_EQ(out_a[0].relation, r1);
  EXPECT_EQ(out_a[0].target, b);
  EXPECT_EQ(out_a[1].relation, r2);
  EXPECT_EQ(out_a[1].target, c);
  EXPECT_EQ(out_a[2].relation, r0);
  EXPECT_EQ(out_a[2].target, c);

  // In edges of c: from b (r1) and from a (r2, r0).
  const auto in_c = g.in_edges(c);
  ASSERT_EQ(in_c.size(), 3u);
  EXPECT_EQ(in_c[0].relation, r1);
  EXPECT_EQ(in_c[0].target, b);
  EXPECT_EQ(in_c[1].relation, r2);
  EXPECT_EQ(in_c[1].target, a);
  EXPECT_EQ(in_c[2].relation, r0);
  EXPECT_EQ(in_c[2].target, a);
  ASSERT_EQ(g.in_edges(a).size(), 1u);
  EXPECT_EQ(g.in_edges(a)[0].target, c);

  // Every triple appears once in each direction.
  size_t n_out = 0, n_in = 0;
  for (EntityId e = 0; e < g.n_entities(); ++e) {
    n_out += g.out_edges(e).size();
    n_in += g.in_edges(e).size();
  }
  EXPECT_EQ(n_out, g.n_triples());
  EXPECT_EQ(n_in, g.n_triples());
  EXPECT_TRUE(g.out_edges(*g.find_entity("lonely")).empty());
  EXPECT_TRUE(g.in_edges(*g.find_entity("lonely")).empty());
}

TEST(KnowledgeGraph, SelfLoopIsKeptInBothDirections) {
  const KnowledgeGraph g = small_graph();
  const EntityId d = *g.find_entity("d");
  ASSERT_EQ(g.out_edges(d).size(), 1u);
  ASSERT_EQ(g.in_edges(d).size(), 1u);
  EXPECT_EQ(g.out_edges(d)[0].target, d);
  EXPECT_EQ(g.in_edges(d)[0].target, d);
}

TEST(KnowledgeGraph, LabelsAndAliases) {
  const KnowledgeGraph g = small_graph();
  const EntityId a = *g.find_entity("a"), b = *g.find_entity("b");
  EXPECT_EQ(g.entity_label(a), "Alpha");
  EXPECT_EQ(g.entity_label(b), "b") << "the label defaults to the name";
  EXPECT_EQ(strings(g.aliases(a)), std::vector<std::string>{"first letter"});
  EXPECT_EQ(strings(g.aliases(b)), std::vector<std::string>{"beta"});
  EXPECT_TRUE(g.aliases(*g.find_entity("c")).empty());
  EXPECT_EQ(g.n_aliases(), 2u);

  KnowledgeGraph h;
  const EntityId x = h.add_entity("x");
  h.add_alias(x, "ex");
  h.set_label(x, "ex");  // the new label leaves the alias list
  EXPECT_EQ(h.entity_label(x), "ex");
  EXPECT_TRUE(h.aliases(x).empty());
  EXPECT_EQ(h.n_aliases(), 0u);
}

TEST(KnowledgeGraph, AdjacencyNeedsFinalize) {
  KnowledgeGraph g;
  g.add_triple("a", "r", "b");
  EXPECT_FALSE(g.finalized());
  EXPECT_EQ(error_of([&] { g.out_edges(0); }).kind(), ErrorKind::Internal);
  EXPECT_EQ(error_of([&] { g.in_edges(0); }).kind(), ErrorKind::Internal);
  g.finalize();
  EXPECT_TRUE(g.finalized());
  EXPECT_EQ(g.out_edges(0).size(), 1u);
  g.add_triple("b", "r", "c");  // building again invalidates the adjacency
  EXPECT_FALSE(g.finalized());
  g.finalize();
  EXPECT_EQ(g.out_edges(1).size(), 1u);
  EXPECT_EQ(g.in_edges(2).size(), 1u);
}

void expect_same(const KnowledgeGraph& a, const KnowledgeGraph& b) {
  ASSERT_EQ(a.n_entities(), b.n_entities());
  ASSERT_EQ(a.n_relations(), b.n_relations());
  ASSERT_EQ(a.n_triples(), b.n_triples());
  EXPECT_EQ(a.n_aliases(), b.n_aliases());
  for (EntityId e = 0; e < a.n_entities(); ++e) {
    EXPECT_EQ(a.entity_name(e), b.entity_name(e));
    EXPECT_EQ(a.entity_label(e), b.entity_label(e));
    EXPECT_EQ(strings(a.aliases(e)), strings(b.aliases(e)));
    ASSERT_EQ(a.out_edges(e).size(), b.out_edges(e).size());
    ASSERT_EQ(a.in_edges(e).size(), b.in_edges(e).size());
    for (size_t i = 0; i < a.out_edges(e).size(); ++i) {
      EXPECT_EQ(a.out_edges(e)[i].relation, b.out_edges(e)[i].relation);
      EXPECT_EQ(a.out_edges(e)[i].target, b.out_edges(e)[i].target);
    }
  }
  for (RelationId r = 0; r < a.n_relations(); ++r) EXPECT_EQ(a.relation_name(r), b.relation_name(r));
}

class KgFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = test::temp_path("kg") += ".dkg";
    small_graph().save(path_);
    bytes_ = read_bytes(path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::filesystem::path path_;
  std::string bytes_;
};

TEST_F(KgFile, RoundTrip) {
  EXPECT_EQ(bytes_.substr(0, 4), "DKG1");
  EXPECT_FALSE(std::filesystem::exists(path_.string() + ".partial")) << "the temporary file is renamed away";
  const KnowledgeGraph g = KnowledgeGraph::load(path_);
  EXPECT_TRUE(g.finalized());
  expect_same(small_graph(), g);
}

TEST_F(KgFile, EveryTruncationIsRejected) {
  const auto cut = test::temp_path("kg-cut");
  for (size_t n = 0; n < bytes_.size(); ++n) {
    write_bytes(cut, bytes_.substr(0, n));
    const Error e = error_of([&] { KnowledgeGraph::load(cut); });
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << n << " bytes: " << e.what();
    EXPECT_NE(std::string(e.what()).find(cut.string()), std::string::npos) << e.what();
  }
  write_bytes(cut, bytes_.substr(0, bytes_.size() - 1));
  EXPECT_NE(std::string(error_of([&] { KnowledgeGraph::load(cut); }).what()).find("truncated"),
            std::string::npos);
  write_bytes(cut, bytes_ + "x");
  EXPECT_EQ(error_of([&] { KnowledgeGraph::load(cut); }).kind(), ErrorKind::InvalidInput);
  std::filesystem::remove(cut);
}

TEST_F(KgFile, EveryFlippedByteIsRejected) {
  const auto bad = test::temp_path("kg-flip");
  for (size_t i = 0; i < bytes_.size(); ++i) {
    std::string copy = bytes_;
    copy[i] = static_cast<char>(copy[i] ^ 0x41);
    write_bytes(bad, copy);
    const Error e = error_of([&] { KnowledgeGraph::load(bad); });
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << "byte " << i << ": " << e.what();
  }
  std::string copy = bytes_;
  copy[bytes_.size() - 3] ^= 1;  // inside a triple
  write_bytes(bad, copy);
  EXPECT_NE(std::string(error_of([&] { KnowledgeGraph::load(bad); }).what()).find("checksum"),
            std::string::npos);
  copy = bytes_;
  copy[4] = 9;  // version
  write_bytes(bad, copy);
  EXPECT_NE(std::string(error_of([&] { KnowledgeGraph::load(bad); }).what()).find("version 9"),
            std::string::npos);
  std::filesystem::remove(bad);
}

// Recomputes the checksum (XXH3-64 of bytes 16.., stored at 8) after a
// deliberate edit, so the structural checks behind the checksum are reached.
void reseal(std::string& b) {
  const uint64_t h = XXH3_64bits(b.data() + 16, b.size() - 16);
  std::memcpy(b.data() + 8, &h, 8);
}

TEST_F(KgFile, CraftedFilesWithValidChecksumsAreRejected) {
  const auto bad = test::temp_path("kg-crafted");
  const auto expect_error = [&](std::string bytes, const std::string& what) {
    reseal(bytes);
    write_bytes(bad, bytes);
    const Error e = error_of([&] { KnowledgeGraph::load(bad); });
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  };
  const auto with_u64 = [&](size_t off, uint64_t v) {
    std::string b = bytes_;
    std::memcpy(b.data() + off, &v, 8);
    return b;
  };
  // Counts far beyond the file size fail before any allocation.
  expect_error(with_u64(24, uint64_t{1} << 40), "entities do not fit");
  expect_error(with_u64(40, uint64_t{1} << 62), "triples do not fit");
  expect_error(with_u64(32, ~uint64_t{0}), "relations do not fit");
  expect_error(with_u64(48, 3), "aliases");
  // A string length running past the end.
  std::string b = bytes_;
  const uint32_t huge = 0xFFFFFFF0u;
  std::memcpy(b.data() + 56, &huge, 4);
  expect_error(b, "runs past the end");
  // An id out of range in the last triple (its tail).
  b = bytes_;
  const uint32_t id = 999;
  std::memcpy(b.data() + b.size() - 4, &id, 4);
  expect_error(b, "out of range");

  // Whatever single byte changes, load either succeeds or throws depcache::Error.
  for (size_t i = 16; i < bytes_.size(); ++i) {
    for (const int mask : {0x01, 0x80, 0xFF}) {
      b = bytes_;
      b[i] = static_cast<char>(b[i] ^ mask);
      reseal(b);
      write_bytes(bad, b);
      try {
        KnowledgeGraph::load(bad);
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << "byte " << i << ": " << e.what();
      }
    }
  }
  std::filesystem::remove(bad);
}

TEST_F(KgFile, ForeignAndMissingFiles) {
  const auto foreign = test::temp_path("kg-foreign");
  write_bytes(foreign, "GGUF\x03\x00\x00\x00 certainly not a knowledge graph");
  const Error e = error_of([&] { KnowledgeGraph::load(foreign); });
  EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
  EXPECT_NE(std::string(e.what()).find("not a depcache KG file"), std::string::npos) << e.what();
  std::filesystem::remove(foreign);

  const Error missing = error_of([] { KnowledgeGraph::load("/nonexistent/graph.dkg"); });
  EXPECT_EQ(missing.kind(), ErrorKind::NotFound);
  EXPECT_NE(std::string(missing.what()).find("/nonexistent/graph.dkg"), std::string::npos);
}

TEST(KnowledgeGraph, SaveIntoMissingDirectoryFails) {
  const Error e = error_of([] { small_graph().save("/nonexistent-dir/g.dkg"); });
  EXPECT_EQ(e.kind(), ErrorKind::NotFound) << e.what();
}

// load_triples on a temporary file with the given extension.
class Triples : public ::testing::Test {
 protected:
  KnowledgeGraph load(const std::string& ext, const std::string& text,
                      TripleFormat format = TripleFormat::Auto) {
    write(ext, text);
    return load_triples(path_, format);
  }
  // The message of the error loading the text throws (InvalidInput expected).
  std::string error(const std::string& ext, const std::string& text) {
    write(ext, text);
    const Error e = error_of([&] { load_triples(path_); });
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << e.what();
    return e.what();
  }
  void write(const std::string& ext, const std::string& text) {
    std::filesystem::remove(path_);
    path_ = test::temp_path("triples") += ext;
    write_bytes(path_, text);
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::filesystem::path path_;
};

TEST_F(Triples, Tsv) {
  const KnowledgeGraph g = load(".tsv",
                                "# a comment\n"
                                "Paris\tcapital of\tFrance\n"
                                "\n"
                                "Paris\t@alias\tCity of Light\r\n"
                                "France\tmember of\tEU\n"
                                "Paris\tcapital of\tFrance\n");
  EXPECT_TRUE(g.finalized());
  EXPECT_EQ(g.n_entities(), 3u);
  EXPECT_EQ(g.n_triples(), 2u);
  EXPECT_FALSE(g.find_relation("@alias").has_value());
  EXPECT_EQ(strings(g.aliases(*g.find_entity("Paris"))), std::vector<std::string>{"City of Light"});
}

TEST_F(Triples, TsvErrorsNameFileAndLine) {
  std::string msg = error(".tsv", "a\tr\tb\n\na\tr\n");
  EXPECT_NE(msg.find(path_.string() + ":3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("found 2"), std::string::npos) << msg;
  msg = error(".tsv", "a\tr\tb\na\t\tb\n");
  EXPECT_NE(msg.find(":2: empty relation"), std::string::npos) << msg;
  msg = error(".tsv", "a\tr\tb\tc\n");
  EXPECT_NE(msg.find(":1:"), std::string::npos) << msg;
}

TEST_F(Triples, CsvWithQuotesAndHeader) {
  const KnowledgeGraph g = load(".csv",
                                "head,relation,tail\n"
                                "\"Washington, D.C.\",capital of,United States\n"
                                "\"The \"\"Big\"\" Apple\",located in,\"New York\"\r\n"
                                "\n"
                                "Washington,@alias,\"Washington, D.C.\"\n"
                                "\"multi\nline\",r,x\n"
                                "y,r,z");
  EXPECT_EQ(g.n_triples(), 4u);
  EXPECT_FALSE(g.find_entity("head").has_value()) << "the header row is skipped";
  ASSERT_TRUE(g.find_entity("Washington, D.C.").has_value());
  ASSERT_TRUE(g.find_entity("The \"Big\" Apple").has_value());
  EXPECT_TRUE(g.find_entity("New York").has_value());
  EXPECT_TRUE(g.find_entity("multi\nline").has_value());
  EXPECT_EQ(strings(g.aliases(*g.find_entity("Washington"))), std::vector<std::string>{"Washington, D.C."});
  EXPECT_EQ(g.out_edges(*g.find_entity("Washington, D.C.")).size(), 1u);
}

TEST_F(Triples, CsvErrors) {
  std::string msg = error(".csv", "a,r,b\n\"unterminated,r,b\n");
  EXPECT_NE(msg.find(":2: unterminated"), std::string::npos) << msg;
  msg = error(".csv", "a,r,b\na,r\n");
  EXPECT_NE(msg.find(":2:"), std::string::npos) << msg;
  msg = error(".csv", "a,r,b\n\"a\"x,r,b\n");
  EXPECT_NE(msg.find(":2:"), std::string::npos) << msg;
  msg = error(".csv", "\"two\nlines\",r,b\na,,b\n");
  EXPECT_NE(msg.find(":3: empty relation"), std::string::npos) << msg;
}

TEST_F(Triples, Jsonl) {
  const KnowledgeGraph g =
      load(".jsonl", R"({"head": "Q90", "relation": "capital of", "tail": "Q142"})"
                     "\n\n"
                     R"({"entity": "Q90", "label": "Paris", "aliases": ["City of Light", "Paname"]})"
                     "\n"
                     R"({"entity": "Q142", "label": "France"})"
                     "\n"
                     R"({"head": "Q90", "relation": "@alias", "tail": "Lutetia"})"
                     "\n");
  EXPECT_EQ(g.n_triples(), 1u);
  const EntityId paris = *g.find_entity("Q90");
  EXPECT_EQ(g.entity_label(paris), "Paris");
  EXPECT_EQ(g.entity_label(*g.find_entity("Q142")), "France");
  EXPECT_EQ(strings(g.aliases(paris)), (std::vector<std::string>{"City of Light", "Paname", "Lutetia"}));
}

TEST_F(Triples, JsonlErrors) {
  const std::string ok = R"({"head": "a", "relation": "r", "tail": "b"})"
                         "\n";
  std::string msg = error(".jsonl", ok + "{not json\n");
  EXPECT_NE(msg.find(":2: invalid JSON"), std::string::npos) << msg;
  msg = error(".jsonl", ok + R"({"head": "a", "relation": "r"})");
  EXPECT_NE(msg.find(":2: missing key \"tail\""), std::string::npos) << msg;
  msg = error(".jsonl", ok + R"({"head": "a", "relation": 7, "tail": "b"})");
  EXPECT_NE(msg.find(":2: \"relation\" must be a string"), std::string::npos) << msg;
  msg = error(".jsonl", ok + R"({"entity": "a", "aliases": "x"})");
  EXPECT_NE(msg.find(":2:"), std::string::npos) << msg;
  msg = error(".jsonl", ok + "[1, 2]\n");
  EXPECT_NE(msg.find(":2: expected a JSON object"), std::string::npos) << msg;
  msg = error(".jsonl", ok + R"({"name": "a"})");
  EXPECT_NE(msg.find(":2:"), std::string::npos) << msg;
}

TEST_F(Triples, EmptyFileAndFormats) {
  EXPECT_NE(error(".tsv", "").find("no triples"), std::string::npos);
  EXPECT_NE(error(".tsv", "# only a comment\n\n").find("no triples"), std::string::npos);
  EXPECT_NE(error(".csv", "head,relation,tail\n").find("no triples"), std::string::npos);
  EXPECT_NE(error(".tsv", "a\t@alias\tb\n").find("no triples"), std::string::npos);
  EXPECT_NE(error(".xml", "a\tr\tb\n").find("extension"), std::string::npos);
  // An explicit format overrides the extension.
  EXPECT_EQ(load(".xml", "a,r,b\n", TripleFormat::Csv).n_triples(), 1u);
  const Error missing = error_of([] { load_triples("/nonexistent/triples.tsv"); });
  EXPECT_EQ(missing.kind(), ErrorKind::NotFound);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

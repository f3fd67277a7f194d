// The readers of KG and request files also read from memory (what the fuzz
// targets call): the same checks and results as from a file, errors named
// after the source given.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "retrieval/knowledge_graph.h"
#include "retrieval/rag_request.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::slurp;

TEST(KnowledgeGraphParse, BytesLoadAsTheFileDoes) {
  KnowledgeGraph g;
  g.add_triple("kettle", "made_of", "copper");
  g.add_triple("copper", "mined_in", "cornwall");
  g.add_alias(*g.find_entity("copper"), "Cu");
  g.finalize();
  const std::filesystem::path path = test::temp_path("kg_parse") += ".dkg";
  g.save(path);
  const std::string bytes = slurp(path);
  std::filesystem::remove(path);

  const KnowledgeGraph back = KnowledgeGraph::parse(bytes, "memory.dkg");
  EXPECT_EQ(back.n_entities(), 3u);
  EXPECT_EQ(back.n_triples(), 2u);
  EXPECT_EQ(back.n_aliases(), 1u);
  EXPECT_EQ(back.find_entity("cornwall"), g.find_entity("cornwall"));

  std::string damaged = bytes;
  damaged.back() ^= 1;
  try {
    KnowledgeGraph::parse(damaged, "memory.dkg");
    FAIL() << "a damaged KG file was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("memory.dkg: corrupt KG file: checksum mismatch"), std::string::npos)
        << e.what();
  }
}

TEST(ReadRequestsStream, LinesOfAStreamAsOfAFile) {
  std::istringstream in(
      "{\"question\": \"What is the kettle made of?\", \"documents\": [{\"id\": \"d\", \"text\": "
      "\"Copper.\"}]}\n"
      "\n"
      "{\"id\": \"t\", \"text\": \"a plain prompt\"}\n");
  const std::vector<RagRequest> requests = read_requests(in, "memory.jsonl");
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].id, "0");
  EXPECT_EQ(requests[0].documents.size(), 1u);
  EXPECT_EQ(requests[1].id, "t");
  EXPECT_EQ(requests[1].text, "a plain prompt");

  std::istringstream bad("{\"question\": \"q\"}\n{\"question\": 3}\n");
  try {
    read_requests(bad, "memory.jsonl");
    FAIL() << "a bad request line was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("memory.jsonl:2"), std::string::npos) << e.what();
  }
  std::istringstream empty("\n  \n");
  EXPECT_THROW(read_requests(empty, "memory.jsonl"), Error);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

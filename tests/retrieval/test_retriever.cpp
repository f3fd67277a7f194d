#include <fmt/format.h>
#include <gtest/gtest.h>

#include "model/vocab.h"
#include "retrieval/retriever.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

KnowledgeGraph graph() {
  KnowledgeGraph kg;
  kg.add_triple("Titanic", "directed by", "James Cameron");
  kg.add_triple("James Cameron", "born in", "Kapuskasing");
  kg.add_triple("Titanic", "type", "Tragedy");
  kg.add_triple("Titanic", "released in", "1997");
  kg.add_triple("Avatar", "directed by", "James Cameron");
  kg.finalize();
  return kg;
}

TEST(GraphRetriever, LinksTheQuestionsEntitiesAndKeepsTheirMostRelevantPaths) {
  const KnowledgeGraph kg = graph();
  const GraphRetriever retriever(kg);
  GraphRetrieveOptions o;
  o.top_k = 2;
  const std::vector<RequestEntity> got = retriever.retrieve("Where was the director of Titanic born?", o);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].name, "Titanic");
  ASSERT_EQ(got[0].paths.size(), 2u);
  // The two-hop path through the director mentions both "director"-ish and "born".
  EXPECT_NE(got[0].paths[0].find("Kapuskasing"), std::string::npos) << got[0].paths[0];
  // The same as retrieving that entity's paths directly.
  const Bm25Scorer scorer;
  const EntityPaths direct = retrieve_entity_paths(
      kg, kg.find_entity("Titanic").value(), "Where was the director of Titanic born?", scorer, o.limits, 2);
  EXPECT_EQ(got[0].paths, direct.kept_text);
  EXPECT_EQ(direct.candidates.paths.size(), 3u);  // whole paths: director's birthplace, type, year

  o.max_entities = 1;
  EXPECT_EQ(retriever.retrieve("Titanic and Avatar", o).size(), 1u);
  o.max_entities = 10;
  EXPECT_EQ(retriever.retrieve("Titanic and Avatar", o).size(), 2u);
}

TEST(GraphRetriever, AQuestionWithoutEntitiesIsNotFound) {
  const KnowledgeGraph kg = graph();
  const GraphRetriever retriever(kg);
  try {
    retriever.retrieve("zzz qqq", {});
    FAIL() << "expected NotFound";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
  }
}

TEST(RetrieveDocuments, TopChunksWithStableIds) {
  Corpus c;
  c.docs.push_back({"a", "Volcano", "Mount Etna is an active volcano on the island of Sicily."});
  c.docs.push_back({"b", "Glacier", "The Aletsch Glacier is the largest glacier in the Alps."});
  c.docs.push_back({"c", "Desert", "The Atacama is a desert plateau in South America, very dry."});
  const ChunkIndex idx =
      ChunkIndex::build(c, Tokenizer(Vocab::builtin_bytes()), {.chunk_tokens = 12, .overlap = 4});
  const auto docs = retrieve_documents(idx, "Which glacier is the largest in the Alps?", 2);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_TRUE(docs[0].id.starts_with("b#")) << docs[0].id;
  const auto hits = idx.search("Which glacier is the largest in the Alps?", 2);
  EXPECT_EQ(docs[0].id, fmt::format("b#{}", idx.chunk(hits[0].chunk).index_in_doc));
  EXPECT_EQ(docs[0].text, idx.chunk(hits[0].chunk).text);
  EXPECT_EQ(retrieve_documents(idx, "Which glacier is the largest in the Alps?", 2)[1].id, docs[1].id);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

// Entity linking: exact label and alias n-grams (longest first), salience
// order for ambiguous names, BM25 fallback, resolve().
#include <gtest/gtest.h>

#include "retrieval/entity_linker.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

KnowledgeGraph graph() {
  KnowledgeGraph kg;
  kg.add_triple("Titanic", "directed by", "James Cameron");
  kg.add_triple("Titanic", "type", "Tragedy");
  kg.add_triple("New York", "in", "USA");
  kg.add_triple("York", "in", "England");
  kg.add_triple("The Comedy of Errors", "written by", "Shakespeare");
  // Two senses labelled "bank"; the river bank has more edges.
  const EntityId money = kg.add_entity("bank.n.02");
  const EntityId river = kg.add_entity("bank.n.01");
  kg.set_label(money, "bank");
  kg.set_label(river, "bank");
  kg.add_triple("bank.n.01", "part of", "river");
  kg.add_triple("bank.n.01", "near", "water");
  kg.add_triple("bank.n.02", "holds", "money");
  kg.add_entity("Loner");                                      // no edges: never linked
  kg.add_alias(kg.find_entity("Tragedy").value(), "kind of");  // WordNet has such aliases
  kg.add_alias(kg.find_entity("James Cameron").value(), "Jim Cameron");
  kg.finalize();
  return kg;
}

std::vector<std::string> names(const KnowledgeGraph& kg, const std::vector<LinkedEntity>& l) {
  std::vector<std::string> out;
  for (const auto& e : l) out.emplace_back(kg.entity_name(e.entity));
  return out;
}

TEST(EntityLinker, ExactLabelsLongestFirst) {
  const KnowledgeGraph kg = graph();
  const EntityLinker linker(kg);
  LinkOptions opt;
  opt.bm25_fallback = false;
  // "new york" wins over "york": a word belongs to one mention.
  EXPECT_EQ(names(kg, linker.link("Who directed Titanic, filmed in New York?", opt)),
            (std::vector<std::string>{"New York", "Titanic"}));
  const auto linked = linker.link("titanic", opt);
  ASSERT_EQ(linked.size(), 1u);
  EXPECT_EQ(linked[0].how, LinkKind::Label);
  EXPECT_EQ(linked[0].mention, "titanic");
}

TEST(EntityLinker, AliasesAndAmbiguousNames) {
  const KnowledgeGraph kg = graph();
  const EntityLinker linker(kg);
  LinkOptions opt;
  opt.bm25_fallback = false;
  const auto jim = linker.link("films by jim cameron", opt);
  ASSERT_EQ(jim.size(), 1u);
  EXPECT_EQ(kg.entity_name(jim[0].entity), "James Cameron");
  EXPECT_EQ(jim[0].how, LinkKind::Alias);
  // Both senses, the better connected one first; capped per mention.
  EXPECT_EQ(names(kg, linker.link("the bank", opt)), (std::vector<std::string>{"bank.n.01", "bank.n.02"}));
  opt.max_per_mention = 1;
  EXPECT_EQ(names(kg, linker.link("the bank", opt)), (std::vector<std::string>{"bank.n.01"}));
  // The unique name is an alias too.
  EXPECT_EQ(names(kg, linker.link("bank.n.02", opt)), (std::vector<std::string>{"bank.n.02"}));
}

TEST(EntityLinker, Bm25FallbackAndLimits) {
  const KnowledgeGraph kg = graph();
  const EntityLinker linker(kg);
  LinkOptions opt;
  opt.max_entities = 1;
  const auto l = linker.link("errors comedy", opt);  // not a label as written
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(kg.entity_name(l[0].entity), "The Comedy of Errors");
  EXPECT_EQ(l[0].how, LinkKind::Bm25);
  EXPECT_TRUE(linker.link("", opt).empty());
  EXPECT_TRUE(linker.link("zzz qqq", opt).empty());
  EXPECT_TRUE(linker.link("loner", opt).empty());
  LinkOptions exact;
  exact.bm25_fallback = false;
  EXPECT_TRUE(linker.link("a kind of film", exact).empty());  // a mention never ends in a function word
  opt.max_entities = 2;
  EXPECT_LE(linker.link("Titanic New York England USA", opt).size(), 2u);
}

TEST(EntityLinker, Resolve) {
  const KnowledgeGraph kg = graph();
  const EntityLinker linker(kg);
  EXPECT_EQ(linker.resolve("Titanic"), kg.find_entity("Titanic").value());
  EXPECT_EQ(linker.resolve("titanic"), kg.find_entity("Titanic").value());
  EXPECT_EQ(linker.resolve("bank"), kg.find_entity("bank.n.01").value());
  try {
    linker.resolve("no such thing here");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_NE(std::string(e.what()).find("no such thing here"), std::string::npos);
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

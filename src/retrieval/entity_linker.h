#pragma once
// Finds the KG entities a question mentions: exact matches of word n-grams
// against normalised labels, names and aliases (longest mention first), then
// a BM25 search over entity names when exact matching finds too few.
// Entities without edges are never linked: they would add no context.
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "retrieval/bm25.h"
#include "retrieval/knowledge_graph.h"

namespace depcache {

enum class LinkKind { Label, Alias, Bm25 };

struct LinkedEntity {
  EntityId entity = 0;
  LinkKind how = LinkKind::Label;
  double score = 0;     // higher is better; exact matches always outrank BM25
  std::string mention;  // the normalised words that matched
};

struct LinkOptions {
  size_t max_entities = 10;
  size_t max_per_mention = 3;  // one name can denote many entities (word senses)
  size_t max_ngram = 6;        // longest mention tried, in words
  bool bm25_fallback = true;
};

class EntityLinker {
 public:
  // The graph must outlive the linker.
  explicit EntityLinker(const KnowledgeGraph& kg);

  std::vector<LinkedEntity> link(std::string_view question, const LinkOptions& options = {}) const;

  // An entity named exactly `name` (unique key), else the best link of `name`
  // as a question; NotFound error naming it when nothing matches.
  EntityId resolve(std::string_view name) const;

 private:
  const KnowledgeGraph& kg_;
  // Normalised text -> entities, best candidates first (more edges first).
  std::unordered_map<std::string, std::vector<EntityId>> by_label_;
  std::unordered_map<std::string, std::vector<EntityId>> by_alias_;
  Bm25Index names_;  // document i = entity i's label and aliases (not its unique key)
};

}  // namespace depcache

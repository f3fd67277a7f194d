#pragma once
// Builds a KnowledgeGraph from the WordNet 3.0 database files (Debian package
// wordnet-base, /usr/share/wordnet): synsets become entities, pointers become
// triples. Format: man 5 wndb.
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "retrieval/knowledge_graph.h"

namespace depcache {

struct WordnetImportStats {
  size_t n_synsets = 0;
  size_t n_triples = 0;           // after dropping duplicates
  size_t n_pointers = 0;          // pointers read, semantic and lexical
  size_t n_lexical_pointers = 0;  // word-to-word pointers, mapped to their synsets
  size_t n_relations = 0;
  double seconds = 0;
  std::vector<std::pair<std::string, size_t>> per_relation;  // triples per relation, most first
};

// Entity names are NLTK-style "lemma.pos.NN" (lemma: the synset's first word
// as the index lists it; pos n, v, a or r, satellites counted as a; NN: the
// sense number in index.pos). Labels are the first word with '_' as space and
// any adjective marker such as "(p)" removed; the other words are aliases.
// The graph is finalized. Missing files: NotFound; malformed lines:
// InvalidInput naming file and line.
KnowledgeGraph import_wordnet(const std::filesystem::path& dir, WordnetImportStats* stats = nullptr);

// The directory Debian's wordnet-base installs to.
inline const std::filesystem::path kDefaultWordnetDir = "/usr/share/wordnet";

}  // namespace depcache

#pragma once
// GraphRAG fixtures the tests share: entities with relation paths (dog
// twice, once with one path changed, so a shared path prefix is reused), the
// request holding them, and a small film graph.
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "retrieval/knowledge_graph.h"
#include "retrieval/rag_request.h"

namespace depcache::test {

inline RequestEntity entity(const std::string& name, std::vector<std::string> paths) {
  return {name, name, std::move(paths)};
}

inline RagRequest graph_request(std::vector<RequestEntity> entities, const std::string& question) {
  RagRequest r;
  r.question = question;
  r.entities = std::move(entities);
  return r;
}

inline const RequestEntity kDog =
    entity("dog", {"dog -hypernym-> canine -hypernym-> carnivore",
                   "dog -hypernym-> canine -member of-> Canidae", "dog -member of-> pack -part of-> wolves"});
inline const RequestEntity kCat =
    entity("cat", {"cat -hypernym-> feline -hypernym-> carnivore", "cat -likes-> milk"});
// dog again, one path changed: the shared prefix "dog -hypernym-> canine -" is reused.
inline const RequestEntity kDog2 = entity(
    "dog", {"dog -hypernym-> canine -hypernym-> carnivore", "dog -hypernym-> canine -habitat-> houses"});
inline const RequestEntity kOwl = entity("owl", {"owl -hypernym-> bird", "owl -eats-> mice"});

// Films, their directors and who likes them: two-hop questions ("where was
// the director of Titanic born?"), two directors, and Alice and Bob friends
// both ways (a cycle).
inline const std::vector<std::array<std::string, 3>> kFilmTriples = {
    {"Alice", "like", "Titanic"},
    {"Titanic", "type", "Tragedy"},
    {"Titanic", "directed by", "James Cameron"},
    {"Alice", "friend", "Bob"},
    {"Bob", "like", "Titanic"},
    {"Bob", "friend", "Alice"},
    {"James Cameron", "born in", "Kapuskasing"},
    {"Titanic", "released in", "1997"},
    {"Bob", "like", "Avatar"},
    {"Avatar", "directed by", "James Cameron"},
    {"Avatar", "type", "Science fiction"},
    {"Avatar", "released in", "2009"},
    {"Alien", "directed by", "Ridley Scott"},
    {"Ridley Scott", "born in", "South Shields"},
};

inline KnowledgeGraph film_graph() {
  KnowledgeGraph kg;
  for (const auto& [head, relation, tail] : kFilmTriples) kg.add_triple(head, relation, tail);
  kg.finalize();
  return kg;
}

// The same as the tab-separated triples `kg import --triples` reads.
inline std::string film_triples_tsv() {
  std::string tsv;
  for (const auto& [head, relation, tail] : kFilmTriples) tsv += head + "\t" + relation + "\t" + tail + "\n";
  return tsv;
}

}  // namespace depcache::test

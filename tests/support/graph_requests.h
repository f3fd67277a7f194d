#pragma once
// GraphRAG requests the strategy tests share: entities with relation paths
// (dog twice, once with one path changed, so a shared path prefix is reused)
// and the request holding them.
#include <string>
#include <utility>
#include <vector>

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

}  // namespace depcache::test

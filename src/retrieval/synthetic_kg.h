#pragma once
// Random knowledge graphs ("worlds") for training and evaluating a model that
// must read its context: entity names are made-up words, so nothing can be
// memorised across worlds, and every (entity, relation) has one tail, so
// every question asked of a world has exactly one answer.
#include <cstdint>

#include "retrieval/knowledge_graph.h"

namespace depcache {

struct SyntheticKgOptions {
  size_t n_entities = 200;
  size_t n_relations = 12;      // drawn from a fixed list of relation words
  size_t facts_per_entity = 3;  // distinct relations per entity
  uint64_t seed = 1;
  // 0: every world makes up its own names. N: every world draws its names
  // from one fixed pool of N made-up names, assigned to entities at random,
  // so a name recurs across worlds (a vocabulary can learn it as one token)
  // while what it stands for does not (nothing to memorise).
  size_t name_pool = 0;
};

KnowledgeGraph make_synthetic_kg(const SyntheticKgOptions& options);

// How many relation words make_synthetic_kg can draw from.
size_t synthetic_relation_count();

}  // namespace depcache

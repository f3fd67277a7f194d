#include "retrieval/synthetic_kg.h"

#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "util/error.h"

namespace depcache {
namespace {

// Relations read as "the <relation> of <entity>" in questions.
constexpr std::array<const char*, 20> kRelations = {
    "home",    "employer",  "friend",   "owner",   "leader",   "birthplace", "rival",
    "teacher", "founder",   "neighbor", "partner", "mentor",   "sibling",    "author",
    "patron",  "successor", "ally",     "builder", "guardian", "keeper"};

constexpr std::array<const char*, 16> kOnsets = {"b", "d", "f", "g", "k", "l", "m",  "n",
                                                 "p", "r", "s", "t", "v", "z", "th", "sh"};
constexpr std::array<const char*, 6> kVowels = {"a", "e", "i", "o", "u", "ai"};
constexpr std::array<const char*, 8> kCodas = {"", "", "n", "r", "l", "s", "k", "m"};

std::string made_up_name(std::mt19937_64& rng) {
  std::string name;
  const int syllables = 2 + static_cast<int>(rng() % 2);
  for (int i = 0; i < syllables; ++i) {
    name += kOnsets[rng() % kOnsets.size()];
    name += kVowels[rng() % kVowels.size()];
    name += kCodas[rng() % kCodas.size()];
  }
  name[0] = static_cast<char>(name[0] - 'a' + 'A');
  return name;
}

// `n` distinct made-up names from `rng`.
std::vector<std::string> made_up_names(size_t n, std::mt19937_64& rng) {
  std::unordered_set<std::string> used;
  std::vector<std::string> names;
  while (names.size() < n) {
    std::string name = made_up_name(rng);
    if (used.insert(name).second) names.push_back(std::move(name));
  }
  return names;
}

// The pool is the same for every world: its seed is fixed, not the world's.
constexpr uint64_t kNamePoolSeed = 0x6e616d65706f6f6cULL;

}  // namespace

size_t synthetic_relation_count() { return kRelations.size(); }

KnowledgeGraph make_synthetic_kg(const SyntheticKgOptions& o) {
  if (o.n_entities < 2) fail(ErrorKind::InvalidInput, "a synthetic graph needs at least 2 entities");
  if (o.n_relations == 0 || o.n_relations > kRelations.size())
    fail(ErrorKind::InvalidInput, "a synthetic graph has 1 to {} relations, not {}", kRelations.size(),
         o.n_relations);
  if (o.facts_per_entity > o.n_relations)
    fail(ErrorKind::InvalidInput, "{} facts per entity need as many relations (there are {})",
         o.facts_per_entity, o.n_relations);
  if (o.name_pool != 0 && o.name_pool < o.n_entities)
    fail(ErrorKind::InvalidInput, "a pool of {} names cannot name {} entities", o.name_pool, o.n_entities);
  std::mt19937_64 rng(o.seed);
  std::vector<std::string> names;
  if (o.name_pool == 0) {
    names = made_up_names(o.n_entities, rng);
  } else {
    std::mt19937_64 pool_rng(kNamePoolSeed);
    names = made_up_names(o.name_pool, pool_rng);
    std::shuffle(names.begin(), names.end(), rng);
    names.resize(o.n_entities);
  }
  KnowledgeGraph kg;
  std::vector<EntityId> entities;
  for (const std::string& name : names) entities.push_back(kg.add_entity(name));
  // The relations of this world: a seeded choice from the list.
  std::vector<size_t> order(kRelations.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<RelationId> relations;
  for (size_t i = 0; i < o.n_relations; ++i) relations.push_back(kg.add_relation(kRelations[order[i]]));
  for (EntityId head : entities) {
    std::vector<RelationId> mine = relations;
    std::shuffle(mine.begin(), mine.end(), rng);
    for (size_t f = 0; f < o.facts_per_entity; ++f) {
      EntityId tail = head;
      while (tail == head) tail = entities[rng() % entities.size()];
      kg.add_triple(head, mine[f], tail);
    }
  }
  kg.finalize();
  return kg;
}

}  // namespace depcache

// Knowledge-graph files (.dkg): any bytes either load into a consistent,
// finalized graph or are refused with an InvalidInput error. The file's
// checksum would stop nearly every mutation at the door, so when the first
// input byte is odd the rest is taken as a file body and its size and
// checksum fields are filled in, letting the fuzzer reach the tables behind.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <tuple>

#include "fuzz_support.h"
#include "retrieval/knowledge_graph.h"
#include "util/error.h"
#include "util/hash.h"

namespace {

using depcache::KnowledgeGraph;
using depcache::fuzz::violated;

// The header's checksum and size fields (see knowledge_graph.cpp).
constexpr size_t kSumAt = 8, kSizeAt = 16, kSumFrom = 16, kHeader = 56;

void check(const KnowledgeGraph& g) {
  if (!g.finalized()) violated("a loaded graph is not finalized");
  size_t aliases = 0;
  for (depcache::EntityId e = 0; e < g.n_entities(); ++e) {
    if (g.find_entity(g.entity_name(e)) != e) violated("an entity is not found by its name");
    aliases += g.aliases(e).size();
  }
  if (aliases != g.n_aliases()) violated("alias count differs from the aliases");
  for (depcache::RelationId r = 0; r < g.n_relations(); ++r)
    if (g.find_relation(g.relation_name(r)) != r) violated("a relation is not found by its name");
  size_t out = 0, in = 0;
  for (depcache::EntityId e = 0; e < g.n_entities(); ++e) {
    for (const depcache::Edge& x : g.out_edges(e))
      if (x.target >= g.n_entities() || x.relation >= g.n_relations()) violated("an edge out of range");
    out += g.out_edges(e).size();
    in += g.in_edges(e).size();
  }
  if (out != g.n_triples() || in != g.n_triples()) violated("adjacency does not match the triples");
  const auto t = g.triples();
  for (size_t i = 1; i < t.size(); ++i) {
    const auto key = [](const depcache::Triple& x) { return std::tuple(x.head, x.relation, x.tail); };
    if (!(key(t[i - 1]) < key(t[i]))) violated("triples not sorted and unique after finalize");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) && bytes.size() >= kHeader) {
    const uint64_t n = bytes.size();
    std::memcpy(bytes.data() + kSizeAt, &n, 8);
    const uint64_t sum = depcache::hash_bytes(bytes.data() + kSumFrom, bytes.size() - kSumFrom);
    std::memcpy(bytes.data() + kSumAt, &sum, 8);
  }
  try {
    check(KnowledgeGraph::parse(bytes, "fuzz.dkg"));
  } catch (const depcache::Error& e) {
    if (e.kind() != depcache::ErrorKind::InvalidInput) {
      std::fprintf(stderr, "%s\n", e.what());
      violated("a KG file refused other than InvalidInput");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "KnowledgeGraph::parse threw: %s\n", e.what());
    violated("KnowledgeGraph::parse threw something other than depcache::Error");
  }
  return 0;
}

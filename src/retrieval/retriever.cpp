#include "retrieval/retriever.h"

#include <fmt/format.h>

#include "util/error.h"
#include "util/timing.h"

namespace depcache {

EntityPaths retrieve_entity_paths(const KnowledgeGraph& kg, EntityId entity, std::string_view question,
                                  const TextScorer& scorer, const PathLimits& limits, size_t top_k) {
  EntityPaths r;
  r.entity = entity;
  auto t0 = Clock::now();
  r.candidates = enumerate_paths(kg, entity, limits);
  r.extract_ms = ms_since(t0);
  t0 = Clock::now();
  std::vector<std::string> texts;
  texts.reserve(r.candidates.paths.size());
  for (const RelationPath& p : r.candidates.paths) texts.push_back(path_text(kg, p));
  const std::vector<double> scores =
      question.empty() ? std::vector<double>(texts.size(), 0.0) : scorer.score(question, texts);
  for (size_t i : top_k_indices(scores, top_k)) {
    r.kept.push_back(r.candidates.paths[i]);
    r.kept_text.push_back(std::move(texts[i]));
  }
  r.prune_ms = ms_since(t0);
  return r;
}

GraphRetriever::GraphRetriever(const KnowledgeGraph& kg, std::string_view scorer)
    : kg_(kg), linker_(kg), scorer_(make_text_scorer(scorer)) {}

std::vector<RequestEntity> GraphRetriever::retrieve(std::string_view question,
                                                    const GraphRetrieveOptions& options) const {
  LinkOptions lopt;
  lopt.max_entities = options.max_entities;
  std::vector<RequestEntity> out;
  for (const LinkedEntity& l : linker_.link(question, lopt)) {
    EntityPaths p = retrieve_entity_paths(kg_, l.entity, question, *scorer_, options.limits, options.top_k);
    out.push_back({std::string(kg_.entity_name(l.entity)), std::string(kg_.entity_label(l.entity)),
                   std::move(p.kept_text)});
  }
  if (out.empty()) fail(ErrorKind::NotFound, "no entity of the knowledge graph is mentioned in the question");
  return out;
}

std::vector<RequestDocument> retrieve_documents(const ChunkIndex& index, std::string_view question,
                                                size_t k) {
  return request_documents(index, index.search(question, k));
}

std::vector<RequestDocument> request_documents(const ChunkIndex& index, const std::vector<ChunkHit>& hits) {
  std::vector<RequestDocument> out;
  for (const ChunkHit& hit : hits) {
    const Chunk& c = index.chunk(hit.chunk);
    const Document& d = index.doc_of(hit.chunk);
    // The first chunk's text begins with the title (chunk_corpus tokenizes "title\ntext").
    out.push_back({fmt::format("{}#{}", d.id, c.index_in_doc), {}, c.text});
  }
  return out;
}

}  // namespace depcache

#pragma once
// Retrieval for one question, as a RAG request's context: the top-k chunks of
// a corpus (BM25), or GraphRAG's linked entities, each with its L-hop
// relation paths pruned to the k most relevant to the question.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "retrieval/corpus.h"
#include "retrieval/entity_linker.h"
#include "retrieval/knowledge_graph.h"
#include "retrieval/rag_request.h"
#include "retrieval/relation_paths.h"
#include "retrieval/text_ranker.h"

namespace depcache {

// One entity's paths: every candidate within the limits, then the top-k.
struct EntityPaths {
  EntityId entity = 0;
  PathSet candidates;
  std::vector<RelationPath> kept;
  std::vector<std::string> kept_text;  // serialized, as the prompt holds them
  double extract_ms = 0, prune_ms = 0;
};

// Without a question the enumeration order is kept (every score ties).
EntityPaths retrieve_entity_paths(const KnowledgeGraph& kg, EntityId entity, std::string_view question,
                                  const TextScorer& scorer, const PathLimits& limits, size_t top_k);

struct GraphRetrieveOptions {
  size_t max_entities = 10;  // linked from the question
  size_t top_k = 30;         // paths kept per entity
  PathLimits limits;
};

// Link, extract and prune over one graph; the graph must outlive it. Thread
// safe: retrieve() only reads.
class GraphRetriever {
 public:
  explicit GraphRetriever(const KnowledgeGraph& kg, std::string_view scorer = "bm25");
  // NotFound when the question mentions no entity of the graph.
  std::vector<RequestEntity> retrieve(std::string_view question, const GraphRetrieveOptions& options) const;

 private:
  const KnowledgeGraph& kg_;
  EntityLinker linker_;
  std::unique_ptr<TextScorer> scorer_;
};

// The k best chunks for the question as request documents; a chunk's id
// (document id and chunk number) names the same text every time.
std::vector<RequestDocument> retrieve_documents(const ChunkIndex& index, std::string_view question, size_t k);
// Search hits as request documents, in their order.
std::vector<RequestDocument> request_documents(const ChunkIndex& index, const std::vector<ChunkHit>& hits);

}  // namespace depcache

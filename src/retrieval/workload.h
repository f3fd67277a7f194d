#pragma once
// Request streams for cache experiments: access patterns over a pool of items
// (entities or questions), Poisson arrival times, DepCache-style synthetic
// GraphRAG QA, and the locality report that bounds what any cache can reuse.
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "retrieval/knowledge_graph.h"
#include "retrieval/rag_request.h"
#include "retrieval/relation_paths.h"

namespace depcache {

enum class AccessPattern { Uniform, Temporal, Zipf };

AccessPattern parse_access_pattern(std::string_view name);  // uniform|temporal|zipf
std::string_view access_pattern_name(AccessPattern p);

struct AccessOptions {
  AccessPattern pattern = AccessPattern::Zipf;
  double zipf_s = 1.0;          // P(rank r) ∝ r^-s
  double temporal_reuse = 0.6;  // Temporal: chance to draw from the recently used items
  size_t temporal_window = 32;  // how many recent items count as recent
};

// Draws item indices in [0, n_items). Zipf ranks are a seeded permutation of
// the items, so the popular ones are not simply the first. Temporal picks a
// recently drawn item with probability temporal_reuse (more recent likelier,
// weight 1/(1+age)), else a uniform one.
class AccessSampler {
 public:
  AccessSampler(size_t n_items, const AccessOptions& options, uint64_t seed);
  size_t next();
  // `count` distinct items (count <= n_items), drawn by the pattern.
  std::vector<size_t> next_distinct(size_t count);

 private:
  size_t n_items_;
  AccessOptions options_;
  std::mt19937_64 rng_;
  std::vector<size_t> permutation_;  // Zipf rank -> item
  std::vector<double> cdf_;          // Zipf cumulative weights
  std::vector<size_t> recent_;       // Temporal: most recent last
};

// Arrival offsets (seconds) of a Poisson process with `rate` requests/s;
// rate <= 0 means every request arrives at 0.
std::vector<double> poisson_arrivals(size_t n, double rate, uint64_t seed);

// One synthetic QA item: an entity with its context paths and a templated
// question whose answers are leaves of those paths.
struct GraphQa {
  EntityId topic = 0;
  std::vector<RelationPath> paths;  // <= paths_per_entity, the entity's context
  std::string question;             // "What is the <r2> of the <r1> of <topic>?"
  RelationPath asked;               // the relations asked, from the topic (one path's first steps)
  std::vector<EntityId> answers;    // every leaf reached by the same relations
};

struct GraphQaOptions {
  size_t n_items = 500;
  size_t paths_per_entity = 30;
  size_t min_paths = 10;  // skip entities with fewer paths (sparse subgraphs)
  int hops = 2;
  // Hops of the question (<= hops; 0: hops): a shorter question asks for a
  // path's first steps with the full paths as context.
  int question_hops = 0;
  size_t max_fanout = 64;
  uint64_t seed = 1;
};

// Samples entities (seeded) that have at least min_paths paths, one of full
// length, and builds
// one QA item per entity, up to n_items (fewer if the graph has fewer such
// entities; none is an InvalidInput error).
std::vector<GraphQa> make_graph_qa(const KnowledgeGraph& kg, const GraphQaOptions& options);
// Points qa at `asked` (relations from its topic): its question in words and
// every leaf of its paths reached by those relations as the answers.
void ask_about(const KnowledgeGraph& kg, GraphQa& qa, const RelationPath& asked);

// How a request asks its question: in words ("What is the r of A?"), or as a
// cloze in the context's own notation, the fact up to the answer ("A -r->"
// over relation paths, "The r of A is" over documents): the key the answer
// is looked up by sits right before it.
enum class QuestionForm { Words, Cloze };
std::optional<QuestionForm> parse_question_form(std::string_view name);  // words|cloze
// The cloze of an asked path: over relation paths (documents false) each step
// as a path writes it, the entities on the way left out ("A -r1-> -r2->");
// over documents a sentence stem ("The r2 of the r1 of A is").
std::string cloze_question(const KnowledgeGraph& kg, const RelationPath& asked, bool documents);

struct GraphWorkloadOptions {
  size_t n_requests = 100;
  size_t entities_per_request = 10;  // the QA topic plus context entities
  // Each entity as a document of fact sentences (chunk RAG) instead of its
  // relation paths (DepPrompt trees).
  bool documents = false;
  QuestionForm question_form = QuestionForm::Words;
  // Every QA item asked once, in order (n_requests is ignored); the other
  // entities of a request are drawn uniformly. Otherwise `access` draws.
  bool each_once = false;
  // Requests asked over each drawn context (not with each_once): the first
  // ask each entity's own question in turn; beyond the entities, round after
  // round each entity's next relations not asked yet (as many hops as its own
  // question), fewer when none is left. The context is unchanged, so a
  // trainer can pack several answers about one context into one sequence.
  // n_requests counts requests, not contexts.
  size_t questions_per_context = 1;
  AccessOptions access;
  double rate = 0;  // requests/s for Poisson arrivals
  uint64_t seed = 1;
};

// A request stream over QA items: each request asks one item's question (item
// drawn by the access pattern) and carries the paths of its topic and of
// entities_per_request - 1 more entities drawn by the same pattern. With
// questions_per_context > 1, consecutive requests share a context and ask
// about its entities in turn, then about their other relations.
std::vector<RagRequest> make_graph_workload(const KnowledgeGraph& kg, const std::vector<GraphQa>& qa,
                                            const GraphWorkloadOptions& options);

// What caching could reuse in a stream, counting context items (entities or
// documents) by their token cost.
struct LocalityReport {
  size_t n_requests = 0;
  size_t n_item_uses = 0;
  size_t n_distinct_items = 0;     // by item (entity / document), not by content
  size_t n_distinct_contents = 0;  // by content key
  // "Top 20%": the 20% most used of the items seen in the stream.
  double top20_request_share = 0;  // requests touching one of them
  double top20_use_share = 0;      // uses that go to them
  // Items outside the top 20% used as often as the last one inside: when
  // non-zero, which of them count (and so the request share) is a tie-break
  // (by name); the use share does not depend on it.
  size_t top20_cut_ties = 0;
  int64_t total_tokens = 0;     // context tokens over all requests
  int64_t distinct_tokens = 0;  // context tokens of the distinct contents
  // Infinite cache, whole-item exact reuse (an item is reused only when its
  // content is identical): 1 - distinct/total (token-weighted), and the
  // per-request average of cached/context tokens (DepCache's hit-rate form).
  double reuse_upper_bound = 0;
  double mean_request_hit_bound = 0;
  // Infinite cache, prefix reuse inside an item: a token is reusable when the
  // same item earlier held the same token prefix up to it (a path's KV under
  // dependency attention depends only on its ancestors). Items without
  // sequences fall back to whole-item reuse.
  double prefix_reuse_upper_bound = 0;
  double mean_request_prefix_hit_bound = 0;
};

struct ItemUse {
  std::string item;    // what frequency counts: entity name or document id
  std::string key;     // identity of the content (same key = same tokens)
  int64_t tokens = 0;  // its token cost
  // Optional: the token runs (an entity's paths, a document's tokens) whose
  // shared prefixes a cache can reuse; their merged trie holds `tokens` nodes.
  std::vector<std::vector<int32_t>> sequences;
};

LocalityReport locality_report(const std::vector<std::vector<ItemUse>>& requests);

}  // namespace depcache

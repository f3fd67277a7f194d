#pragma once
// A knowledge graph of (head, relation, tail) triples with interned entity and
// relation names, aliases, and adjacency in both directions.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace depcache {

using EntityId = uint32_t;
using RelationId = uint32_t;

struct Triple {
  EntityId head = 0;
  RelationId relation = 0;
  EntityId tail = 0;
};

// One adjacency entry: for out_edges the target is the tail, for in_edges the head.
struct Edge {
  RelationId relation = 0;
  EntityId target = 0;
};

class KnowledgeGraph {
 public:
  // Building. Names are unique keys; the label is the display text used in
  // prompts (defaults to the name; WordNet synsets: name "dog.n.01", label "dog").
  EntityId add_entity(std::string_view name);  // returns the existing id if present
  RelationId add_relation(std::string_view name);
  void set_label(EntityId e, std::string_view label);
  void add_alias(EntityId e, std::string_view alias);
  void add_triple(EntityId head, RelationId relation, EntityId tail);
  void add_triple(std::string_view head, std::string_view relation, std::string_view tail);
  // Drops duplicate triples and builds the adjacency; queries need it.
  // out_edges()/in_edges() before finalize() throw Error(Internal) rather than
  // finalising lazily, so a const graph is never mutated behind a caller's back.
  // Adding an entity or a triple afterwards clears the finalized state.
  void finalize();
  bool finalized() const;

  size_t n_entities() const;
  size_t n_relations() const;
  size_t n_triples() const;  // before finalize() duplicates are still counted
  size_t n_aliases() const;  // over all entities

  std::string_view entity_name(EntityId e) const;
  std::string_view entity_label(EntityId e) const;
  std::string_view relation_name(RelationId r) const;
  std::span<const std::string> aliases(EntityId e) const;            // excluding the label
  std::optional<EntityId> find_entity(std::string_view name) const;  // exact name
  std::optional<RelationId> find_relation(std::string_view name) const;

  // Adjacency, sorted by (relation, target); valid after finalize().
  std::span<const Edge> out_edges(EntityId e) const;
  std::span<const Edge> in_edges(EntityId e) const;
  std::span<const Triple> triples() const;  // sorted (head, relation, tail) after finalize()

  // The project's binary KG file (magic, version, checksum); load() rejects
  // truncated, corrupt or foreign files with a precise error.
  void save(const std::filesystem::path& path) const;
  static KnowledgeGraph load(const std::filesystem::path& path);
  // The bytes of a KG file, checked as load() checks them; errors name `source_name`.
  static KnowledgeGraph parse(const std::string& bytes, const std::string& source_name);

 private:
  void require_finalized(const char* what) const;

  // Transparent hashing, so lookups by string_view build no temporary string.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using NameMap = std::unordered_map<std::string, uint32_t, NameHash, std::equal_to<>>;
  std::vector<std::string> entity_names_;
  std::vector<std::string> entity_labels_;  // empty: the label is the name
  std::vector<std::vector<std::string>> aliases_;
  NameMap entity_ids_;
  std::vector<std::string> relation_names_;
  NameMap relation_ids_;
  std::vector<Triple> triples_;
  size_t n_aliases_ = 0;
  bool finalized_ = false;
  // CSR adjacency: the edges of entity e are [offsets[e], offsets[e + 1]).
  std::vector<uint32_t> out_offsets_, in_offsets_;
  std::vector<Edge> out_adj_, in_adj_;
};

enum class TripleFormat { Auto, Tsv, Csv, Jsonl };

// Loads triples from text. TSV: head<TAB>relation<TAB>tail (blank lines and
// lines starting with '#' skipped); CSV: the same as RFC 4180 fields (an
// optional first row "head,relation,tail" is skipped); JSONL:
// {"head":..,"relation":..,"tail":..} per line, plus optional
// {"entity":..,"label":..,"aliases":[..]} lines. A row whose relation is
// "@alias" declares tail as an alias of head. Auto picks by extension
// (.tsv/.txt, .csv, .jsonl/.json). Fields are trimmed of surrounding spaces.
// Errors (InvalidInput) name the file and line; a file without triples is an
// error too. The result is finalized.
KnowledgeGraph load_triples(const std::filesystem::path& path, TripleFormat format = TripleFormat::Auto);

}  // namespace depcache

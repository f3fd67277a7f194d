#include "retrieval/entity_linker.h"

#include <algorithm>

#include "retrieval/text.h"
#include "util/error.h"

namespace depcache {
namespace {

size_t degree(const KnowledgeGraph& kg, EntityId e) { return kg.out_edges(e).size() + kg.in_edges(e).size(); }

void sort_by_salience(const KnowledgeGraph& kg, std::vector<EntityId>& ids) {
  std::stable_sort(ids.begin(), ids.end(),
                   [&](EntityId a, EntityId b) { return degree(kg, a) > degree(kg, b); });
}

}  // namespace

EntityLinker::EntityLinker(const KnowledgeGraph& kg) : kg_(kg) {
  for (EntityId e = 0; e < kg.n_entities(); ++e) {
    std::string text(kg.entity_label(e));
    by_label_[normalize_text(kg.entity_label(e))].push_back(e);
    const std::string name = normalize_text(kg.entity_name(e));
    if (name != normalize_text(kg.entity_label(e))) by_alias_[name].push_back(e);
    for (const std::string& alias : kg.aliases(e)) {
      by_alias_[normalize_text(alias)].push_back(e);
      text += ' ';
      text += alias;
    }
    names_.add(text);
  }
  names_.finalize();
  for (auto& [key, ids] : by_label_) sort_by_salience(kg, ids);
  for (auto& [key, ids] : by_alias_) {
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    sort_by_salience(kg, ids);
  }
}

std::vector<LinkedEntity> EntityLinker::link(std::string_view question, const LinkOptions& options) const {
  std::vector<LinkedEntity> found;
  const auto seen = [&](EntityId e) {
    return std::any_of(found.begin(), found.end(), [&](const LinkedEntity& l) { return l.entity == e; });
  };
  const std::vector<std::string> words = split_words(question);
  std::vector<bool> covered(words.size(), false);
  // Longest mentions first, left to right; a word belongs to one mention.
  for (size_t n = std::min(options.max_ngram, words.size()); n >= 1; --n) {
    for (size_t start = 0; start + n <= words.size(); ++start) {
      if (std::any_of(covered.begin() + start, covered.begin() + start + n, [](bool c) { return c; }))
        continue;
      // "kind of" (an alias of "rather") is not a mention: none ends in a function word.
      if (is_stopword(words[start + n - 1])) continue;
      std::string mention = words[start];
      for (size_t i = start + 1; i < start + n; ++i) mention += ' ' + words[i];
      size_t taken = 0;
      for (const auto* table : {&by_label_, &by_alias_}) {
        const auto it = table->find(mention);
        if (it == table->end()) continue;
        const LinkKind how = table == &by_label_ ? LinkKind::Label : LinkKind::Alias;
        for (EntityId e : it->second) {
          if (taken == options.max_per_mention) break;
          if (seen(e) || degree(kg_, e) == 0) continue;  // no edges: nothing to retrieve
          // Longer mentions first; labels before aliases; then salience order.
          const double score = 1000.0 * static_cast<double>(n) + (how == LinkKind::Label ? 500.0 : 0.0) -
                               static_cast<double>(taken);
          found.push_back({e, how, score, mention});
          ++taken;
        }
      }
      if (taken > 0) std::fill(covered.begin() + start, covered.begin() + start + n, true);
    }
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const LinkedEntity& a, const LinkedEntity& b) { return a.score > b.score; });
  if (found.size() > options.max_entities) found.resize(options.max_entities);
  if (options.bm25_fallback && found.size() < options.max_entities) {
    // Over-fetch: some hits are already linked or have no edges.
    for (const ScoredDoc& d : names_.search(question, 4 * options.max_entities + found.size())) {
      if (found.size() == options.max_entities) break;
      if (seen(d.doc) || degree(kg_, d.doc) == 0) continue;
      found.push_back({d.doc, LinkKind::Bm25, d.score, normalize_text(kg_.entity_label(d.doc))});
    }
  }
  return found;
}

EntityId EntityLinker::resolve(std::string_view name) const {
  if (const auto e = kg_.find_entity(name)) return *e;
  const auto exact = by_label_.find(normalize_text(name));
  if (exact != by_label_.end() && !exact->second.empty()) return exact->second.front();
  LinkOptions one;
  one.max_entities = 1;
  const std::vector<LinkedEntity> linked = link(name, one);
  if (linked.empty()) fail(ErrorKind::NotFound, "no entity matches '{}'", name);
  return linked.front().entity;
}

}  // namespace depcache

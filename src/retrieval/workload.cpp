#include "retrieval/workload.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "util/error.h"
#include "util/hash.h"

namespace depcache {

AccessPattern parse_access_pattern(std::string_view name) {
  if (name == "uniform") return AccessPattern::Uniform;
  if (name == "temporal") return AccessPattern::Temporal;
  if (name == "zipf") return AccessPattern::Zipf;
  fail(ErrorKind::InvalidInput, "unknown access pattern '{}' (expected uniform, temporal or zipf)", name);
}

std::string_view access_pattern_name(AccessPattern p) {
  switch (p) {
    case AccessPattern::Uniform:
      return "uniform";
    case AccessPattern::Temporal:
      return "temporal";
    case AccessPattern::Zipf:
      return "zipf";
  }
  return "?";
}

AccessSampler::AccessSampler(size_t n_items, const AccessOptions& options, uint64_t seed)
    : n_items_(n_items), options_(options), rng_(seed) {
  if (n_items == 0) fail(ErrorKind::InvalidInput, "an access pattern needs at least one item");
  if (options.pattern == AccessPattern::Zipf) {
    if (!(options.zipf_s >= 0) || !std::isfinite(options.zipf_s))
      fail(ErrorKind::InvalidInput, "Zipf exponent must be a finite number >= 0 (got {})", options.zipf_s);
    permutation_.resize(n_items);
    std::iota(permutation_.begin(), permutation_.end(), size_t{0});
    std::shuffle(permutation_.begin(), permutation_.end(), rng_);
    cdf_.resize(n_items);
    double sum = 0;
    for (size_t r = 0; r < n_items; ++r)
      cdf_[r] = sum += std::pow(static_cast<double>(r + 1), -options.zipf_s);
  }
  if (options.pattern == AccessPattern::Temporal) {
    if (!(options.temporal_reuse >= 0 && options.temporal_reuse <= 1))
      fail(ErrorKind::InvalidInput, "temporal reuse probability must be in [0, 1] (got {})",
           options.temporal_reuse);
    if (options.temporal_window == 0) fail(ErrorKind::InvalidInput, "temporal window must be at least 1");
  }
}

size_t AccessSampler::next() {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  switch (options_.pattern) {
    case AccessPattern::Uniform:
      return std::uniform_int_distribution<size_t>(0, n_items_ - 1)(rng_);
    case AccessPattern::Zipf: {
      const double u = unit(rng_) * cdf_.back();
      const size_t rank =
          std::min<size_t>(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin(), n_items_ - 1);
      return permutation_[rank];
    }
    case AccessPattern::Temporal: {
      size_t item;
      if (!recent_.empty() && unit(rng_) < options_.temporal_reuse) {
        // Age 0 is the most recent draw; weight 1/(1+age).
        double total = 0;
        for (size_t age = 0; age < recent_.size(); ++age) total += 1.0 / static_cast<double>(1 + age);
        double u = unit(rng_) * total;
        size_t age = 0;
        for (; age + 1 < recent_.size(); ++age) {
          u -= 1.0 / static_cast<double>(1 + age);
          if (u < 0) break;
        }
        item = recent_[recent_.size() - 1 - age];
      } else {
        item = std::uniform_int_distribution<size_t>(0, n_items_ - 1)(rng_);
      }
      std::erase(recent_, item);
      recent_.push_back(item);
      if (recent_.size() > options_.temporal_window) recent_.erase(recent_.begin());
      return item;
    }
  }
  return 0;
}

std::vector<size_t> AccessSampler::next_distinct(size_t count) {
  if (count > n_items_)
    fail(ErrorKind::InvalidInput, "cannot draw {} distinct items out of {}", count, n_items_);
  std::vector<size_t> out;
  std::unordered_set<size_t> taken;
  // A skewed pattern may keep returning the same few items: bound the tries,
  // then fill up uniformly so the call always terminates.
  for (size_t tries = 0; out.size() < count && tries < 64 * count + 64; ++tries) {
    const size_t item = next();
    if (taken.insert(item).second) out.push_back(item);
  }
  while (out.size() < count) {
    const size_t item = std::uniform_int_distribution<size_t>(0, n_items_ - 1)(rng_);
    if (taken.insert(item).second) out.push_back(item);
  }
  return out;
}

std::vector<double> poisson_arrivals(size_t n, double rate, uint64_t seed) {
  std::vector<double> t(n, 0.0);
  if (rate <= 0 || !std::isfinite(rate)) return t;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  double now = 0;
  for (double& x : t) x = now += gap(rng);
  return t;
}

namespace {

std::string step_phrase(const KnowledgeGraph& kg, const PathStep& step) {
  std::string rel(kg.relation_name(step.relation));
  return step.inverse ? "inverse " + rel : rel;
}

// "the r2 of the r1 of ": the asked relations read outward from the topic.
std::string relations_phrase(const KnowledgeGraph& kg, const RelationPath& asked) {
  std::string phrase;
  for (size_t i = asked.steps.size(); i-- > 0;) phrase += "the " + step_phrase(kg, asked.steps[i]) + " of ";
  return phrase;
}

bool same_relations(const RelationPath& a, const RelationPath& b) {
  if (a.steps.size() != b.steps.size()) return false;
  for (size_t i = 0; i < a.steps.size(); ++i)
    if (a.steps[i].relation != b.steps[i].relation || a.steps[i].inverse != b.steps[i].inverse) return false;
  return true;
}

// The first `n` steps of a path.
RelationPath prefix(const RelationPath& p, size_t n) {
  RelationPath out = p;
  out.steps.resize(n);
  return out;
}

// The questions one context can ask: first each item's own, in item order,
// then round after round each item's next relations (a prefix of one of its
// paths as long as its own question, not asked yet), until `count` or none is
// left. Rounds keep the entities interleaved, so packed answers are not
// grouped by entity.
std::vector<GraphQa> context_questions(const KnowledgeGraph& kg, const std::vector<GraphQa>& qa,
                                       const std::vector<size_t>& items, size_t count) {
  std::vector<GraphQa> out;
  std::vector<std::vector<RelationPath>> asked(items.size());
  std::vector<size_t> next(items.size(), 0);  // the next of the item's paths to try
  for (size_t i = 0; i < items.size() && out.size() < count; ++i) {
    out.push_back(qa[items[i]]);
    asked[i].push_back(qa[items[i]].asked);
  }
  for (bool more = true; more && out.size() < count;) {
    more = false;
    for (size_t i = 0; i < items.size() && out.size() < count; ++i) {
      const GraphQa& item = qa[items[i]];
      const size_t hops = item.asked.steps.size();
      for (; next[i] < item.paths.size(); ++next[i]) {
        const RelationPath& whole = item.paths[next[i]];
        if (whole.steps.size() < hops) continue;
        const RelationPath p = prefix(whole, hops);
        if (std::any_of(asked[i].begin(), asked[i].end(),
                        [&](const RelationPath& a) { return same_relations(a, p); }))
          continue;
        asked[i].push_back(p);
        GraphQa q = item;
        ask_about(kg, q, p);
        out.push_back(std::move(q));
        more = true;
        break;
      }
    }
  }
  return out;
}

}  // namespace

void ask_about(const KnowledgeGraph& kg, GraphQa& qa, const RelationPath& asked) {
  qa.question = fmt::format("What is {}{}?", relations_phrase(kg, asked), kg.entity_label(qa.topic));
  qa.asked = asked;
  qa.answers.clear();
  for (const RelationPath& whole : qa.paths) {
    if (whole.steps.size() < asked.steps.size()) continue;
    const RelationPath p = prefix(whole, asked.steps.size());
    if (same_relations(p, asked) &&
        std::find(qa.answers.begin(), qa.answers.end(), p.leaf()) == qa.answers.end())
      qa.answers.push_back(p.leaf());
  }
}

std::vector<GraphQa> make_graph_qa(const KnowledgeGraph& kg, const GraphQaOptions& options) {
  if (options.paths_per_entity == 0) fail(ErrorKind::InvalidInput, "paths per entity must be at least 1");
  std::mt19937_64 rng(options.seed);
  std::vector<EntityId> candidates;
  for (EntityId e = 0; e < kg.n_entities(); ++e)
    if (!kg.out_edges(e).empty()) candidates.push_back(e);
  std::shuffle(candidates.begin(), candidates.end(), rng);

  PathLimits limits;
  limits.hops = options.hops;
  limits.max_paths = options.paths_per_entity;
  limits.max_fanout = options.max_fanout;
  const int asked_hops = options.question_hops > 0 ? options.question_hops : options.hops;
  if (asked_hops > options.hops)
    fail(ErrorKind::InvalidInput, "questions of {} hops need paths of as many (paths have {})", asked_hops,
         options.hops);
  std::vector<GraphQa> out;
  for (EntityId e : candidates) {
    if (out.size() == options.n_items) break;
    GraphQa qa;
    qa.topic = e;
    qa.paths = enumerate_paths(kg, e, limits).paths;
    std::vector<size_t> full;
    for (size_t i = 0; i < qa.paths.size(); ++i)
      if (static_cast<int>(qa.paths[i].steps.size()) == options.hops) full.push_back(i);
    if (full.empty() || qa.paths.size() < std::min(options.min_paths, options.paths_per_entity)) continue;
    ask_about(kg, qa,
              prefix(qa.paths[full[std::uniform_int_distribution<size_t>(0, full.size() - 1)(rng)]],
                     static_cast<size_t>(asked_hops)));
    out.push_back(std::move(qa));
  }
  if (out.empty())
    fail(ErrorKind::InvalidInput,
         "the graph has no entity with {} paths of which one has {} hops: cannot make QA items",
         std::min(options.min_paths, options.paths_per_entity), options.hops);
  return out;
}

std::optional<QuestionForm> parse_question_form(std::string_view name) {
  if (name == "words") return QuestionForm::Words;
  if (name == "cloze") return QuestionForm::Cloze;
  return std::nullopt;
}

std::string cloze_question(const KnowledgeGraph& kg, const RelationPath& asked, bool documents) {
  if (documents) {
    std::string phrase = relations_phrase(kg, asked);  // asked has at least one step
    phrase[0] = 'T';
    return phrase + std::string(kg.entity_label(asked.root)) + " is";
  }
  std::string s(kg.entity_label(asked.root));
  for (const PathStep& step : asked.steps)
    s += (step.inverse ? " <-" : " -") + std::string(kg.relation_name(step.relation)) +
         (step.inverse ? "-" : "->");
  return s;
}

std::vector<RagRequest> make_graph_workload(const KnowledgeGraph& kg, const std::vector<GraphQa>& qa,
                                            const GraphWorkloadOptions& options) {
  if (qa.empty()) fail(ErrorKind::InvalidInput, "no QA items to build requests from");
  if (options.entities_per_request == 0)
    fail(ErrorKind::InvalidInput, "entities per request must be at least 1");
  AccessOptions access = options.access;
  if (options.each_once) access.pattern = AccessPattern::Uniform;
  AccessSampler sampler(qa.size(), access, options.seed);
  const size_t n_requests = options.each_once ? qa.size() : options.n_requests;
  const std::vector<double> arrivals =
      poisson_arrivals(n_requests, options.rate, options.seed ^ 0x9E3779B97F4A7C15ULL);
  if (options.questions_per_context == 0)
    fail(ErrorKind::InvalidInput, "questions per context must be at least 1");
  if (options.each_once && options.questions_per_context > 1)
    fail(ErrorKind::InvalidInput, "asking every QA item once leaves one question per context");
  const size_t per_request = std::min(options.entities_per_request, qa.size());
  std::vector<RagRequest> out;
  out.reserve(n_requests);
  std::vector<size_t> items;       // the context being asked about
  std::vector<GraphQa> questions;  // what it is asked, in turn
  for (size_t i = 0, turn = 0; i < n_requests; ++i, ++turn) {
    if (turn == questions.size()) {
      turn = 0;
      items = sampler.next_distinct(per_request);
      if (options.each_once) {
        // Item i asks; the others are context (distractors).
        const auto at = std::find(items.begin(), items.end(), i);
        items.erase(at != items.end() ? at : items.end() - 1);
        items.insert(items.begin(), i);
      }
      questions = context_questions(kg, qa, items, options.questions_per_context);
    }
    const GraphQa& asked = questions[turn];
    RagRequest r;
    r.id = std::to_string(i);
    r.arrival_s = arrivals[i];
    r.question = options.question_form == QuestionForm::Words
                     ? asked.question
                     : cloze_question(kg, asked.asked, options.documents);
    for (EntityId a : asked.answers) r.answers.emplace_back(kg.entity_label(a));
    for (size_t item : items) {
      const EntityId topic = qa[item].topic;
      if (options.documents) {
        r.documents.push_back({std::string(kg.entity_name(topic)), std::string(kg.entity_label(topic)),
                               fact_sentences(kg, qa[item].paths)});
        continue;
      }
      RequestEntity e{std::string(kg.entity_name(topic)), std::string(kg.entity_label(topic)), {}};
      for (const RelationPath& p : qa[item].paths) e.paths.push_back(path_text(kg, p));
      r.entities.push_back(std::move(e));
    }
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

// The top 20% most used items (ties broken by name for determinism); sets
// the report's use share and cut ties.
std::unordered_set<std::string> top_items(const std::unordered_map<std::string, size_t>& uses,
                                          LocalityReport& rep) {
  std::vector<std::pair<std::string, size_t>> ranked(uses.begin(), uses.end());
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  const size_t n_top = std::max<size_t>(1, (ranked.size() + 4) / 5);
  std::unordered_set<std::string> top;
  size_t top_uses = 0;
  for (size_t i = 0; i < n_top; ++i) {
    top.insert(ranked[i].first);
    top_uses += ranked[i].second;
  }
  for (size_t i = n_top; i < ranked.size() && ranked[i].second == ranked[n_top - 1].second; ++i)
    ++rep.top20_cut_ties;
  rep.top20_use_share = static_cast<double>(top_uses) / static_cast<double>(rep.n_item_uses);
  return top;
}

// What an infinite cache already holds of one request's context.
struct RequestReuse {
  bool touches_top = false;  // uses one of the top items
  int64_t context = 0, cached = 0, prefix_cached = 0;
};

// The contents and token prefixes of the requests so far. A prefix is a
// hash of (item, prefix): 64-bit hashes make a false match vanishingly
// unlikely at these sizes.
class ReuseTracker {
 public:
  RequestReuse add(const std::vector<ItemUse>& req, const std::unordered_set<std::string>& top) {
    RequestReuse r;
    std::vector<uint64_t> fresh;  // prefixes this request adds
    for (const ItemUse& u : req) {
      r.touches_top = r.touches_top || top.count(u.item) > 0;
      r.context += u.tokens;
      const bool whole_hit = !seen_.insert(u.key).second;
      if (whole_hit) r.cached += u.tokens;
      if (u.sequences.empty()) {
        if (whole_hit) r.prefix_cached += u.tokens;
        continue;
      }
      std::unordered_set<uint64_t> mine;  // shared prefixes inside the item count once
      const uint64_t root = hash_string(u.item);
      for (const auto& seq : u.sequences) {
        uint64_t h = root;
        for (int32_t t : seq) {
          h = hash_bytes(&t, sizeof t, h);
          if (!mine.insert(h).second) continue;
          if (seen_prefixes_.count(h))
            ++r.prefix_cached;
          else
            fresh.push_back(h);
        }
      }
    }
    seen_prefixes_.insert(fresh.begin(), fresh.end());
    return r;
  }

 private:
  std::unordered_set<uint64_t> seen_prefixes_;
  std::unordered_set<std::string> seen_;
};

}  // namespace

LocalityReport locality_report(const std::vector<std::vector<ItemUse>>& requests) {
  LocalityReport rep;
  rep.n_requests = requests.size();
  std::unordered_map<std::string, size_t> uses;      // by item
  std::unordered_map<std::string, int64_t> content;  // by content key
  for (const auto& req : requests)
    for (const ItemUse& u : req) {
      ++uses[u.item];
      content.emplace(u.key, u.tokens);
      ++rep.n_item_uses;
      rep.total_tokens += u.tokens;
    }
  rep.n_distinct_items = uses.size();
  rep.n_distinct_contents = content.size();
  for (const auto& [key, tokens] : content) rep.distinct_tokens += tokens;
  if (rep.n_requests == 0 || rep.n_item_uses == 0) return rep;

  const std::unordered_set<std::string> top = top_items(uses, rep);
  // Prefix reuse: every token prefix an item has held.
  ReuseTracker tracker;
  size_t touching = 0, n_with_context = 0;
  double hit_sum = 0, prefix_hit_sum = 0;
  int64_t prefix_cached_total = 0;
  for (const auto& req : requests) {
    const RequestReuse r = tracker.add(req, top);
    touching += r.touches_top;
    prefix_cached_total += r.prefix_cached;
    if (r.context > 0) {
      hit_sum += static_cast<double>(r.cached) / static_cast<double>(r.context);
      prefix_hit_sum += static_cast<double>(r.prefix_cached) / static_cast<double>(r.context);
      ++n_with_context;
    }
  }
  rep.top20_request_share = static_cast<double>(touching) / static_cast<double>(rep.n_requests);
  if (rep.total_tokens > 0) {
    const auto total = static_cast<double>(rep.total_tokens);
    rep.reuse_upper_bound = 1.0 - static_cast<double>(rep.distinct_tokens) / total;
    rep.prefix_reuse_upper_bound = static_cast<double>(prefix_cached_total) / total;
  }
  if (n_with_context) {
    rep.mean_request_hit_bound = hit_sum / static_cast<double>(n_with_context);
    rep.mean_request_prefix_hit_bound = prefix_hit_sum / static_cast<double>(n_with_context);
  }
  return rep;
}

}  // namespace depcache

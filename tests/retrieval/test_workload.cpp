// Access patterns, Poisson arrivals, synthetic GraphRAG QA, request files and
// the locality report.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "retrieval/rag_request.h"
#include "retrieval/synthetic_kg.h"
#include "retrieval/workload.h"
#include "test_support.h"
#include "util/error.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

// Share of draws that hit the 20% most drawn items.
double top20_share(const std::vector<size_t>& draws, size_t n_items) {
  std::vector<size_t> counts(n_items, 0);
  for (size_t d : draws) ++counts[d];
  std::sort(counts.rbegin(), counts.rend());
  return static_cast<double>(std::accumulate(counts.begin(), counts.begin() + n_items / 5, size_t{0})) /
         static_cast<double>(draws.size());
}

std::vector<size_t> draw(AccessPattern p, size_t n_items, size_t n, uint64_t seed, double s = 1.0) {
  AccessOptions opt;
  opt.pattern = p;
  opt.zipf_s = s;
  AccessSampler sampler(n_items, opt, seed);
  std::vector<size_t> out;
  for (size_t i = 0; i < n; ++i) out.push_back(sampler.next());
  return out;
}

TEST(AccessSampler, SeededAndInRange) {
  for (AccessPattern p : {AccessPattern::Uniform, AccessPattern::Temporal, AccessPattern::Zipf}) {
    const auto a = draw(p, 50, 1000, 3), b = draw(p, 50, 1000, 3), c = draw(p, 50, 1000, 4);
    EXPECT_EQ(a, b) << access_pattern_name(p);
    EXPECT_NE(a, c) << access_pattern_name(p);
    for (size_t x : a) ASSERT_LT(x, 50u);
  }
  EXPECT_EQ(parse_access_pattern("zipf"), AccessPattern::Zipf);
  EXPECT_THROW(parse_access_pattern("gauss"), Error);
  EXPECT_THROW(AccessSampler(0, AccessOptions{}, 1), Error);
}

TEST(AccessSampler, SkewOrdersAsExpected) {
  const size_t n_items = 200, n = 20000;
  const double uniform = top20_share(draw(AccessPattern::Uniform, n_items, n, 1), n_items);
  const double zipf = top20_share(draw(AccessPattern::Zipf, n_items, n, 1, 1.0), n_items);
  const double steep = top20_share(draw(AccessPattern::Zipf, n_items, n, 1, 1.5), n_items);
  EXPECT_LT(uniform, 0.3);
  EXPECT_GT(zipf, 0.6);
  EXPECT_GT(steep, zipf);
  // Temporal: draws repeat recent ones far more often than uniform draws do.
  const auto recent_repeats = [&](const std::vector<size_t>& d) {
    size_t hits = 0;
    for (size_t i = 8; i < d.size(); ++i)
      hits += std::find(d.begin() + i - 8, d.begin() + i, d[i]) != d.begin() + i;
    return static_cast<double>(hits) / static_cast<double>(d.size() - 8);
  };
  EXPECT_GT(recent_repeats(draw(AccessPattern::Temporal, n_items, n, 1)),
            5 * recent_repeats(draw(AccessPattern::Uniform, n_items, n, 1)));
}

TEST(AccessSampler, DistinctDrawsTerminateEvenWhenSkewed) {
  AccessOptions opt;
  opt.zipf_s = 4.0;  // almost always item of rank 1
  AccessSampler sampler(10, opt, 5);
  for (int i = 0; i < 100; ++i) {
    const auto items = sampler.next_distinct(10);
    EXPECT_EQ(std::set<size_t>(items.begin(), items.end()).size(), 10u);
  }
  EXPECT_THROW(sampler.next_distinct(11), Error);
}

TEST(PoissonArrivals, MeanGapMatchesRate) {
  const auto t = poisson_arrivals(5000, 4.0, 9);
  ASSERT_EQ(t.size(), 5000u);
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
  EXPECT_NEAR(t.back() / 5000.0, 0.25, 0.025);
  for (double x : poisson_arrivals(5, 0, 1)) EXPECT_EQ(x, 0.0);
}

KnowledgeGraph family_graph() {
  KnowledgeGraph kg;
  for (int i = 0; i < 30; ++i) {
    const std::string p = fmt::format("person{}", i);
    kg.add_triple(p, "parent", fmt::format("person{}", (i + 1) % 30));
    kg.add_triple(p, "city", fmt::format("city{}", i % 4));
    kg.add_triple(p, "likes", fmt::format("food{}", i % 5));
  }
  for (int c = 0; c < 4; ++c)
    kg.add_triple(fmt::format("city{}", c), "country", fmt::format("country{}", c % 2));
  kg.finalize();
  return kg;
}

TEST(GraphQa, AnswersAreLeavesOfTheContextPaths) {
  const KnowledgeGraph kg = family_graph();
  GraphQaOptions opt;
  opt.n_items = 20;
  opt.paths_per_entity = 5;
  opt.min_paths = 3;  // the budget gives each of a person's 3 relations one path
  const std::vector<GraphQa> qa = make_graph_qa(kg, opt);
  ASSERT_EQ(qa.size(), 20u);
  std::set<EntityId> topics;
  for (const GraphQa& q : qa) {
    topics.insert(q.topic);
    EXPECT_LE(q.paths.size(), 5u);
    EXPECT_FALSE(q.answers.empty());
    EXPECT_NE(q.question.find(std::string(kg.entity_label(q.topic)) + "?"), std::string::npos) << q.question;
    EXPECT_EQ(q.question.rfind("What is the ", 0), 0u) << q.question;
    for (EntityId a : q.answers) {
      bool on_a_path = false;
      for (const RelationPath& p : q.paths) on_a_path = on_a_path || (p.leaf() == a && p.steps.size() == 2);
      EXPECT_TRUE(on_a_path) << q.question << " -> " << kg.entity_label(a);
    }
  }
  EXPECT_EQ(topics.size(), 20u);
  // Same seed, same set.
  EXPECT_EQ(make_graph_qa(kg, opt)[3].question, qa[3].question);
  opt.n_items = 1000;  // more than the graph has: what exists
  EXPECT_LE(make_graph_qa(kg, opt).size(), kg.n_entities());
  opt.min_paths = 5;  // nobody gets that many within a budget of 5
  EXPECT_THROW(make_graph_qa(kg, opt), Error);

  KnowledgeGraph flat;
  flat.add_triple("a", "r", "b");
  flat.finalize();
  EXPECT_THROW(make_graph_qa(flat, GraphQaOptions{}), Error);  // no 2-hop path anywhere
}

// Synthetic worlds: made-up names, one tail per (entity, relation), so every
// question of 1 or 2 hops has exactly one answer, found on a context path.
TEST(GraphQa, SyntheticWorldsAskQuestionsWithOneAnswer) {
  SyntheticKgOptions so;
  so.n_entities = 60;
  so.n_relations = 6;
  so.facts_per_entity = 3;
  so.seed = 4;
  const KnowledgeGraph kg = make_synthetic_kg(so);
  EXPECT_EQ(kg.n_entities(), 60u);
  EXPECT_EQ(kg.n_relations(), 6u);
  EXPECT_EQ(kg.n_triples(), 180u);
  for (EntityId e = 0; e < kg.n_entities(); ++e) {
    std::set<RelationId> rels;
    for (const Edge& edge : kg.out_edges(e)) {
      EXPECT_TRUE(rels.insert(edge.relation).second) << "one tail per (entity, relation)";
      EXPECT_NE(edge.target, e) << "no self-loop";
    }
    const std::string name(kg.entity_name(e));
    EXPECT_TRUE(std::isupper(static_cast<unsigned char>(name[0])) && name.size() >= 4) << name;
  }
  so.seed = 5;
  EXPECT_NE(make_synthetic_kg(so).entity_name(0), kg.entity_name(0)) << "another world, other names";
  for (int hops : {1, 2}) {
    GraphQaOptions opt;
    opt.n_items = 40;
    opt.paths_per_entity = 30;
    opt.min_paths = 1;
    opt.question_hops = hops;
    for (const GraphQa& q : make_graph_qa(kg, opt)) {
      ASSERT_EQ(q.answers.size(), 1u) << q.question;
      const size_t ofs = q.question.find(" of ");
      EXPECT_EQ(hops == 1 ? ofs : q.question.find(" of ", ofs + 4), q.question.rfind(" of ")) << q.question;
      bool found = false;
      for (const RelationPath& p : q.paths)
        found = found ||
                (p.steps.size() >= static_cast<size_t>(hops) && p.steps[hops - 1].target == q.answers[0]);
      EXPECT_TRUE(found) << q.question;
    }
  }
  GraphQaOptions too_long;
  too_long.question_hops = 3;
  EXPECT_THROW(make_graph_qa(kg, too_long), Error);
  so.facts_per_entity = 7;
  EXPECT_THROW(make_synthetic_kg(so), Error) << "more facts than relations";
}

// A name pool: every world's names come from the same N names, in another
// assignment, so names recur across worlds while their facts do not.
TEST(GraphQa, SyntheticWorldsCanShareANamePool) {
  SyntheticKgOptions so;
  so.n_entities = 40;
  so.name_pool = 50;
  std::set<std::string> all;
  std::vector<std::vector<std::string>> worlds;
  for (uint64_t seed : {1, 2, 3}) {
    so.seed = seed;
    const KnowledgeGraph kg = make_synthetic_kg(so);
    std::vector<std::string> names;
    for (EntityId e = 0; e < kg.n_entities(); ++e) names.emplace_back(kg.entity_name(e));
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), 40u) << "distinct names";
    all.insert(names.begin(), names.end());
    worlds.push_back(names);
  }
  EXPECT_LE(all.size(), 50u) << "every name from the pool";
  EXPECT_GT(all.size(), 40u) << "worlds draw different subsets";
  EXPECT_NE(worlds[0], worlds[1]) << "another assignment per world";
  so.seed = 1;
  EXPECT_EQ(make_synthetic_kg(so).entity_name(7), worlds[0][7]) << "deterministic";
  so.name_pool = 39;
  EXPECT_THROW(make_synthetic_kg(so), Error) << "a pool smaller than the world";
}

// A small world: 30 entities, 3 relations, 2 facts each.
KnowledgeGraph small_world() {
  SyntheticKgOptions so;
  so.n_entities = 30;
  so.n_relations = 3;
  so.facts_per_entity = 2;
  return make_synthetic_kg(so);
}

TEST(GraphWorkload, EntitiesAsDocumentsOfFactSentences) {
  const KnowledgeGraph kg = small_world();
  GraphQaOptions qopt;
  qopt.n_items = 10;
  qopt.min_paths = 1;
  qopt.question_hops = 2;
  const auto qa = make_graph_qa(kg, qopt);
  GraphWorkloadOptions w;
  w.n_requests = 5;
  w.entities_per_request = 3;
  const auto as_paths = make_graph_workload(kg, qa, w);
  w.documents = true;
  const auto as_docs = make_graph_workload(kg, qa, w);
  ASSERT_EQ(as_docs.size(), as_paths.size());
  for (size_t i = 0; i < as_docs.size(); ++i) {
    const RagRequest& r = as_docs[i];
    EXPECT_TRUE(r.entities.empty());
    ASSERT_EQ(r.documents.size(), as_paths[i].entities.size()) << "one document per entity, in order";
    EXPECT_EQ(r.question, as_paths[i].question);
    EXPECT_EQ(r.answers, as_paths[i].answers);
    for (size_t d = 0; d < r.documents.size(); ++d) {
      EXPECT_EQ(r.documents[d].id, as_paths[i].entities[d].name);
      EXPECT_EQ(r.documents[d].title, as_paths[i].entities[d].label);
      // Every step of every path is a sentence, each triple once.
      size_t sentences = 0;
      for (size_t at = 0; (at = r.documents[d].text.find("The ", at)) != std::string::npos; at += 4)
        ++sentences;
      std::set<std::string> triples;
      for (const std::string& p : as_paths[i].entities[d].paths) {
        // "A -r1-> B -r2-> C": consecutive (entity, relation, entity) runs.
        std::vector<std::string> parts;
        std::istringstream in(p);
        for (std::string word; in >> word;) parts.push_back(word);
        for (size_t k = 0; k + 2 < parts.size(); k += 2) {
          const std::string rel = parts[k + 1].substr(1, parts[k + 1].size() - 3);
          triples.insert(fmt::format("The {} of {} is {}.", rel, parts[k], parts[k + 2]));
        }
      }
      EXPECT_EQ(sentences, triples.size()) << r.documents[d].text;
      for (const std::string& t : triples) EXPECT_NE(r.documents[d].text.find(t), std::string::npos) << t;
    }
  }
  // The answer of a 2-hop question is in the topic's document.
  EXPECT_NE(as_docs[0].documents[0].text.find("is " + as_docs[0].answers[0] + "."), std::string::npos);
}

// A cloze question is the asked fact in the context's own notation, cut
// right before the answer: a prefix of one of the asked entity's paths (the
// entities on the way left out at 2 hops), or a sentence of its document.
TEST(GraphWorkload, ClozeQuestionsEndWhereTheAnswerStarts) {
  const KnowledgeGraph kg = small_world();
  for (const int hops : {1, 2}) {
    GraphQaOptions qopt;
    qopt.n_items = 10;
    qopt.min_paths = 1;
    qopt.question_hops = hops;
    const auto qa = make_graph_qa(kg, qopt);
    GraphWorkloadOptions w;
    w.n_requests = 8;
    w.entities_per_request = 2;
    const auto words = make_graph_workload(kg, qa, w);
    w.question_form = QuestionForm::Cloze;
    const auto as_paths = make_graph_workload(kg, qa, w);
    w.documents = true;
    const auto as_docs = make_graph_workload(kg, qa, w);
    for (size_t i = 0; i < as_paths.size(); ++i) {
      EXPECT_EQ(as_paths[i].answers, words[i].answers) << "the same question, asked otherwise";
      ASSERT_EQ(as_paths[i].answers.size(), 1u);
      const std::string& answer = as_paths[i].answers[0];
      // "A -r1-> -r2->" asks the path "A -r1-> X -r2-> answer".
      std::vector<std::string> asked;
      std::istringstream in(as_paths[i].question);
      for (std::string word; in >> word;) asked.push_back(word);
      ASSERT_EQ(asked.size(), static_cast<size_t>(hops + 1)) << as_paths[i].question;
      EXPECT_TRUE(asked[1].starts_with("-") && asked[1].ends_with("->")) << as_paths[i].question;
      bool found = false;
      for (const std::string& p : as_paths[i].entities[0].paths) {
        std::vector<std::string> parts;
        std::istringstream pin(p);
        for (std::string word; pin >> word;) parts.push_back(word);
        if (parts.size() < 2 * asked.size() - 1) continue;
        bool same = parts[0] == asked[0] && parts[2 * asked.size() - 2] == answer;
        for (size_t k = 1; k < asked.size(); ++k) same = same && parts[2 * k - 1] == asked[k];
        found = found || same;
      }
      EXPECT_TRUE(found) << as_paths[i].question << " " << answer;
      // Over documents: "The r2 of the r1 of A is"; at 1 hop, the sentence's stem.
      std::string stem = "The ";
      for (size_t k = asked.size(); k-- > 1;)
        stem += asked[k].substr(1, asked[k].size() - 3) + (k > 1 ? " of the " : " of ");
      EXPECT_EQ(as_docs[i].question, stem + asked[0] + " is");
      if (hops == 1) {
        EXPECT_NE(as_docs[i].documents[0].text.find(as_docs[i].question + " " + answer + "."),
                  std::string::npos)
            << as_docs[i].question;
      }
    }
  }
  EXPECT_EQ(parse_question_form("cloze"), QuestionForm::Cloze);
  EXPECT_EQ(parse_question_form("words"), QuestionForm::Words);
  EXPECT_FALSE(parse_question_form("riddle"));
}

// A default synthetic world of n_entities, with up to n_items QA items of
// any number of paths.
std::pair<KnowledgeGraph, std::vector<GraphQa>> synthetic_qa(size_t n_entities, size_t n_items) {
  SyntheticKgOptions so;
  so.n_entities = n_entities;
  KnowledgeGraph kg = make_synthetic_kg(so);
  GraphQaOptions qopt;
  qopt.n_items = n_items;
  qopt.min_paths = 1;
  std::vector<GraphQa> qa = make_graph_qa(kg, qopt);
  return {std::move(kg), std::move(qa)};
}

// Each QA item by its topic entity's name, as requests name their entities.
std::map<std::string, const GraphQa*> items_by_topic(const KnowledgeGraph& kg,
                                                     const std::vector<GraphQa>& qa) {
  std::map<std::string, const GraphQa*> out;
  for (const GraphQa& q : qa) out[std::string(kg.entity_name(q.topic))] = &q;
  return out;
}

TEST(GraphWorkload, EachOnceAsksEveryItemInOrder) {
  const auto [kg, qa] = synthetic_qa(30, 12);
  GraphWorkloadOptions w;
  w.n_requests = 3;  // ignored
  w.entities_per_request = 4;
  w.each_once = true;
  const auto reqs = make_graph_workload(kg, qa, w);
  ASSERT_EQ(reqs.size(), qa.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].question, qa[i].question);
    ASSERT_EQ(reqs[i].entities.size(), 4u);
    EXPECT_EQ(reqs[i].entities[0].name, kg.entity_name(qa[i].topic));
    std::set<std::string> names;
    for (const RequestEntity& e : reqs[i].entities) names.insert(e.name);
    EXPECT_EQ(names.size(), 4u) << "distinct entities";
  }
}

TEST(GraphWorkload, RequestsCarryTheTopicFirst) {
  const KnowledgeGraph kg = family_graph();
  GraphQaOptions qopt;
  qopt.n_items = 25;
  qopt.min_paths = 1;
  const auto qa = make_graph_qa(kg, qopt);
  GraphWorkloadOptions wopt;
  wopt.n_requests = 50;
  wopt.entities_per_request = 4;
  wopt.rate = 2;
  const auto reqs = make_graph_workload(kg, qa, wopt);
  ASSERT_EQ(reqs.size(), 50u);
  for (const RagRequest& r : reqs) {
    ASSERT_EQ(r.entities.size(), 4u);
    std::set<std::string> names;
    for (const auto& e : r.entities) {
      names.insert(e.name);
      EXPECT_FALSE(e.paths.empty());
      for (const auto& p : e.paths) EXPECT_EQ(p.rfind(e.label, 0), 0u) << p;  // paths start at their root
    }
    EXPECT_EQ(names.size(), 4u);
    EXPECT_NE(r.question.find(r.entities[0].label + "?"), std::string::npos);
    EXPECT_FALSE(r.answers.empty());
  }
  EXPECT_GT(reqs.back().arrival_s, 0.0);
}

TEST(GraphWorkload, QuestionsPerContextAskAboutEachEntityInTurn) {
  const auto [kg, qa] = synthetic_qa(40, 20);
  GraphWorkloadOptions w;
  w.n_requests = 8;  // two whole contexts and two questions of a third
  w.entities_per_request = 3;
  w.questions_per_context = 3;
  const auto reqs = make_graph_workload(kg, qa, w);
  ASSERT_EQ(reqs.size(), 8u);
  const auto by_topic = items_by_topic(kg, qa);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RagRequest& r = reqs[i];
    const size_t first = i - i % 3;
    EXPECT_TRUE(same_context(r, reqs[first])) << i;
    if (i % 3 == 0 && i > 0) {
      EXPECT_FALSE(same_context(r, reqs[i - 1])) << "a new context every third request";
    }
    ASSERT_EQ(r.entities.size(), 3u);
    const GraphQa& asked = *by_topic.at(r.entities[i % 3].name);
    EXPECT_EQ(r.question, asked.question) << "request " << i << " asks about entity " << i % 3;
    EXPECT_EQ(r.answers.front(), kg.entity_label(asked.answers.front()));
  }
  // One question per context is the plain stream.
  w.entities_per_request = 2;
  w.questions_per_context = 1;
  for (const RagRequest& r : make_graph_workload(kg, qa, w))
    EXPECT_EQ(r.question, by_topic.at(r.entities[0].name)->question) << "the first entity asks";
  // Asking every item once leaves one question per context; zero is refused.
  w.each_once = true;
  w.questions_per_context = 2;
  EXPECT_THROW(make_graph_workload(kg, qa, w), Error);
  w.each_once = false;
  w.questions_per_context = 0;
  EXPECT_THROW(make_graph_workload(kg, qa, w), Error);
}

TEST(GraphWorkload, QuestionsBeyondTheEntitiesAskTheirOtherRelations) {
  const auto [kg, qa] = synthetic_qa(40, 20);
  const auto by_topic = items_by_topic(kg, qa);
  GraphWorkloadOptions w;
  w.n_requests = 200;
  w.entities_per_request = 2;
  w.questions_per_context = 1000;  // every question each context can ask
  const auto reqs = make_graph_workload(kg, qa, w);
  // Split the stream into its contexts and check each context's questions
  // against every relation prefix of its entities' paths.
  size_t contexts = 0, beyond = 0;
  for (size_t begin = 0, end = 0; begin < reqs.size(); begin = end) {
    for (end = begin + 1; end < reqs.size() && same_context(reqs[begin], reqs[end]);) ++end;
    if (end == reqs.size()) break;  // the last context may be cut short by n_requests
    ++contexts;
    const auto& entities = reqs[begin].entities;
    std::map<std::string, std::vector<std::string>> expected;  // question -> answers
    std::set<std::string> asked;
    for (size_t e = 0; e < entities.size(); ++e) {
      const GraphQa& item = *by_topic.at(entities[e].name);
      const size_t hops = item.asked.steps.size();
      EXPECT_EQ(reqs[begin + e].question, item.question) << "each entity's own question first";
      // Every distinct relation prefix of the item's paths is asked once.
      for (const RelationPath& p : item.paths) {
        if (p.steps.size() < hops) continue;
        RelationPath head = p;
        head.steps.resize(hops);
        GraphQa q = item;
        ask_about(kg, q, head);
        for (const EntityId a : q.answers) expected[q.question].emplace_back(kg.entity_label(a));
      }
    }
    for (size_t i = begin; i < end; ++i) {
      const RagRequest& r = reqs[i];
      EXPECT_TRUE(asked.insert(r.question).second) << "asked twice: " << r.question;
      ASSERT_TRUE(expected.count(r.question)) << "not a question of this context: " << r.question;
      EXPECT_EQ(r.answers, expected.at(r.question)) << r.question;
      if (i >= begin + entities.size()) ++beyond;
    }
    EXPECT_EQ(asked.size(), expected.size()) << "context at request " << begin;
  }
  EXPECT_GT(contexts, 3u);
  EXPECT_GT(beyond, contexts) << "contexts ask more questions than they have entities";
}

TEST(GraphWorkload, AskAboutAnswersWithEveryEntityTheRelationsReach) {
  KnowledgeGraph kg;
  kg.add_triple("ann", "friend", "bob");
  kg.add_triple("ann", "friend", "cy");
  kg.add_triple("ann", "boss", "dan");
  kg.add_triple("bob", "home", "oslo");
  kg.add_triple("cy", "home", "rome");
  kg.add_triple("dan", "home", "oslo");
  kg.finalize();
  GraphQaOptions o;
  o.n_items = 10;
  o.min_paths = 1;
  GraphQa item;
  for (GraphQa& q : make_graph_qa(kg, o))
    if (kg.entity_name(q.topic) == "ann") item = q;
  ASSERT_EQ(kg.entity_name(item.topic), "ann");
  const auto answers = [&](const GraphQa& q) {
    std::set<std::string> out;
    for (const EntityId a : q.answers) out.emplace(kg.entity_label(a));
    return out;
  };
  for (const RelationPath& p : item.paths) {
    GraphQa q = item;
    ask_about(kg, q, p);
    const std::string first(kg.relation_name(p.steps[0].relation));
    if (p.steps.size() == 2) {
      const std::set<std::string> homes =
          first == "friend" ? std::set<std::string>{"oslo", "rome"} : std::set<std::string>{"oslo"};
      EXPECT_EQ(answers(q), homes) << q.question;
    }
    RelationPath head = p;
    head.steps.resize(1);
    ask_about(kg, q, head);
    const std::set<std::string> people =
        first == "friend" ? std::set<std::string>{"bob", "cy"} : std::set<std::string>{"dan"};
    EXPECT_EQ(answers(q), people) << q.question;
    EXPECT_EQ(q.question, "What is the " + first + " of ann?");
  }
}

TEST(GraphWorkload, AskAboutFindsEveryLeafOfTheRelations) {
  const auto [kg, qa] = synthetic_qa(40, 20);
  for (const GraphQa& item : qa)
    for (const RelationPath& p : item.paths) {
      GraphQa q = item;
      ask_about(kg, q, p);
      EXPECT_EQ(q.asked.steps.size(), p.steps.size());
      EXPECT_NE(std::find(q.answers.begin(), q.answers.end(), p.leaf()), q.answers.end())
          << "the asked path's own leaf answers it";
      EXPECT_NE(q.question.find(kg.entity_label(item.topic)), std::string::npos);
      // Every answer is reached by the same relations from the topic.
      for (const EntityId a : q.answers) {
        const bool reached = std::any_of(item.paths.begin(), item.paths.end(), [&](const RelationPath& o) {
          if (o.steps.size() < p.steps.size()) return false;
          for (size_t s = 0; s < p.steps.size(); ++s)
            if (o.steps[s].relation != p.steps[s].relation || o.steps[s].inverse != p.steps[s].inverse)
              return false;
          RelationPath head = o;
          head.steps.resize(p.steps.size());
          return head.leaf() == a;
        });
        EXPECT_TRUE(reached) << q.question;
      }
    }
}

TEST(Locality, HandComputedReport) {
  const std::vector<std::vector<ItemUse>> reqs = {
      {{"a", "a", 5, {}}, {"b", "b", 3, {}}}, {{"a", "a", 5, {}}}, {{"c", "c", 2, {}}}};
  const LocalityReport r = locality_report(reqs);
  EXPECT_EQ(r.n_requests, 3u);
  EXPECT_EQ(r.n_item_uses, 4u);
  EXPECT_EQ(r.n_distinct_items, 3u);
  EXPECT_DOUBLE_EQ(r.top20_request_share, 2.0 / 3.0);  // top 20% of 3 items = {a}
  EXPECT_DOUBLE_EQ(r.top20_use_share, 0.5);
  EXPECT_EQ(r.total_tokens, 15);
  EXPECT_EQ(r.distinct_tokens, 10);
  EXPECT_DOUBLE_EQ(r.reuse_upper_bound, 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(r.mean_request_hit_bound, 1.0 / 3.0);  // 0, 1, 0
  EXPECT_EQ(r.top20_cut_ties, 0u);
  // Without sequences, prefix reuse is whole-item reuse.
  EXPECT_DOUBLE_EQ(r.prefix_reuse_upper_bound, r.reuse_upper_bound);
  EXPECT_DOUBLE_EQ(r.mean_request_prefix_hit_bound, r.mean_request_hit_bound);
  EXPECT_EQ(locality_report({}).n_requests, 0u);
}

// Frequency counts items, reuse counts content; prefix reuse works per item
// over the trie of everything that item held before.
TEST(Locality, ItemsContentsAndPrefixReuse) {
  using Seqs = std::vector<std::vector<int32_t>>;
  const std::vector<std::vector<ItemUse>> reqs = {
      {{"e", "e1", 4, Seqs{{1, 2, 3}, {1, 2, 4}}}},
      {{"e", "e2", 4, Seqs{{1, 2, 3}, {1, 5}}}, {"f", "f1", 3, Seqs{{1, 2, 3}}}},
      {{"f", "f1", 3, Seqs{{1, 2, 3}}}}};
  const LocalityReport r = locality_report(reqs);
  EXPECT_EQ(r.n_distinct_items, 2u);
  EXPECT_EQ(r.n_distinct_contents, 3u);
  EXPECT_EQ(r.total_tokens, 14);
  EXPECT_EQ(r.distinct_tokens, 11);
  EXPECT_DOUBLE_EQ(r.reuse_upper_bound, 3.0 / 14.0);
  EXPECT_DOUBLE_EQ(r.mean_request_hit_bound, 1.0 / 3.0);  // 0, 0, 1
  // e's second version reuses 1 2 3 (not 5); f's first use reuses nothing
  // although e held the same tokens: prefixes are rooted at the item.
  EXPECT_DOUBLE_EQ(r.prefix_reuse_upper_bound, 6.0 / 14.0);
  EXPECT_DOUBLE_EQ(r.mean_request_prefix_hit_bound, (0.0 + 3.0 / 7.0 + 1.0) / 3.0);
  // e and f tie at 2 uses; the top 20% (one item) is e by name.
  EXPECT_EQ(r.top20_cut_ties, 1u);
  EXPECT_DOUBLE_EQ(r.top20_request_share, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(r.top20_use_share, 0.5);
}

TEST(RequestFile, RoundTripAndErrors) {
  RagRequest graph;
  graph.id = "g1";
  graph.arrival_s = 1.5;
  graph.question = "What is the parent of person1?";
  graph.answers = {"person2"};
  graph.entities.push_back({"person1", "person1", {"person1 -parent-> person2"}});
  RagRequest docs;
  docs.id = "d1";
  docs.question = "q";
  docs.documents.push_back({"7", "Title", "Text \xC3\xA9"});
  RagRequest plain;
  plain.text = "Once upon a time";
  const auto path = test::temp_path("requests") += ".jsonl";
  write_requests(path, {graph, docs, plain});
  const auto back = read_requests(path);
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].entities[0].paths, graph.entities[0].paths);
  EXPECT_EQ(back[0].arrival_s, 1.5);
  EXPECT_EQ(back[1].documents[0].text, docs.documents[0].text);
  EXPECT_EQ(back[2].text, "Once upon a time");
  EXPECT_EQ(back[2].id, "2");  // a missing id becomes the line's index

  const auto expect_error = [&](const std::string& content, const std::string& needle) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    try {
      read_requests(path);
      ADD_FAILURE() << "accepted: " << content;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("{\"question\": \"ok\"}\n{bad json\n", ".jsonl:2");
  expect_error("{\"question\": \"q\", \"text\": \"t\", \"documents\": [{\"id\": \"1\", \"text\": \"x\"}]}\n",
               "not several");
  expect_error("{\"id\": \"x\"}\n", "missing \"question\"");
  expect_error("{\"question\": \"q\", \"documents\": [{\"title\": \"t\"}]}\n",
               "documents[0]: missing \"id\"");
  expect_error("{\"question\": \"q\", \"entities\": [{\"name\": \"e\", \"paths\": [1]}]}\n",
               "array of strings");
  expect_error("{\"question\": \"q\", \"entities\": [{\"name\": \"\", \"label\": \"Tea\"}]}\n",
               "entities[0]: \"name\" is empty");
  expect_error("{\"question\": \"q\", \"arrival_s\": -1}\n", "arrival_s");
  expect_error("{\"question\": \"q\", \"arrival_s\": 1e999}\n", ".jsonl:1");  // out of range number
  expect_error("\n\n", "no requests");
  std::filesystem::remove(path);
  try {
    read_requests(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
  }
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

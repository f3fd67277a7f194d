// SubGCache's experiment: clusters of queries, one prefill per cluster.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "eval/experiments.h"
#include "retrieval/workload.h"
#include "strategy/subgcache.h"

namespace depcache::experiments {

namespace {

// (query, key) pairs per layer and request, averaged over the run.
double attention_pairs(const StrategyRun& run) {
  double p = 0;
  for (const RequestRow& row : run.rows) p += static_cast<double>(row.report.attention_pairs);
  return p / static_cast<double>(std::max<size_t>(run.rows.size(), 1));
}

// Per-query prompts, then SubGCache at each cluster count over one batch:
// the table's rows, a plot's data, and the best TTFT and token gains and the
// range of exact-match changes.
struct ClusterSweep {
  std::vector<std::vector<std::string>> rows;
  std::string dat;
  double best_gain = 0, best_tokens = 0, em_lo = 100, em_hi = -100;
  Summary per_query;
  std::vector<std::pair<size_t, Summary>> by_clusters;  // in the sweep's order
};

// SubGCache's paper tunes the number of clusters per dataset; here a batch
// chooses it: among the counts that merge queries (fewer clusters than
// queries), the one with the lowest mean TTFT whose exact match stays within
// this many points of per-query prompts' (the paper's worst change is -1).
// 0: none qualifies.
constexpr double kClusterTolerance = 1.0;

size_t chosen_clusters(const ClusterSweep& w, size_t batch) {
  size_t best = 0;
  double best_mean = 0;
  for (const auto& [k, s] : w.by_clusters)
    if (k < batch && s.exact >= w.per_query.exact - kClusterTolerance && (best == 0 || s.mean < best_mean)) {
      best = k;
      best_mean = s.mean;
    }
  return best;
}

// The chosen count on another batch of the same kind: per-query prompts
// against SubGCache at it.
struct HeldOut {
  size_t clusters = 0;
  Summary per_query, subgcache;
};

// SubGCache over `reqs` as one batch in `clusters` clusters, 12 greedy tokens.
StrategyRun serve_clustered(EvalContext& c, const std::vector<RagRequest>& reqs,
                            const std::shared_ptr<const Model>& model, const std::string& format,
                            size_t clusters) {
  SubgcacheOptions so;
  so.clusters = clusters;
  so.batch = reqs.size();
  return serve("subgcache", reqs, model, c.args(), 12, false, nullptr, &so, {}, format);
}

// The sweep over `reqs`, the graph in `format`, at each count of `clusters`.
ClusterSweep sweep_clusters(EvalContext& c, const std::vector<RagRequest>& reqs,
                            const std::shared_ptr<const Model>& model, const std::string& format,
                            const std::vector<size_t>& clusters) {
  EvalReport& r = c.report;
  ClusterSweep w;
  stage(fmt::format("subgcache: {} queries, graph as {}", reqs.size(), format));
  const StrategyRun per_query_run =
      serve("full", reqs, model, c.args(), 12, false, nullptr, nullptr, {}, format);
  const Summary per_query = summarize(per_query_run);
  w.per_query = per_query;
  w.rows.push_back({"per-query prompts (full)", "-", r.num(per_query.mean), r.num(per_query.computed, 0),
                    r.num(attention_pairs(per_query_run) / 1e3), r.num(per_query.exact) + "%"});
  for (size_t k : clusters) {
    const StrategyRun run = serve_clustered(c, reqs, model, format, k);
    const Summary s = summarize(run);
    w.rows.push_back(
        {fmt::format("subgcache, {} of {} queries per cluster",
                     k == reqs.size() ? std::string("1") : fmt::format("~{}", (reqs.size() + k - 1) / k),
                     reqs.size()),
         std::to_string(k), r.num(s.mean), r.num(s.computed, 0), r.num(attention_pairs(run) / 1e3),
         r.num(s.exact) + "%"});
    w.dat += fmt::format("{} {} {}\n", k, s.mean, s.exact);
    w.by_clusters.emplace_back(k, s);
    w.best_gain = std::max(w.best_gain, per_query.mean / s.mean);
    w.best_tokens = std::max(w.best_tokens, per_query.computed / std::max(s.computed, 1.0));
    w.em_lo = std::min(w.em_lo, s.exact - per_query.exact);
    w.em_hi = std::max(w.em_hi, s.exact - per_query.exact);
  }
  return w;
}

HeldOut held_out(EvalContext& c, const ClusterSweep& tuned, const std::vector<RagRequest>& reqs,
                 const std::shared_ptr<const Model>& model, const std::string& format) {
  HeldOut h;
  h.clusters = chosen_clusters(tuned, reqs.size());
  if (h.clusters == 0) return h;
  stage(fmt::format("subgcache: held-out batch, {} clusters, graph as {}", h.clusters, format));
  h.per_query = summarize(serve("full", reqs, model, c.args(), 12, false, nullptr, nullptr, {}, format));
  h.subgcache = summarize(serve_clustered(c, reqs, model, format, h.clusters));
  return h;
}

// "k clusters: x% against y% per query, mean TTFT z lower".
std::string held_out_figures(EvalReport& r, const HeldOut& h) {
  if (h.clusters == 0)
    return fmt::format("no count that merges queries stays within {:.0f} point on the batch above",
                       kClusterTolerance);
  return fmt::format("{} clusters: {}% against {}% per query, mean TTFT {} lower", h.clusters,
                     r.num(h.subgcache.exact), r.num(h.per_query.exact),
                     r.ratio(h.per_query.mean, h.subgcache.mean));
}

const std::vector<std::string>& sweep_header() {
  static const std::vector<std::string> header = {
      "serving",    "clusters", "TTFT mean ms", "tokens computed per query", "attention pairs (k)",
      "exact match"};
  return header;
}

std::string sweep_plot() {
  return std::string(kLinePlot) +
         "set logscale x; set xlabel 'clusters'; set ylabel 'mean TTFT (ms)'; set y2label 'exact match "
         "(%)'; set y2tics; plot $DATA using 1:2 with linespoints title 'TTFT', '' using 1:3 axes x1y2 with "
         "linespoints title 'exact match'";
}

// Why the answers fall with fewer clusters: how the model answers when a
// query alone carries as many entities as a merged cluster does.
void entity_width_table(EvalContext& c, const KnowledgeGraph& kg, const AskOptions& a,
                        const std::shared_ptr<const Model>& model) {
  EvalReport& r = c.report;
  std::vector<std::vector<std::string>> width;
  for (size_t e : {3, 5, 8, 12}) {
    AskOptions w = a;
    w.entities = e;
    const Summary s = summarize(serve("full", ask(kg, w), model, c.args(), 12, false));
    width.push_back({std::to_string(e), r.num(s.prompt, 0), r.num(s.exact) + "%"});
  }
  r.text(
      "The relation-path model under full attention, each query with more context entities of its own (it "
      "was trained on 1 to 3):");
  r.table({"entities per query", "prompt tokens", "exact match"}, width);
}

void subgcache_versus(EvalReport& r, const ClusterSweep& csv, const ClusterSweep& paths,
                      const HeldOut& csv_held, const HeldOut& paths_held) {
  r.versus(
      {{"TTFT reduction", "up to 6.68x (Table 2; Llama-2-7B, Scene Graph)",
        fmt::format("CSV: up to {:.2f}x (mean), tokens computed up to {:.2f}x fewer; paths: up to {:.2f}x, "
                    "{:.2f}x fewer",
                    csv.best_gain, csv.best_tokens, paths.best_gain, paths.best_tokens),
        "a cluster's union is longer than any member's own context, and with a 64-wide model attention "
        "over it, not the matmuls, is most of a query's cost (attention pairs above); the queries of a "
        "cluster also wait for its prefill"},
       {"accuracy change", "-1.00 to +9.00 points (Table 2)",
        fmt::format("CSV: {:+.1f} to {:+.1f} points; paths: {:+.1f} to {:+.1f} points", csv.em_lo, csv.em_hi,
                    paths.em_lo, paths.em_hi),
        "a merged cluster holds several entities: the CSV model reads them far less well than one "
        "(docs/training.md) and never saw more than 4 in one context, the paths model more than 3 (table "
        "above); the paper's 3-7B models read long subgraphs"},
       {"clusters chosen per dataset, accuracy at the choice", "tuned per dataset; -1 to +9 points there",
        fmt::format("on a held-out batch, CSV {}; paths {}", held_out_figures(r, csv_held),
                    held_out_figures(r, paths_held)),
        fmt::format("chosen on the batch above (the fastest count within {:.0f} point of per-query exact "
                    "match), measured on another batch of the same world (another seed)",
                    kClusterTolerance)}});
}

}  // namespace

void subgcache(EvalContext& c) {
  EvalReport& r = c.report;
  r.section("SubGCache: clusters of queries, one prefill per cluster");
  const KnowledgeGraph kg = world(9002);
  const size_t n = c.n(32, 100);
  std::vector<size_t> clusters =
      c.o.quick ? std::vector<size_t>{1, 4, 8, 16} : std::vector<size_t>{1, 2, 4, 8, 16, 32, 64};
  clusters.push_back(n);

  // SubGCache's own form: each query's subgraph, and a cluster's
  // representative, as G-Retriever's CSV, read by the QA model trained on it.
  const auto csv_model = load_shipped(c, "depcache-qa-csv.gguf");
  AskOptions ca;
  ca.each_once = false;
  ca.requests = n;
  ca.seed = 29;
  ca.entities = 1;
  ca.context_hops = 1;
  ca.form = QuestionForm::Words;
  const ClusterSweep csv = sweep_clusters(c, ask(kg, ca), csv_model, "csv", clusters);
  AskOptions ca_held = ca;
  ca_held.seed = 30;
  r.text(fmt::format(
      "One batch of {} Zipf queries over a held-out world, all arriving at once, 12 greedy tokens. First "
      "SubGCache's own form: each query's subgraph (the asked entity with its direct facts; the question in "
      "words, \"What is the r of A?\") and each cluster's representative (the union "
      "of its members' subgraphs) as G-Retriever's CSV, read by `depcache-qa-csv.gguf`, the QA model trained "
      "on CSV contexts of 1 to 4 entities (docs/training.md). TTFT: mean from arrival; attention pairs: "
      "(query, key) pairs per layer and request, in thousands.",
      n));
  r.table(sweep_header(), csv.rows);
  r.plot("subgcache-csv", csv.dat, sweep_plot());

  // The same comparison over relation paths, with the shipped causal model.
  const auto model = load_shipped(c, "depcache-qa.gguf");
  AskOptions a;
  a.each_once = false;
  a.requests = n;
  a.seed = 29;
  const ClusterSweep paths = sweep_clusters(c, ask(kg, a), model, "paths", clusters);
  AskOptions a_held = a;
  a_held.seed = 30;
  const HeldOut csv_held = held_out(c, csv, ask(kg, ca_held), csv_model, "csv");
  const HeldOut paths_held = held_out(c, paths, ask(kg, a_held), model, "paths");
  r.text(
      "Then the graph as relation paths (`--graph-format paths`), the form the shipped causal QA model "
      "`depcache-qa.gguf` reads: 3 entities of 9 relation paths each per query, 1-hop cloze questions; a "
      "cluster's representative is the union of its members' relation paths.");
  r.table(sweep_header(), paths.rows);
  r.plot("subgcache", paths.dat, sweep_plot());
  entity_width_table(c, kg, a, model);
  subgcache_versus(r, csv, paths, csv_held, paths_held);
}

}  // namespace depcache::experiments

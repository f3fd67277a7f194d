#include "eval/stream.h"

#include <algorithm>

#include "retrieval/workload.h"
#include "util/error.h"

namespace depcache {

Stream prepare_stream(std::vector<RagRequest> requests, std::vector<RagRequest> warmup,
                      const StreamOptions& o, const Tokenizer& tok, const RagWrapper& tmpl, int max_tokens) {
  Stream s;
  if (o.limit > 0 && requests.size() > o.limit) requests.resize(o.limit);
  if (o.rate > 0) {
    const std::vector<double> at = poisson_arrivals(requests.size(), o.rate, o.seed);
    for (size_t i = 0; i < requests.size(); ++i) requests[i].arrival_s = at[i];
  } else {
    for (RagRequest& r : requests) r.arrival_s /= o.rate_scale;
  }
  std::stable_sort(requests.begin(), requests.end(),
                   [](const RagRequest& a, const RagRequest& b) { return a.arrival_s < b.arrival_s; });
  if (o.subgcache) {
    SubgcacheOptions clustering = o.subgcache_options;
    if (o.graph_format == "paths") clustering.form = SubgraphForm::Paths;
    s.subgcache = plan_subgcache(requests, clustering);
    for (size_t i : s.subgcache.order) s.clustered.push_back(s.subgcache.requests[i]);
  }
  if (o.graph_format == "csv" || (o.graph_format == "auto" && o.subgcache)) {
    // The warm-up too, in the form the measured stream has.
    for (std::vector<RagRequest>* set : {&requests, &warmup})
      for (RagRequest& r : *set) {
        if (r.entities.empty())
          fail(ErrorKind::InvalidInput, "graph as CSV ({}): request {} has no entities (no graph to show)",
               o.graph_format == "csv" ? "--graph-format csv" : "subgcache is in the run", r.id);
        r = with_subgraph_csv(r, request_subgraph(r));
      }
  }
  // Every request must fit the assembly before any runs: prompt (flat or
  // merged, whichever the strategies build) plus the generated tokens.
  const auto add = [&](std::vector<PromptParts>& to, const RagRequest& r, const std::string& name,
                       bool total) {
    to.push_back(make_prompt_parts(tok, r, tmpl));
    const int64_t n =
        std::max(to.back().n_flat_tokens(), static_cast<int64_t>(to.back().dep_prompt().size())) +
        max_tokens - 1;
    if (n > s.largest_rows) s.largest_rows = n, s.largest = name;
    if (total) s.total_rows += n;
  };
  for (const RagRequest& r : requests) add(s.parts, r, r.id, true);
  for (const RagRequest& r : s.clustered)
    add(s.clustered_parts, r, r.id + " (its cluster's subgraph)", false);
  for (const RagRequest& r : warmup) add(s.warmup_parts, r, "warm-up " + r.id, false);
  s.requests = std::move(requests);
  s.warmup = std::move(warmup);
  return s;
}

int64_t pool_rows(const Stream& s, int64_t ctx, int max_tokens) {
  const int64_t need = s.largest_rows;
  const int64_t rows = ctx > 0 ? ctx : std::max(need, std::min(s.total_rows, 8 * need));
  if (need > rows)
    fail(ErrorKind::LimitExceeded,
         "request {} needs {} KV rows (prompt + {} generated tokens), more than the context size {}",
         s.largest, need, max_tokens, rows);
  return rows;
}

}  // namespace depcache

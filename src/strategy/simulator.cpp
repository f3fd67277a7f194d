#include "strategy/simulator.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "kv/pin_lease.h"
#include "kv/radix_index.h"
#include "strategy/admission.h"
#include "strategy/strategy.h"
#include "util/error.h"
#include "util/hash.h"

namespace depcache {
namespace {

// One byte per token: the budget is counted in tokens.
constexpr size_t kBytesPerToken = 1;

struct Prepared {
  std::vector<Lookup> lookups;              // the runs as the scheduler and lookahead see them
  std::vector<std::vector<int64_t>> items;  // rows of each context item
};

}  // namespace

std::vector<SimulatedRequest> simulated_requests(const std::vector<PromptParts>& parts,
                                                 std::string_view strategy, PositionScheme scheme) {
  StrategyOptions o;
  o.scheme = scheme;
  const auto s = make_strategy(strategy, 0, DType::F16, o);
  std::vector<SimulatedRequest> out;
  out.reserve(parts.size());
  const bool flat = strategy == "full" || strategy == "prefix" || strategy == "ragcache";
  for (const PromptParts& p : parts) {
    RequestPlan plan = s->plan(p);
    SimulatedRequest r{std::move(plan.runs), static_cast<int64_t>(plan.tokens.size()), {}};
    if (flat) r.item_rows = p.flat_item_ranges();
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

std::vector<SimulatedRequest> depcache_requests(const std::vector<DepPrompt>& prompts,
                                                PositionScheme scheme) {
  std::vector<SimulatedRequest> out;
  out.reserve(prompts.size());
  for (const DepPrompt& p : prompts)
    out.push_back({dependency_runs(p, 0, scheme), static_cast<int64_t>(p.size())});
  return out;
}

}  // namespace

SimulationResult simulate(const std::vector<DepPrompt>& prompts, const SimulationOptions& o) {
  return simulate(depcache_requests(prompts, o.scheme), o);
}

int64_t distinct_kv_tokens(const std::vector<DepPrompt>& prompts, PositionScheme scheme) {
  return distinct_kv_tokens(depcache_requests(prompts, scheme));
}

namespace {

// Each request's runs as lookups, and the rows of each of its context items.
std::vector<Prepared> prepare(const std::vector<SimulatedRequest>& requests) {
  std::vector<Prepared> reqs(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    std::map<int32_t, std::set<int64_t>> items;
    for (const CacheRun& run : requests[i].runs) {
      reqs[i].lookups.push_back({run.ns, run.tokens, run.stops});
      if (run.segment >= 0) items[run.segment].insert(run.rows.begin(), run.rows.end());
    }
    for (const auto& [segment, rows] : items) reqs[i].items.emplace_back(rows.begin(), rows.end());
    for (const auto& [begin, end] : requests[i].item_rows) {
      reqs[i].items.emplace_back();
      for (int64_t row = begin; row < end; ++row) reqs[i].items.back().push_back(row);
    }
  }
  return reqs;
}

// Picks the next request of `queue` as the engine admits one and takes it
// out of the queue; returns its id.
size_t admit_next(const Admission& admission, const RadixIndex& index, std::vector<size_t>& queue,
                  const std::vector<Prepared>& reqs, const std::vector<SimulatedRequest>& requests,
                  std::vector<int>& passed_over) {
  std::vector<WaitingRequest> waiting;
  for (size_t q : queue) waiting.push_back({&reqs[q].lookups, requests[q].tokens, &passed_over[q]});
  const size_t pick = admission.pick(waiting, index);
  Admission::admitted(waiting, pick);
  const size_t id = queue[pick];
  queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(pick));
  return id;
}

struct Served {
  int64_t cached = 0;  // prompt tokens found cached
  int64_t items = 0, items_hit = 0;
};

// Serves one request: matches every run (what is cached), then inserts what
// was not; `refresh_lookahead` runs once its nodes are in, while they are
// still pinned.
template <class Refresh>
Served serve_request(RadixIndex& index, const SimulatedRequest& req, const Prepared& prepared,
                     const Refresh& refresh_lookahead) {
  Served out;
  PinLease lease(index);
  std::vector<bool> cached_row(static_cast<size_t>(req.tokens), false);
  const uint64_t tick = index.begin_request();  // a node shared by the request's paths counts once
  for (const CacheRun& run : req.runs) {
    RadixIndex::Match m = match_run(index, run, tick);
    for (int64_t t = 0; t < m.length; ++t) cached_row[run.rows[t]] = true;
    lease.hold(m);
  }
  int64_t cached = 0;
  for (bool c : cached_row) cached += c;
  cached = std::min(cached, req.tokens - 1);  // the last token always runs
  for (const std::vector<int64_t>& rows : prepared.items) {
    ++out.items;
    out.items_hit += std::all_of(rows.begin(), rows.end(), [&](int64_t row) { return cached_row[row]; });
  }
  // The request's cost per computed token, from the profiled table.
  const double cost = index.cost_per_token(cached, req.tokens - cached, 1.0);
  // The request's own runs stay pinned until all are in (it is using
  // them); then the index goes back to its budget.
  for (const CacheRun& run : req.runs) {
    if (run.insert == RunInsert::Never) continue;  // looked up only
    RadixIndex::Match path;
    insert_run(index, run, nullptr, kBytesPerToken, cost, &path);
    lease.hold(path);
  }
  refresh_lookahead();
  lease.release();
  out.cached = cached;
  return out;
}

}  // namespace

SimulationResult simulate(const std::vector<SimulatedRequest>& requests, const SimulationOptions& o) {
  const Admission admission({o.scheduler, o.window, policy_reads_lookahead(o.policy)});
  if (o.capacity_tokens < 0 || o.host_tokens < 0)
    fail(ErrorKind::InvalidInput, "capacity must not be negative");
  if (o.policy == "pgdsf" && !o.cost_model)
    fail(ErrorKind::InvalidInput,
         "pgdsf ranks by the profiled prefill cost table: give the simulator one (simulate --cost-model)");
  PolicyOptions po;
  po.lacr_alpha = o.lacr_alpha;
  RadixIndex index(static_cast<size_t>(o.capacity_tokens) * kBytesPerToken, make_policy(o.policy, po));
  if (o.host_tokens > 0)
    index.attach_host(static_cast<size_t>(o.host_tokens) * kBytesPerToken, o.swap_out_once);
  if (o.cost_model) index.set_cost_model(o.cost_model);

  const std::vector<Prepared> reqs = prepare(requests);
  SimulationResult r;
  r.n_requests = requests.size();
  double hit_sum = 0;
  int64_t items = 0, items_hit = 0;
  std::vector<size_t> queue;  // pending requests, in arrival order
  std::vector<int> passed_over(requests.size(), 0);
  size_t next_arrival = 0;
  while (r.order.size() < requests.size()) {
    while (queue.size() < admission.window() && next_arrival < requests.size())
      queue.push_back(next_arrival++);
    const size_t id = admit_next(admission, index, queue, reqs, requests, passed_over);
    // DepCache's future priority from the requests still waiting, refreshed
    // before serving and again once this request's nodes are in.
    const auto refresh_lookahead = [&] {
      std::vector<WaitingRequest> pending;
      for (size_t q : queue) pending.push_back({&reqs[q].lookups, requests[q].tokens, &passed_over[q]});
      admission.refresh_lookahead(index, pending);
    };
    refresh_lookahead();
    const SimulatedRequest& req = requests[id];
    const Served served = serve_request(index, req, reqs[id], refresh_lookahead);
    items += served.items;
    items_hit += served.items_hit;
    r.prompt_tokens += req.tokens;
    r.cached_tokens += served.cached;
    hit_sum += static_cast<double>(served.cached) / static_cast<double>(std::max<int64_t>(req.tokens, 1));
    r.order.push_back(id);
  }
  r.token_hit_rate = requests.empty() ? 0 : hit_sum / static_cast<double>(requests.size());
  r.item_hit_rate = items ? static_cast<double>(items_hit) / static_cast<double>(items) : 0;
  r.evicted_nodes = index.n_evicted();
  r.swapped_out_tokens = index.stats().swapped_out_bytes / static_cast<int64_t>(kBytesPerToken);
  r.swap_outs_saved = index.stats().swap_outs_saved;
  return r;
}

int64_t distinct_kv_tokens(const std::vector<SimulatedRequest>& requests) {
  RadixIndex index(std::numeric_limits<size_t>::max());
  for (const SimulatedRequest& r : requests)
    for (const CacheRun& run : r.runs) index.insert_virtual(run.ns, run.tokens, kBytesPerToken);
  return static_cast<int64_t>(index.bytes() / kBytesPerToken);
}

}  // namespace depcache

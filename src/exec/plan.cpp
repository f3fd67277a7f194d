#include "exec/plan.h"

#include <algorithm>

#include "util/hash.h"

namespace depcache {

int64_t whole_stops(std::span<const int64_t> stops, int64_t length) {
  if (stops.empty()) return length;
  const auto it = std::upper_bound(stops.begin(), stops.end(), length);
  return it == stops.begin() ? int64_t{0} : *std::prev(it);
}

int64_t cached_length(const RadixIndex& index, const Lookup& lookup) {
  return whole_stops(lookup.stops, index.peek(lookup.ns, lookup.tokens).length);
}

RadixIndex::Match match_run(RadixIndex& index, const CacheRun& run, uint64_t request_tick,
                            int64_t fresh_tokens, bool remote) {
  if (run.stops.empty()) return index.match(run.ns, run.tokens, request_tick, fresh_tokens, remote);
  // The longest cached run of whole stops, matched (one access per node it uses).
  const int64_t cut = whole_stops(run.stops, index.peek(run.ns, run.tokens).length);
  if (cut == 0) return {};
  RadixIndex::Match m = index.match(run.ns, std::span<const int32_t>(run.tokens).first(cut), request_tick,
                                    fresh_tokens, remote);
  // A lower tier's bad record may end the match early: still whole stops only.
  if (m.length < cut) {
    const int64_t keep = whole_stops(run.stops, m.length);
    int64_t at = 0;
    size_t i = 0;
    for (; i < m.pieces.size() && at < keep; ++i) {
      m.pieces[i].length = std::min(m.pieces[i].length, keep - at);
      at += m.pieces[i].length;
    }
    m.pieces.resize(i);
    if (m.loading.size() > i) m.loading.resize(i);
    m.length = keep;
  }
  return m;
}

void insert_run(RadixIndex& index, const CacheRun& run, const RadixIndex::SpanMaker* make_span,
                size_t bytes_per_token, double cost_per_token, RadixIndex::Match* path) {
  const std::span<const int32_t> all(run.tokens);
  const auto insert = [&](std::span<const int32_t> tokens) {
    if (make_span)
      index.insert(run.ns, tokens, *make_span, cost_per_token, path);
    else
      index.insert_virtual(run.ns, tokens, bytes_per_token, cost_per_token, path);
  };
  // A node per stop: each insert adds the next one under the last (what is
  // cached already is walked, not added).
  for (int64_t stop : run.stops)
    if (stop < static_cast<int64_t>(all.size())) insert(all.first(static_cast<size_t>(stop)));
  insert(all);
}

uint64_t scoped_namespace(uint64_t ns, uint64_t scope) {
  if (scope == 0) return ns;
  const uint64_t both[2] = {ns, scope};
  return hash_bytes(both, sizeof both, 0x73636f7065ULL);
}

void scope_plan(RequestPlan& plan, uint64_t scope) {
  plan.scope = scope;
  for (CacheRun& run : plan.runs) run.ns = scoped_namespace(run.ns, scope);
}

RequestPlan with_generated(const RequestPlan& plan, std::span<const int32_t> generated) {
  if (generated.empty()) return plan;
  RequestPlan out = plan;
  const auto n = static_cast<int64_t>(plan.tokens.size());
  const int32_t p0 = *std::max_element(plan.positions.begin(), plan.positions.end()) + 1;
  for (size_t i = 0; i < generated.size(); ++i) {
    out.tokens.push_back(generated[i]);
    out.positions.push_back(p0 + static_cast<int32_t>(i));
  }
  if (plan.next_pass) {
    // They are computed by the last pass, after the prompt.
    if (!out.fill_positions.empty())
      out.fill_positions.insert(out.fill_positions.end(), out.positions.begin() + n, out.positions.end());
    const auto g = static_cast<int64_t>(generated.size());
    out.next_pass = [next = plan.next_pass, n, g](const PassState& state) {
      PassPlan pass = next(state);
      if (!pass.last) return pass;
      std::vector<QueryGroup> groups = pass.visibility.groups();
      groups.push_back({static_cast<int64_t>(pass.rows.size()), g, {}, 0, n});
      for (int64_t i = 0; i < g; ++i) pass.rows.push_back(n + i);
      pass.visibility = Visibility(std::move(groups));
      return pass;
    };
    return out;
  }
  // The generated rows are never looked up, so they are always computed.
  out.visibility = [prompt = plan.visibility, n](std::span<const int64_t> computed) {
    const auto tail = std::lower_bound(computed.begin(), computed.end(), n);
    const auto n_head = static_cast<int64_t>(tail - computed.begin());
    std::vector<QueryGroup> groups;
    if (n_head > 0) groups = prompt(computed.first(static_cast<size_t>(n_head))).groups();
    groups.push_back({n_head, static_cast<int64_t>(computed.end() - tail), {}, 0, n});
    return Visibility(std::move(groups));
  };
  return out;
}

std::vector<Lookup> RequestPlan::lookups() const {
  std::vector<Lookup> out;
  for (const CacheRun& run : runs) out.push_back({run.ns, run.tokens, run.stops});
  return out;
}

}  // namespace depcache

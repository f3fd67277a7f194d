#include "engine/cost_profile.h"

#include <algorithm>
#include <limits>

#include "exec/visibility.h"
#include "util/timing.h"

namespace depcache {

PrefillCostTable profile_prefill_cost(Forward& fwd, KvAssembly& kv, int64_t max_tokens, int repeats) {
  const int64_t cap = std::max<int64_t>(std::min(max_tokens, kv.n_ctx()), 16);
  std::vector<int64_t> fresh;
  for (int64_t f : {int64_t{8}, int64_t{32}, int64_t{128}})
    if (f < cap) fresh.push_back(f);
  if (fresh.size() < 2) fresh = {1, 8};
  std::vector<int64_t> cached = {0, std::max<int64_t>(1, (cap - fresh.back()) / 2)};
  if (cap - fresh.back() > cached.back() + 1) cached.push_back(cap - fresh.back());
  const int32_t n_vocab = fwd.model().config().n_vocab;
  const auto tokens = [n_vocab](int64_t n, int64_t salt) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7919 + salt * 104729 + 1) % n_vocab);
    return t;
  };
  const auto plan_at = [&](int64_t n, int64_t row0) {
    PrefillPlan p;
    p.tokens = tokens(n, row0);
    for (int64_t i = 0; i < n; ++i) {
      p.positions.push_back(static_cast<int32_t>(row0 + i));
      p.rows.push_back(row0 + i);
    }
    p.visibility = causal_chain(n, row0);
    p.logits_for = {n - 1};
    return p;
  };
  // One untimed pass first: the first touches every weight page (a mapped
  // file is read in then), which would inflate the first point.
  kv.clear();
  fwd.prefill(plan_at(fresh.back(), 0), kv);
  std::vector<double> ms;
  for (int64_t c : cached) {
    kv.clear();
    if (c > 0) fwd.prefill(plan_at(c, 0), kv);  // the cached part, untimed
    for (int64_t f : fresh) {
      double best = std::numeric_limits<double>::max();
      for (int r = 0; r < std::max(repeats, 1); ++r) {
        const auto t0 = Clock::now();
        fwd.prefill(plan_at(f, c), kv);
        best = std::min(best, ms_since(t0));
      }
      ms.push_back(best);
    }
  }
  kv.clear();
  return PrefillCostTable(cached, fresh, ms);
}

}  // namespace depcache

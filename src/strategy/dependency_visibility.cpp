#include "strategy/dependency_visibility.h"

#include "util/error.h"

namespace depcache {

Visibility dependency_dag(const DepPrompt& prompt, std::span<const int64_t> rows) {
  std::vector<QueryGroup> groups;
  for (size_t i = 0; i < rows.size();) {
    if (rows[i] < 0 || rows[i] >= static_cast<int64_t>(prompt.size()))
      fail(ErrorKind::Internal, "dependency_dag: row {} outside the prompt of {} tokens", rows[i],
           prompt.size());
    const int32_t node = prompt.token_nodes()[rows[i]];
    const TokenRange own = prompt.nodes()[node].tokens;
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1 && rows[j] < own.end) ++j;
    if (rows[j - 1] != own.end - 1)
      fail(ErrorKind::Internal, "dependency_dag: computed tokens of node {} are not a suffix of it", node);
    QueryGroup g{static_cast<int64_t>(i), static_cast<int64_t>(j - i), {}, own.begin, rows[i]};
    for (const TokenRange& r : prompt.node_context(node)) g.context.push_back({r.begin, r.end});
    groups.push_back(std::move(g));
    i = j;
  }
  return Visibility(std::move(groups));
}

}  // namespace depcache

#include "exec/visibility.h"

#include <algorithm>
#include <cstdint>

#include "util/error.h"

namespace depcache {

Visibility causal_chain(int64_t n, int64_t row0) { return Visibility({{0, n, {}, 0, row0}}); }

void append_shifted(std::vector<QueryGroup>& out, const Visibility& v, int64_t query0, int64_t row0) {
  for (QueryGroup g : v.groups()) {
    g.first += query0;
    for (RowRange& r : g.context) r.begin += row0, r.end += row0;
    g.causal_begin += row0;
    g.self_row += row0;
    out.push_back(std::move(g));
  }
}

Visibility slice_queries(const Visibility& v, int64_t begin, int64_t end) {
  if (begin < 0 || end > v.n_queries() || begin >= end)
    fail(ErrorKind::Internal, "slice_queries: [{}, {}) of {} queries", begin, end, v.n_queries());
  std::vector<QueryGroup> groups;
  for (const QueryGroup& g : v.groups()) {
    const int64_t lo = std::max(g.first, begin), hi = std::min(g.first + g.count, end);
    if (lo >= hi) continue;
    QueryGroup piece = g;
    piece.self_row += lo - g.first;  // the causal run keeps its start
    piece.first = lo - begin;
    piece.count = hi - lo;
    groups.push_back(std::move(piece));
  }
  return Visibility(std::move(groups));
}

Visibility causal_by_position(std::span<const int64_t> rows) {
  std::vector<QueryGroup> groups;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    groups.push_back({static_cast<int64_t>(i), static_cast<int64_t>(j - i), {}, 0, rows[i]});
    i = j;
  }
  return Visibility(std::move(groups));
}

Visibility block_diagonal(std::span<const RowRange> shared, std::span<const RowRange> blocks) {
  std::vector<QueryGroup> groups;
  int64_t first = 0;
  for (const RowRange& b : blocks) {
    if (b.size() <= 0) continue;
    QueryGroup g{first, b.size(), {}, b.begin, b.begin};
    for (const RowRange& s : shared)
      if (s.size() > 0) g.context.push_back(s);
    groups.push_back(std::move(g));
    first += b.size();
  }
  return Visibility(std::move(groups));
}

Visibility chunks_alone(std::span<const RowRange> shared, std::span<const RowRange> blocks,
                        std::span<const int64_t> rows) {
  std::vector<QueryGroup> groups;
  size_t b = 0;
  for (size_t i = 0; i < rows.size();) {
    while (b < blocks.size() && blocks[b].end <= rows[i]) ++b;
    const bool inside = b < blocks.size() && rows[i] >= blocks[b].begin;
    const int64_t end = inside ? blocks[b].end : (b < blocks.size() ? blocks[b].begin : INT64_MAX);
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1 && rows[j] < end) ++j;
    QueryGroup g{static_cast<int64_t>(i), static_cast<int64_t>(j - i), {}, 0, rows[i]};
    if (inside) {
      g.causal_begin = blocks[b].begin;
      for (const RowRange& s : shared)
        if (s.size() > 0) g.context.push_back(s);
    }
    groups.push_back(std::move(g));
    i = j;
  }
  return Visibility(std::move(groups));
}

std::optional<Visibility> within_window(const Visibility& v, std::span<const int32_t> query_pos,
                                        const int32_t* key_pos, int window) {
  std::vector<QueryGroup> out;
  bool changed = false;
  for (const QueryGroup& g : v.groups()) {
    // Lowest key position the group sees, against its highest query position.
    int32_t lowest_key = INT32_MAX, highest_query = INT32_MIN;
    for (const RowRange& r : g.context)
      for (int64_t row = r.begin; row < r.end; ++row) lowest_key = std::min(lowest_key, key_pos[row]);
    for (int64_t row = g.causal_begin; row < g.self_row + g.count; ++row)
      lowest_key = std::min(lowest_key, key_pos[row]);
    for (int64_t i = 0; i < g.count; ++i) highest_query = std::max(highest_query, query_pos[g.first + i]);
    if (int64_t{highest_query} - lowest_key < window) {
      out.push_back(g);
      continue;
    }
    changed = true;
    for (int64_t i = 0; i < g.count; ++i) {
      const int64_t q = g.first + i;
      const int64_t lo = int64_t{query_pos[q]} - window;  // keys at positions > lo stay
      std::vector<RowRange> kept;
      auto keep = [&](RowRange r) {
        for (int64_t row = r.begin; row < r.end;) {
          if (key_pos[row] <= lo) {
            ++row;
            continue;
          }
          const int64_t begin = row;
          while (row < r.end && key_pos[row] > lo) ++row;
          if (!kept.empty() && kept.back().end == begin)
            kept.back().end = row;
          else
            kept.push_back({begin, row});
        }
      };
      for (const RowRange& r : g.context) keep(r);
      keep({g.causal_begin, g.self_row + i + 1});
      // The query's own row is at its own position: the last range ends there
      // and becomes the causal run.
      QueryGroup one;
      one.first = q;
      one.count = 1;
      one.self_row = g.self_row + i;
      one.causal_begin = one.self_row;
      if (!kept.empty() && kept.back().end == one.self_row + 1) {
        one.causal_begin = kept.back().begin;
        kept.pop_back();
      }
      one.context = std::move(kept);
      out.push_back(std::move(one));
    }
  }
  if (!changed) return std::nullopt;
  return Visibility(std::move(out));
}

}  // namespace depcache

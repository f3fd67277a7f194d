#pragma once
// Builders of visibility lists (see compute/attention.h) for the ways
// strategies let computed tokens attend. Rows are KV assembly rows; the batch
// holds the computed tokens in the order of `rows`.
#include <optional>
#include <span>

#include "compute/attention.h"

namespace depcache {

// n tokens at rows row0.. forming a causal chain after every earlier row.
Visibility causal_chain(int64_t n, int64_t row0);

// Recomputed tokens scattered over an assembly (ascending rows): each sees
// every row up to its own (causal by position over the whole assembly).
Visibility causal_by_position(std::span<const int64_t> rows);

// Every token of `blocks` (ascending, disjoint) sees the shared ranges and
// causally its own block only: chunks prefilled independently (full reuse).
Visibility block_diagonal(std::span<const RowRange> shared, std::span<const RowRange> blocks);

// Computed rows (ascending) of a prompt whose `blocks` (chunks, ascending and
// disjoint) are prefilled as if alone: a row inside a block sees the shared
// ranges and its block causally; any other row sees every row up to its own.
// The first pass of the chunk strategies (chunks a lookup missed, and the
// rest of the prompt over all chunks).
Visibility chunks_alone(std::span<const RowRange> shared, std::span<const RowRange> blocks,
                        std::span<const int64_t> rows);

// Appends the groups of `v` to `out` for a batch that holds several
// sequences: its queries start at batch index query0 and its rows at KV row
// row0 (every range and row moves by row0). Sequences batched this way see
// only their own rows.
void append_shifted(std::vector<QueryGroup>& out, const Visibility& v, int64_t query0, int64_t row0);

// Queries [begin, end) of `v`, numbered from 0: one piece of a prefill split
// over several forward passes. A query sees no row after its own, so with
// ascending rows every piece needs only rows its predecessors wrote.
Visibility slice_queries(const Visibility& v, int64_t begin, int64_t end);

// `v` under a sliding window: query q (at position query_pos[q]) keeps the
// rows r it sees with query_pos[q] - key_pos[r] < window. A group whose
// queries see nothing outside the window stays as it is; each query of the
// other groups gets a group of its own. nullopt when nothing changes.
std::optional<Visibility> within_window(const Visibility& v, std::span<const int32_t> query_pos,
                                        const int32_t* key_pos, int window);

}  // namespace depcache

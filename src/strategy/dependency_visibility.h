#pragma once
// DepCache's dependency attention as a visibility: each token of a DepPrompt
// sees its own node's earlier tokens and the nodes it depends on. Here, above
// both, so that neither the prompt (what a request says) nor the visibility
// (what the forward pass runs) knows the other.
#include <span>

#include "exec/visibility.h"
#include "prompt/dep_prompt.h"

namespace depcache {

// Dependency attention over a DepPrompt laid out in pre-order (row = token
// index): `rows` (ascending) are the computed tokens; the others must be in
// the assembly. A node's computed tokens must be a suffix of the node.
Visibility dependency_dag(const DepPrompt& prompt, std::span<const int64_t> rows);

}  // namespace depcache

#pragma once
// Measures the prefill cost table PGDSF uses on this machine and model.
#include <cstdint>

#include "exec/forward.h"
#include "exec/kv_assembly.h"
#include "kv/cost_table.h"

namespace depcache {

// Times prefills of fresh tokens after cached ones on a small grid up to
// max_tokens (cached in {0, max/4, max/2 (or so)}, fresh in {8, 32, 128}
// clipped to the context), in `kv` (cleared afterwards). Each point is the
// best of `repeats`.
PrefillCostTable profile_prefill_cost(Forward& fwd, KvAssembly& kv, int64_t max_tokens, int repeats = 2);

}  // namespace depcache

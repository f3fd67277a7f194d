#pragma once
// Each seed system's defining policies, as its paper runs it: what a
// strategy is served with unless the command line says otherwise
// (`--policy`, `--scheduler`, `--host-mib` and `--swap-out-once` override
// every strategy of a run).
//   depcache:   LACR, its lookahead over the waiting queue (DepCache)
//   ragcache:   PGDSF over the knowledge tree, a host tier below the hot one
//               with swap-out-once, cache-aware reordering (RAGCache)
//   cachecraft: eviction by the chunk's reuse value over its fix overhead
//               (Cache-Craft)
//   the others: LRU, first come first served, the hot tier alone
#include <string>
#include <string_view>

namespace depcache {

struct SystemProfile {
  std::string policy = "lru";
  std::string scheduler = "fifo";
  // The host tier's budget as a multiple of the hot tier's (0: none).
  double host_tier_ratio = 0;
  bool swap_out_once = false;
};

// strategy: one of strategy_names() or "subgcache" (served as prefix after
// its batches are clustered: its policy is its batching).
SystemProfile system_profile(std::string_view strategy);

}  // namespace depcache

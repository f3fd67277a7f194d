#include "engine_options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli_common.h"
#include "compute/dot.h"
#include "compute/packed_matrix.h"
#include "kv/policy.h"
#include "strategy/profile.h"
#include "strategy/scheduler.h"
#include "util/timing.h"

namespace depcache::cli {

void add_kv_storage_options(CLI::App& cmd, std::string& kv_type, double& cache_mib, TierOptions& tiers) {
  add_kv_type_option(cmd, kv_type);
  cmd.add_option("--cache-mib", cache_mib, "Byte budget of the KV index's hot tier in MiB")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1048576.0));
  add_tier_options(cmd, tiers);
}

void add_starvation_bound_option(CLI::App& cmd, int& bound) {
  cmd.add_option("--starvation-bound", bound,
                 "A waiting request passed over this many times goes next (all orders but fifo)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
}

void add_window_option(CLI::App& cmd, size_t& window) {
  cmd.add_option("--window", window, "Queued requests LACR's lookahead and the scheduler see")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
}

void add_engine_options(CLI::App& cmd, EngineArgs& a) {
  add_kv_storage_options(cmd, a.kv_type, a.cache_mib, a.tiers);
  // The names come from the registries.
  cmd.add_option("--policy", a.policy,
                 fmt::format("Replacement policy of the index: auto (each strategy's own: lacr for depcache, "
                             "pgdsf for ragcache, cachecraft for cachecraft, lru for the others), {}",
                             fmt::join(policy_names(), ", ")))
      ->capture_default_str();
  cmd.add_option("--scheduler", a.scheduler,
                 fmt::format("Order of admission among the first --window waiting requests: auto (ragcache's "
                             "cache-aware order for ragcache, fifo for the others), {}",
                             fmt::join(scheduler_names(), ", ")))
      ->capture_default_str()
      ->check(CLI::IsMember([] {
        std::vector<std::string> names = scheduler_names();
        names.insert(names.begin(), "auto");
        return names;
      }()));
  add_starvation_bound_option(cmd, a.starvation_bound);
  add_window_option(cmd, a.window);
  cmd.add_option("--prefetch", a.prefetch,
                 "Waiting requests whose spans are loaded into the hot tier while a step computes")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd.add_option("--batch-tokens", a.batch_tokens,
                 "Tokens computed in one forward pass: a decode token of every running request, the rest "
                 "prefill (longer prompts are split over several passes)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  cmd.add_option("--max-running", a.max_running,
                 "Requests in flight at most, the others queueing (default 0: as many as the pool holds; 1: "
                 "one at a time)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd.add_flag("--no-wait-for-shared", a.no_wait_for_shared,
               "Admit a request beside a prefill under way that computes some of its tokens (by default it "
               "waits for that prefill and reuses them)");
  add_threads_option(cmd, a.threads);
  cmd.add_option("--scheme", a.scheme,
                 "depcache positions: auto (the model's depcache.position_scheme, else sequential), "
                 "sequential or stacked (closer to full attention; moved subtrees reused approximately), "
                 "depth (exact reuse, further from full attention)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "depth", "sequential", "stacked"}));
  cmd.add_option("--tree-context", a.tree_context,
                 "depcache: what a context tree sees besides itself: auto (the model's "
                 "depcache.tree_context, else system), system (the system text, as DepCache lays it out) or "
                 "none (for a model trained so: a moved tree is then reused exactly)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "system", "none"}));
  cmd.add_flag("--int8-activations", a.int8_activations,
               "Approximate: Q8_0/Q4_K/Q4_0/Q6_K matmuls on activations quantized per token to int8 "
               "(AVX-512 VNNI or AVX2); faster, not exact (run --fidelity measures it against exact)");
  cmd.add_flag(
      "--bf16-products", a.bf16_products,
      "Approximate: BF16/F16 matmuls on activations (and F16 weights) rounded to bfloat16, summed in "
      "fp32 (AVX512-BF16; exact elsewhere); faster prefill, not exact (run --fidelity measures it)");
  cmd.add_flag("--no-reuse", a.no_reuse, "Never look up or insert KV (depcache: dependency attention alone)");
  cmd.add_flag("--no-realign", a.no_realign,
               "depcache and the chunk strategies: reuse cached KV at the positions it was computed at, "
               "without re-encoding the keys at their new positions (an ablation: what position alignment "
               "is worth)");
  add_chunk_options(&cmd, a.chunk);
}

}  // namespace depcache::cli

#pragma once
// Replacement policies for the KV index: one interface, used by the live
// engine and by the simulator alike. The index tells a policy what happens to
// its nodes; at eviction time it asks for each evictable leaf's priority and
// evicts the lowest.
//   lru       last access
//   lfu       hit count
//   gdsf      Clock + Frequency / Size (cost 1 per node)
//   gdsf-size Clock + Frequency (cost proportional to size: LFU with aging)
//   pgdsf     Clock + Frequency × Cost / Size (RAGCache, Eq. 2 and 4):
//             Cost / Size is the mean, over the accesses that found the node
//             uncached, of the recompute time per token of the request
//             (T(cached, new) / new); one Clock per tier, raised to the
//             priority of what leaves the tier. Frequency and cost outlive
//             the node's KV: a node computed again resumes them (RAGCache's
//             "free segment" of the knowledge tree)
//   lacr      α·Frequency + (1 − α)·Lookahead (DepCache), the lookahead being
//             the weighted count of pending requests that will use the node
//   cachecraft  f += 1 / CFO per access (Cache-Craft's reuse score)
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace depcache {

// Where a span lives, fastest first. Remote is the shared store between
// processes; it is where a match may find blocks, not a node's tier.
enum class Tier : uint8_t { Hot = 0, Host = 1, Disk = 2, Remote = 3 };
const char* tier_name(Tier t);

// What the index knows about a node when it asks for its priority.
struct NodeView {
  int32_t id = -1;
  int64_t tokens = 0;
  uint64_t hits = 0;       // accesses since insertion (the insertion counts as one)
  uint64_t last_used = 0;  // index clock at the last access
  Tier tier = Tier::Hot;
};

class ReplacementPolicy {
 public:
  virtual ~ReplacementPolicy() = default;
  virtual std::string_view name() const = 0;

  // A node was created (inserted, or split off as `head` of `from`).
  // cost_per_token: recompute time per token of the request that made it
  // (any consistent unit; 1 when unknown). key: what the node holds (its
  // namespace and every token up to its end), the same whenever the same KV
  // is computed again, for policies that remember nodes after they leave.
  virtual void on_insert(int32_t /*node*/, double /*cost_per_token*/, uint64_t /*key*/) {}
  virtual void on_split(int32_t /*head*/, int32_t /*from*/, uint64_t /*head_key*/) {}
  virtual void on_access(int32_t /*node*/) {}
  // The node left `from` (down a tier, or out of the index from the last).
  virtual void on_evict(int32_t /*node*/, double /*priority*/, Tier /*from*/) {}
  // The node left the index (its id may be reused by the next insert).
  virtual void on_remove(int32_t /*node*/) {}
  // The node now lives in tier `to` (promoted or demoted).
  virtual void on_tier_change(int32_t /*node*/, Tier /*to*/) {}
  // Lower is evicted first; equal priorities go least recently used first.
  // A priority may change only through the events above (or the setters
  // below): the index keeps its candidates ordered by it between events.
  virtual double priority(const NodeView& node) const = 0;

  // Lookahead over the pending queue (LACR): weight per node of the requests
  // that will use it. Other policies ignore it.
  virtual void set_lookahead(std::unordered_map<int32_t, double> /*weights*/) {}
  // Cache-Craft's cache-fix overhead of a node, in [0, 1] (other policies ignore it).
  virtual void set_fix_overhead(int32_t /*node*/, double /*cfo*/) {}
};

struct PolicyOptions {
  double lacr_alpha = 0.2;  // DepCache's default
};

// name: lru, lfu, gdsf, gdsf-size, pgdsf, lacr, cachecraft.
std::unique_ptr<ReplacementPolicy> make_policy(std::string_view name, const PolicyOptions& options = {});
std::vector<std::string> policy_names();
// Whether the policy ranks by the waiting requests' lookahead (LACR), which
// its admission then keeps set.
bool policy_reads_lookahead(std::string_view name);

}  // namespace depcache

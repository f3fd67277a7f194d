#include "kv/policy.h"

#include <algorithm>

#include "util/error.h"

namespace depcache {
namespace {

// Per-node state kept by a policy, indexed by node id (ids are reused after
// eviction; on_insert resets them).
template <typename T>
class PerNode {
 public:
  T& operator[](int32_t id) {
    if (static_cast<size_t>(id) >= v_.size()) v_.resize(static_cast<size_t>(id) + 1);
    return v_[id];
  }
  const T* find(int32_t id) const { return static_cast<size_t>(id) < v_.size() ? &v_[id] : nullptr; }
  // Copies by value first: growing the vector for `to` would invalidate a reference to `from`.
  void copy(int32_t from, int32_t to) {
    const T value = (*this)[from];
    (*this)[to] = value;
  }

 private:
  std::vector<T> v_;
};

class Lru final : public ReplacementPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  double priority(const NodeView& n) const override { return static_cast<double>(n.last_used); }
};

class Lfu final : public ReplacementPolicy {
 public:
  std::string_view name() const override { return "lfu"; }
  double priority(const NodeView& n) const override { return static_cast<double>(n.hits); }
};

// The Greedy-Dual clocks of GDSF and PGDSF: one per tier, raised to the
// priority of each node that leaves the tier.
class TierClocks : public ReplacementPolicy {
 public:
  void on_evict(int32_t, double priority, Tier from) override {
    double& c = clock_[static_cast<int>(from)];
    c = std::max(c, priority);
  }

 protected:
  double clock(Tier t) const { return clock_[static_cast<int>(t)]; }

 private:
  double clock_[4] = {};
};

// GDSF: Clock + Frequency × Cost / Size, the frequency the index's access
// count; the cost 1 per node (small nodes first), or proportional to its size
// (gdsf-size: Clock + Frequency, LFU with aging). A node's clock term is the
// clock at its last access: what was not used since evictions raised the
// clock ranks below what was (aging).
class Gdsf final : public TierClocks {
 public:
  explicit Gdsf(bool cost_by_size) : cost_by_size_(cost_by_size) {}
  std::string_view name() const override { return cost_by_size_ ? "gdsf-size" : "gdsf"; }
  void on_split(int32_t head, int32_t from, uint64_t) override { base_.copy(from, head); }
  void on_insert(int32_t node, double, uint64_t) override { base_[node] = clock(Tier::Hot); }
  void on_access(int32_t node) override { base_[node] = clock(Tier::Hot); }
  // A node entering a tier competes from that tier's clock.
  void on_tier_change(int32_t node, Tier to) override { base_[node] = clock(to); }
  double priority(const NodeView& n) const override {
    const double* base = base_.find(n.id);
    const double size = cost_by_size_ ? 1.0 : static_cast<double>(std::max<int64_t>(n.tokens, 1));
    return (base ? *base : 0.0) + static_cast<double>(n.hits) / size;
  }

 private:
  bool cost_by_size_;
  PerNode<double> base_;
};

// PGDSF keeps its own frequency and mean cost per node, and keeps them by
// content key when the node leaves the index, so the next computation of
// the same KV continues them (the accesses that found it uncached are what
// the mean is over).
class Pgdsf final : public TierClocks {
 public:
  std::string_view name() const override { return "pgdsf"; }
  void on_split(int32_t head, int32_t from, uint64_t head_key) override {
    state_.copy(from, head);
    state_[head].key = head_key;
  }
  void on_insert(int32_t node, double cost_per_token, uint64_t key) override {
    State s;
    if (const auto it = history_.find(key); it != history_.end()) {
      s.history = it->second;
      history_.erase(it);
    }
    s.key = key;
    s.base = clock(Tier::Hot);
    s.history.frequency += 1;
    s.history.cost_sum += cost_per_token;
    s.history.uncached += 1;
    state_[node] = s;
  }
  void on_access(int32_t node) override {
    State& s = state_[node];
    s.base = clock(Tier::Hot);
    s.history.frequency += 1;
  }
  void on_tier_change(int32_t node, Tier to) override { state_[node].base = clock(to); }
  void on_remove(int32_t node) override {
    // A bounded memory: past the bound the history starts afresh (the
    // paper's frequency counts within a time window it leaves open).
    if (history_.size() >= kHistoryBound) history_.clear();
    const State& s = state_[node];
    history_[s.key] = s.history;
  }
  double priority(const NodeView& n) const override {
    const State* s = state_.find(n.id);
    if (!s) return 0.0;
    const History& h = s->history;
    return s->base + h.frequency * (h.cost_sum / std::max(h.uncached, 1.0));
  }

 private:
  static constexpr size_t kHistoryBound = size_t{1} << 20;
  struct History {
    double frequency = 0;  // accesses, the computations included
    double cost_sum = 0;   // of the request's cost per token, over the computations
    double uncached = 0;   // computations (accesses that found it uncached)
  };
  struct State {
    double base = 0;  // the clock at the last access
    uint64_t key = 0;
    History history;
  };
  PerNode<State> state_;
  std::unordered_map<uint64_t, History> history_;  // of nodes that left, by content key
};

class Lacr final : public ReplacementPolicy {
 public:
  explicit Lacr(double alpha) : alpha_(alpha) {
    if (!(alpha >= 0 && alpha <= 1))
      fail(ErrorKind::InvalidInput, "LACR alpha must be in [0, 1], got {}", alpha);
  }
  std::string_view name() const override { return "lacr"; }
  void set_lookahead(std::unordered_map<int32_t, double> weights) override {
    lookahead_ = std::move(weights);
  }
  // The head of a split is used by every request that uses the tail.
  void on_split(int32_t head, int32_t from, uint64_t) override {
    const auto it = lookahead_.find(from);
    if (it != lookahead_.end()) lookahead_[head] = it->second;
  }
  double priority(const NodeView& n) const override {
    const auto it = lookahead_.find(n.id);
    const double future = it == lookahead_.end() ? 0.0 : it->second;
    return alpha_ * static_cast<double>(n.hits) + (1 - alpha_) * future;
  }

 private:
  double alpha_;
  std::unordered_map<int32_t, double> lookahead_;
};

class CacheCraft final : public ReplacementPolicy {
 public:
  std::string_view name() const override { return "cachecraft"; }
  void on_insert(int32_t node, double, uint64_t) override { state_[node] = {1.0, 1.0}; }
  void on_split(int32_t head, int32_t from, uint64_t) override { state_.copy(from, head); }
  void set_fix_overhead(int32_t node, double cfo) override { state_[node].cfo = std::clamp(cfo, 0.0, 1.0); }
  void on_access(int32_t node) override {
    State& s = state_[node];
    s.score += 1.0 / std::max(s.cfo, 1e-3);  // a chunk that needs no fixing is worth the most
  }
  double priority(const NodeView& n) const override {
    const State* s = state_.find(n.id);
    return s ? s->score : 0.0;
  }

 private:
  struct State {
    double score = 0;
    double cfo = 1;
  };
  PerNode<State> state_;
};

}  // namespace

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::Hot:
      return "hot";
    case Tier::Host:
      return "host";
    case Tier::Disk:
      return "disk";
    case Tier::Remote:
      return "remote";
  }
  return "?";
}

bool policy_reads_lookahead(std::string_view name) { return name == "lacr"; }

std::vector<std::string> policy_names() {
  return {"lru", "lfu", "gdsf", "gdsf-size", "pgdsf", "lacr", "cachecraft"};
}

std::unique_ptr<ReplacementPolicy> make_policy(std::string_view name, const PolicyOptions& options) {
  if (name == "lru") return std::make_unique<Lru>();
  if (name == "lfu") return std::make_unique<Lfu>();
  if (name == "gdsf") return std::make_unique<Gdsf>(false);
  if (name == "gdsf-size") return std::make_unique<Gdsf>(true);
  if (name == "pgdsf") return std::make_unique<Pgdsf>();
  if (name == "lacr") return std::make_unique<Lacr>(options.lacr_alpha);
  if (name == "cachecraft") return std::make_unique<CacheCraft>();
  fail(ErrorKind::InvalidInput,
       "unknown replacement policy '{}' (expected lru, lfu, gdsf, gdsf-size, pgdsf, lacr or cachecraft)",
       name);
}

}  // namespace depcache

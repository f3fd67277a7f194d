#include "strategy/strategy.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "engine/visibility.h"
#include "kv/pin_lease.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/timing.h"

namespace depcache {
namespace {

uint64_t hash_ints(uint64_t h, std::span<const int32_t> v) { return hash_bytes(v.data(), v.size_bytes(), h); }

uint64_t namespace_key(uint64_t fingerprint, DType kv_type, std::string_view kind) {
  uint64_t h = hash_bytes(&fingerprint, sizeof fingerprint);
  const auto t = static_cast<int32_t>(kv_type);
  h = hash_bytes(&t, sizeof t, h);
  return hash_string(kind, h);
}

// Places index pieces covering sequence tokens [0, m) at the rows of those
// tokens (rows[i] of the plan for token i, kv_rows[i] in the assembly), each
// at its prompt position (indexed by plan row), or, without realign, at the
// position it was cached at; rows of a piece may be split in runs.
void place_pieces(const RadixIndex& index, const RadixIndex::Match& match, int64_t m,
                  std::span<const int64_t> rows, std::span<const int64_t> kv_rows,
                  std::span<const int32_t> positions, bool realign, KvCache& kv, std::vector<bool>& placed) {
  int64_t at = 0;
  for (const RadixIndex::Piece& p : match.pieces) {
    const int64_t len = std::min(p.length, m - at);
    for (int64_t i = 0; i < len;) {
      if (placed[rows[at + i]]) {
        ++i;
        continue;
      }
      int64_t j = i + 1;
      while (j < len && rows[at + j] == rows[at + j - 1] + 1 && !placed[rows[at + j]]) ++j;
      const KvSpan& span = index.span(p.node);
      kv.place(span, p.offset + i, j - i, kv_rows[at + i],
               realign ? positions.subspan(rows[at + i], j - i)
                       : std::span<const int32_t>(span.positions()).subspan(p.offset + i, j - i));
      for (int64_t r = i; r < j; ++r) placed[rows[at + r]] = true;
      i = j;
    }
    at += len;
    if (at >= m) break;
  }
}

// A match's load figures into the report. Tokens found in several runs
// (shared tree prefixes) count once per run here; they are placed once.
void add_load(PrefillReport& r, const RadixIndex::Match& m) {
  for (int t = 0; t < RadixIndex::kTiers; ++t) r.reused_from[t] += m.tokens_from[t];
  r.load_ms += m.load_ms;
}

RadixIndex::SpanMaker rows_span(const KvCache& kv, std::span<const int64_t> rows) {
  return [&kv, rows](int64_t begin, int64_t end) { return kv.extract(rows.subspan(begin, end - begin)); };
}

// The flat prompt, causal, with the longest cached prefix placed; without
// reuse this is plain full prefill (the `full` strategy).
class FlatStrategy final : public Strategy {
 public:
  FlatStrategy(std::string name, RadixIndex& index, uint64_t ns, bool reuse)
      : Strategy(index, reuse), name_(std::move(name)), ns_(ns) {}
  std::string_view name() const override { return name_; }
  RequestPlan plan(const PromptParts& parts) const override {
    RequestPlan p;
    p.tokens = parts.flat();
    const auto n = static_cast<int64_t>(p.tokens.size());
    p.flat_tokens = n;
    CacheRun run{ns_, p.tokens, {}, -1};
    for (int64_t t = 0; t < n; ++t) {
      p.positions.push_back(static_cast<int32_t>(t));
      run.rows.push_back(t);
    }
    if (reuse()) p.runs.push_back(std::move(run));
    // What is placed is a prefix: the rest is a causal chain after it.
    p.visibility = [](std::span<const int64_t> computed) {
      return causal_chain(static_cast<int64_t>(computed.size()), computed.front());
    };
    return p;
  }

 private:
  std::string name_;
  uint64_t ns_;
};

class DepCacheStrategy final : public Strategy {
 public:
  DepCacheStrategy(RadixIndex& index, uint64_t ns, PositionScheme scheme, bool reuse, bool realign)
      : Strategy(index, reuse), ns_(ns), scheme_(scheme), realign_(realign) {}
  std::string_view name() const override { return "depcache"; }
  RequestPlan plan(const PromptParts& parts) const override {
    auto prompt = std::make_shared<const DepPrompt>(parts.dep_prompt());
    RequestPlan p;
    p.tokens = prompt->tokens();
    p.positions = prompt->positions(scheme_);
    p.flat_tokens = parts.n_flat_tokens();
    p.realign = realign_;
    if (reuse()) p.runs = dependency_runs(*prompt, ns_, scheme_);
    p.visibility = [prompt](std::span<const int64_t> computed) { return dependency_dag(*prompt, computed); };
    return p;
  }

 private:
  uint64_t ns_;
  PositionScheme scheme_;
  bool realign_;
};

}  // namespace

std::vector<CacheRun> dependency_runs(const DepPrompt& prompt, uint64_t ns, PositionScheme scheme) {
  std::vector<CacheRun> runs;
  const auto& tokens = prompt.tokens();
  // The leading linear segments (system, and for plain-text requests the
  // text) are a causal prefix of the prompt: one run from its start.
  int32_t lead_end = 0;
  for (const PromptSegment& seg : prompt.segments()) {
    if (seg.kind != SegmentKind::Linear || seg.tokens.begin != lead_end) break;
    lead_end = seg.tokens.end;
  }
  if (lead_end > 0) {
    CacheRun run{hash_string("lead", ns), {tokens.begin(), tokens.begin() + lead_end}, {}, -1};
    for (int64_t r = 0; r < lead_end; ++r) run.rows.push_back(r);
    runs.push_back(std::move(run));
  }
  // Each root-to-leaf path of each tree, matched from the tree's root under
  // the segments the tree depends on and the scheme. Under the depth scheme
  // the root's position follows from those segments, so a match is exact
  // (up to float rounding); under the sequential and stacked schemes a
  // subtree is reused wherever it moves, its keys rotated to the new
  // positions — approximate by design unless the tree and its offset are
  // unchanged.
  std::vector<bool> has_child(prompt.nodes().size(), false);
  for (const PromptNode& node : prompt.nodes())
    if (node.parent >= 0) has_child[node.parent] = true;
  const auto scheme_id = static_cast<int32_t>(scheme);
  for (int32_t si = 0; si < static_cast<int32_t>(prompt.segments().size()); ++si) {
    const PromptSegment& seg = prompt.segments()[si];
    if (seg.kind != SegmentKind::Tree) continue;
    uint64_t tree_ns = hash_bytes(&scheme_id, sizeof scheme_id, hash_string("tree", ns));
    for (int32_t dep : seg.depends_on) {
      const TokenRange d = prompt.segments()[dep].tokens;
      const int32_t size = d.size();
      tree_ns = hash_bytes(&size, sizeof size, tree_ns);  // keeps segment boundaries apart
      tree_ns = hash_ints(tree_ns, std::span<const int32_t>(tokens.data() + d.begin, d.size()));
    }
    for (int32_t node = seg.first_node; node < seg.first_node + seg.n_nodes; ++node) {
      if (has_child[node]) continue;
      CacheRun run{tree_ns, {}, {}, si};
      for (int32_t on_path : prompt.node_path(node)) {
        const TokenRange t = prompt.nodes()[on_path].tokens;
        for (int32_t r = t.begin; r < t.end; ++r) {
          run.tokens.push_back(tokens[r]);
          run.rows.push_back(r);
        }
      }
      runs.push_back(std::move(run));
    }
  }
  return runs;
}

PositionScheme default_position_scheme(const ModelConfig& config) {
  if (config.position_scheme.empty()) return kDefaultPositionScheme;
  const auto s = parse_position_scheme(config.position_scheme);
  if (!s)
    fail(ErrorKind::InvalidInput,
         "the model's {} is '{}', not a position scheme (depth, sequential, stacked)", kPositionSchemeKey,
         config.position_scheme);
  return *s;
}

PlanExecution::PlanExecution(const RequestPlan& plan, RadixIndex& index, KvCache& kv, int64_t row0)
    : plan_(plan), index_(index), lease_(index) {
  const auto n = static_cast<int64_t>(plan.tokens.size());
  if (n == 0) fail(ErrorKind::InvalidInput, "an empty prompt");
  if (row0 < 0 || row0 + n > kv.n_ctx())
    fail(ErrorKind::LimitExceeded, "the prompt holds {} tokens, more than the context size {}", n,
         kv.n_ctx() - std::max<int64_t>(row0, 0));
  // The plan's rows, where they sit in this assembly.
  std::vector<int64_t> kv_rows;
  std::vector<bool> placed(n, false);
  if (!plan.runs.empty()) {
    const auto lk = index.lock();  // match, place and pin before anything else moves
    const uint64_t tick = index.begin_request();
    for (const CacheRun& run : plan.runs) {
      const RadixIndex::Match match = index.match(run.ns, run.tokens, tick);
      add_load(report_, match);
      kv_rows.assign(run.rows.begin(), run.rows.end());
      for (int64_t& r : kv_rows) r += row0;
      place_pieces(index, match, match.length, run.rows, kv_rows, plan.positions, plan.realign, kv, placed);
      lease_.hold(match);
    }
  }
  if (placed[n - 1]) {
    // The last token always runs (its logits start the answer), so it is not
    // reused even when cached. It ends the deepest node of its run, which is
    // in the slowest tier that run was found in (a parent is never in a
    // slower tier than its child); with other runs found in slower tiers the
    // tier charged may be theirs, the total stays right.
    for (int t = RadixIndex::kTiers - 1; t >= 0; --t)
      if (report_.reused_from[t] > 0) {
        --report_.reused_from[t];
        break;
      }
  }
  placed[n - 1] = false;
  for (int64_t r = 0; r < n; ++r)
    if (!placed[r]) computed_.push_back(r);
  for (int64_t r : computed_) {
    prefill_.tokens.push_back(plan.tokens[r]);
    prefill_.positions.push_back(plan.positions[r]);
    prefill_.rows.push_back(r);
  }
  prefill_.visibility = plan.visibility(computed_);
  prefill_.logits_for = {static_cast<int64_t>(computed_.size()) - 1};
}

PrefillReport PlanExecution::finish(const KvCache& kv, int64_t row0, std::vector<float> logits,
                                    int64_t attention_pairs, double ms_per_token) {
  if (!plan_.runs.empty()) {
    const auto lk = index_.lock();
    // Each inserted run stays held until all are in, so one run's insert
    // cannot evict another this request just computed.
    std::vector<int64_t> kv_rows;
    for (const CacheRun& run : plan_.runs) {
      kv_rows.assign(run.rows.begin(), run.rows.end());
      for (int64_t& r : kv_rows) r += row0;
      RadixIndex::Match path;
      index_.insert(run.ns, run.tokens, rows_span(kv, kv_rows), ms_per_token, &path);
      lease_.hold(path);
    }
  }
  lease_.release();
  const auto n = static_cast<int64_t>(plan_.tokens.size());
  const auto n_computed = static_cast<int64_t>(computed_.size());
  report_.prompt_tokens = n;
  report_.computed_tokens = n_computed;
  report_.reused_tokens = n - n_computed;
  report_.attention_pairs = attention_pairs;
  report_.flat_tokens = plan_.flat_tokens;
  report_.logits = std::move(logits);
  return std::move(report_);
}

PrefillReport apply_plan(const RequestPlan& plan, RadixIndex& index, KvCache& kv, Forward& fwd) {
  kv.clear();
  PlanExecution ex(plan, index, kv, 0);
  const auto t0 = Clock::now();
  PrefillResult result = fwd.prefill(ex.prefill(), kv);
  const double ms_per_token = ms_since(t0) / static_cast<double>(ex.prefill().tokens.size());
  kv.set_n_past(static_cast<int64_t>(plan.tokens.size()));
  return ex.finish(kv, 0, std::move(result.logits), result.attention_pairs / fwd.model().config().n_layer,
                   ms_per_token);
}

PrefillReport Strategy::prefill(const PromptParts& parts, KvCache& kv, Forward& fwd) {
  return apply_plan(plan(parts), index_, kv, fwd);
}

RequestPlan with_generated(const RequestPlan& plan, std::span<const int32_t> generated) {
  if (generated.empty()) return plan;
  RequestPlan out = plan;
  const auto n = static_cast<int64_t>(plan.tokens.size());
  const int32_t p0 = *std::max_element(plan.positions.begin(), plan.positions.end()) + 1;
  for (size_t i = 0; i < generated.size(); ++i) {
    out.tokens.push_back(generated[i]);
    out.positions.push_back(p0 + static_cast<int32_t>(i));
  }
  // The generated rows are never looked up, so they are always computed.
  out.visibility = [prompt = plan.visibility, n](std::span<const int64_t> computed) {
    const auto tail = std::lower_bound(computed.begin(), computed.end(), n);
    const auto n_head = static_cast<int64_t>(tail - computed.begin());
    std::vector<QueryGroup> groups;
    if (n_head > 0) groups = prompt(computed.first(static_cast<size_t>(n_head))).groups();
    groups.push_back({n_head, static_cast<int64_t>(computed.end() - tail), {}, 0, n});
    return Visibility(std::move(groups));
  };
  return out;
}

std::vector<Lookup> RequestPlan::lookups() const {
  std::vector<Lookup> out;
  for (const CacheRun& run : runs) out.push_back({run.ns, run.tokens});
  return out;
}

std::vector<std::string> strategy_names() { return {"full", "prefix", "depcache"}; }

std::unique_ptr<Strategy> make_strategy(std::string_view name, RadixIndex& index, const Model& model,
                                        DType kv_type, const StrategyOptions& options) {
  const uint64_t fp = model.fingerprint();
  if (name == "full" || name == "prefix")
    return std::make_unique<FlatStrategy>(std::string(name), index, namespace_key(fp, kv_type, "prefix"),
                                          name == "prefix" && options.reuse);
  if (name == "depcache")
    return std::make_unique<DepCacheStrategy>(index, namespace_key(fp, kv_type, "depcache"), options.scheme,
                                              options.reuse, options.realign);
  fail(ErrorKind::InvalidInput, "unknown strategy '{}' (expected full, prefix or depcache)", name);
}

}  // namespace depcache

#include "strategy/strategy.h"

#include <algorithm>
#include <cstring>

#include "engine/visibility.h"
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

void check_fits(int64_t n, const KvCache& kv) {
  if (n > kv.n_ctx())
    fail(ErrorKind::LimitExceeded, "the prompt holds {} tokens, more than the context size {}", n,
         kv.n_ctx());
}

// Places index pieces covering sequence tokens [0, m) at the rows of those
// tokens (rows[i] for token i), each at its prompt position (indexed by row);
// rows of a piece may be split in runs.
void place_pieces(const RadixIndex& index, const RadixIndex::Match& match, int64_t m,
                  std::span<const int64_t> rows, std::span<const int32_t> positions, KvCache& kv,
                  std::vector<bool>& placed) {
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
      kv.place(index.span(p.node), p.offset + i, j - i, rows[at + i], positions.subspan(rows[at + i], j - i));
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
      : name_(std::move(name)), index_(index), ns_(ns), reuse_(reuse) {}
  std::string_view name() const override { return name_; }
  PrefillReport prefill(const PromptParts& parts, KvCache& kv, Forward& fwd) override {
    const std::vector<int32_t> tokens = parts.flat();
    const auto n = static_cast<int64_t>(tokens.size());
    check_fits(n, kv);
    kv.clear();
    std::vector<int64_t> rows(n);
    std::vector<int32_t> positions(n);
    for (int64_t t = 0; t < n; ++t) rows[t] = positions[t] = static_cast<int32_t>(t);
    RadixIndex::Match match;
    int64_t m = 0;
    PrefillReport report;
    if (reuse_) {
      const auto lk = index_.lock();  // match, place and pin before anything else moves
      match = index_.match(ns_, tokens);
      m = std::min(match.length, n - 1);  // the last token is computed for its logits
      std::vector<bool> placed(n, false);
      place_pieces(index_, match, m, rows, positions, kv, placed);
      index_.pin(match);
      add_load(report, match);
    }
    PrefillPlan plan;
    plan.tokens.assign(tokens.begin() + m, tokens.end());
    plan.positions.assign(positions.begin() + m, positions.end());
    plan.rows.assign(rows.begin() + m, rows.end());
    plan.visibility = causal_chain(n - m, m);
    plan.logits_for = {n - m - 1};
    const auto t0 = Clock::now();
    PrefillResult r = fwd.prefill(plan, kv);
    const double ms_per_token = ms_since(t0) / static_cast<double>(n - m);  // cost-aware policies
    kv.set_n_past(n);
    if (reuse_) {
      const auto lk = index_.lock();
      index_.insert(ns_, tokens, rows_span(kv, rows), ms_per_token);
      index_.unpin(match);
    }
    const int n_layer = fwd.model().config().n_layer;
    report.prompt_tokens = report.flat_tokens = n;
    report.computed_tokens = n - m;
    report.reused_tokens = m;
    report.attention_pairs = r.attention_pairs / n_layer;
    report.logits = std::move(r.logits);
    return report;
  }
  std::vector<Lookup> lookups(const PromptParts& parts) const override {
    if (!reuse_) return {};
    return {{ns_, parts.flat()}};
  }

 private:
  std::string name_;
  RadixIndex& index_;
  uint64_t ns_;
  bool reuse_;
};

class DepCacheStrategy final : public Strategy {
 public:
  DepCacheStrategy(RadixIndex& index, uint64_t ns, PositionScheme scheme, bool reuse)
      : index_(index), ns_(ns), scheme_(scheme), reuse_(reuse) {}
  std::string_view name() const override { return "depcache"; }

  PrefillReport prefill(const PromptParts& parts, KvCache& kv, Forward& fwd) override {
    const DepPrompt prompt = parts.dep_prompt();
    const auto n = static_cast<int64_t>(prompt.size());
    check_fits(n, kv);
    kv.clear();
    const std::vector<int32_t> positions = prompt.positions(scheme_);
    std::vector<bool> placed(n, false);
    std::vector<RadixIndex::Match> pinned;
    const std::vector<CacheRun> runs = dependency_runs(prompt, ns_, scheme_);
    const auto& tokens = prompt.tokens();

    PrefillReport report;
    if (reuse_) {
      const auto lk = index_.lock();  // match, place and pin before anything else moves
      const uint64_t tick = index_.begin_request();
      for (const CacheRun& run : runs) {
        RadixIndex::Match match = index_.match(run.ns, run.tokens, tick);
        add_load(report, match);
        place_pieces(index_, match, match.length, run.rows, positions, kv, placed);
        index_.pin(match);
        pinned.push_back(std::move(match));
      }
    }
    // The last token always runs: its logits start the answer.
    placed[n - 1] = false;
    std::vector<int64_t> computed;
    for (int64_t r = 0; r < n; ++r)
      if (!placed[r]) computed.push_back(r);

    PrefillPlan plan;
    for (int64_t r : computed) {
      plan.tokens.push_back(tokens[r]);
      plan.positions.push_back(positions[r]);
      plan.rows.push_back(r);
    }
    plan.visibility = dependency_dag(prompt, computed);
    plan.logits_for = {static_cast<int64_t>(computed.size()) - 1};
    const auto t0 = Clock::now();
    PrefillResult result = fwd.prefill(plan, kv);
    const double ms_per_token = ms_since(t0) / static_cast<double>(computed.size());  // cost-aware policies
    kv.set_n_past(n);

    if (reuse_) {
      const auto lk = index_.lock();
      // Each inserted run stays pinned until all are in, so one run's insert
      // cannot evict another this request just computed.
      for (const CacheRun& run : runs) {
        RadixIndex::Match path;
        index_.insert(run.ns, run.tokens, rows_span(kv, run.rows), ms_per_token, &path);
        index_.pin(path);
        pinned.push_back(std::move(path));
      }
      for (const RadixIndex::Match& m : pinned) index_.unpin(m);
    }
    const int n_layer = fwd.model().config().n_layer;
    const auto n_computed = static_cast<int64_t>(computed.size());
    report.prompt_tokens = n;
    report.computed_tokens = n_computed;
    report.reused_tokens = n - n_computed;
    report.attention_pairs = result.attention_pairs / n_layer;
    report.flat_tokens = parts.n_flat_tokens();
    report.logits = std::move(result.logits);
    return report;
  }
  std::vector<Lookup> lookups(const PromptParts& parts) const override {
    std::vector<Lookup> out;
    if (!reuse_) return out;
    for (CacheRun& run : dependency_runs(parts.dep_prompt(), ns_, scheme_))
      out.push_back({run.ns, std::move(run.tokens)});
    return out;
  }

 private:
  RadixIndex& index_;
  uint64_t ns_;
  PositionScheme scheme_;
  bool reuse_;
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
  // (up to float rounding); under the sequential scheme a subtree is reused
  // wherever it moves, its keys rotated to the new positions — approximate
  // by design unless the tree and its offset are unchanged.
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

std::vector<std::string> strategy_names() { return {"full", "prefix", "depcache"}; }

std::unique_ptr<Strategy> make_strategy(std::string_view name, RadixIndex& index, const Model& model,
                                        DType kv_type, const StrategyOptions& options) {
  const uint64_t fp = model.fingerprint();
  if (name == "full" || name == "prefix")
    return std::make_unique<FlatStrategy>(std::string(name), index, namespace_key(fp, kv_type, "prefix"),
                                          name == "prefix" && options.reuse);
  if (name == "depcache")
    return std::make_unique<DepCacheStrategy>(index, namespace_key(fp, kv_type, "depcache"), options.scheme,
                                              options.reuse);
  fail(ErrorKind::InvalidInput, "unknown strategy '{}' (expected full, prefix or depcache)", name);
}

}  // namespace depcache

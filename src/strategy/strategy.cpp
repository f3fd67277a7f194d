#include "strategy/strategy.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "engine/visibility.h"
#include "kv/pin_lease.h"
#include "strategy/cache_craft.h"
#include "strategy/chunk_reuse.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/timing.h"

namespace depcache {
namespace {

uint64_t hash_ints(uint64_t h, std::span<const int32_t> v) { return hash_bytes(v.data(), v.size_bytes(), h); }

// The tier a match's token `at` was found in. A node is never in a slower
// tier than its parent and remote blocks extend the local match, so a
// match's tokens are its hot ones, then host, disk and remote, in that order.
// A match cut short (match_run's whole stops) loses its slowest tokens.
int8_t found_tier(const RadixIndex::Match& m, int64_t at) {
  int last = 0;
  for (int t = 0; t < RadixIndex::kTiers; ++t) {
    if (m.tokens_from[t] <= 0) continue;
    if (at < m.tokens_from[t]) return static_cast<int8_t>(t);
    at -= m.tokens_from[t];
    last = t;
  }
  return static_cast<int8_t>(last);
}

RadixIndex::SpanMaker rows_span(const KvCache& kv, std::span<const int64_t> rows) {
  return [&kv, rows](int64_t begin, int64_t end) { return kv.extract(rows.subspan(begin, end - begin)); };
}

// The flat prompt, causal, with the longest cached prefix placed; without
// reuse this is plain full prefill (the `full` strategy). As a knowledge
// tree (`ragcache`) the run is the system prompt and the documents, with a
// stop after each: the question is never stored and a document is reused
// whole or not at all.
class FlatStrategy final : public Strategy {
 public:
  FlatStrategy(std::string name, RadixIndex& index, uint64_t ns, bool reuse, bool knowledge_tree)
      : Strategy(index, reuse), name_(std::move(name)), ns_(ns), knowledge_tree_(knowledge_tree) {}
  std::string_view name() const override { return name_; }
  RequestPlan plan(const PromptParts& parts) const override {
    RequestPlan p;
    p.tokens = parts.flat();
    const auto n = static_cast<int64_t>(p.tokens.size());
    p.flat_tokens = n;
    for (int64_t t = 0; t < n; ++t) p.positions.push_back(static_cast<int32_t>(t));
    CacheRun run{ns_, p.tokens, {}, -1};
    if (knowledge_tree_) {
      auto end = static_cast<int64_t>(parts.system.size());
      if (end > 0) run.stops.push_back(end);
      for (const auto& [begin, item_end] : parts.flat_item_ranges()) {
        end = item_end;
        if (run.stops.empty() || run.stops.back() < end) run.stops.push_back(end);
      }
      run.tokens.resize(static_cast<size_t>(end));
    }
    for (int64_t t = 0; t < static_cast<int64_t>(run.tokens.size()); ++t) run.rows.push_back(t);
    if (reuse() && !run.tokens.empty()) p.runs.push_back(std::move(run));
    // What is placed is a prefix: the rest is a causal chain after it.
    p.visibility = [](std::span<const int64_t> computed) {
      return causal_chain(static_cast<int64_t>(computed.size()), computed.front());
    };
    return p;
  }

 private:
  std::string name_;
  uint64_t ns_;
  bool knowledge_tree_;
};

class DepCacheStrategy final : public Strategy {
 public:
  DepCacheStrategy(RadixIndex& index, uint64_t ns, const StrategyOptions& options)
      : Strategy(index, options.reuse),
        ns_(ns),
        scheme_(options.scheme),
        tree_context_(options.tree_context),
        realign_(options.realign) {}
  std::string_view name() const override { return "depcache"; }
  RequestPlan plan(const PromptParts& parts) const override {
    auto prompt = std::make_shared<const DepPrompt>(parts.dep_prompt(tree_context_));
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
  TreeContext tree_context_;
  bool realign_;
};

}  // namespace

int64_t whole_stops(std::span<const int64_t> stops, int64_t length) {
  if (stops.empty()) return length;
  const auto it = std::upper_bound(stops.begin(), stops.end(), length);
  return it == stops.begin() ? int64_t{0} : *std::prev(it);
}

int64_t cached_length(const RadixIndex& index, const Lookup& lookup) {
  return whole_stops(lookup.stops, index.peek(lookup.ns, lookup.tokens).length);
}

RadixIndex::Match match_run(RadixIndex& index, const CacheRun& run, uint64_t request_tick,
                            int64_t fresh_tokens, bool remote) {
  if (run.stops.empty()) return index.match(run.ns, run.tokens, request_tick, fresh_tokens, remote);
  // The longest cached run of whole stops, matched (one access per node it uses).
  const int64_t cut = whole_stops(run.stops, index.peek(run.ns, run.tokens).length);
  if (cut == 0) return {};
  RadixIndex::Match m = index.match(run.ns, std::span<const int32_t>(run.tokens).first(cut), request_tick,
                                    fresh_tokens, remote);
  // A lower tier's bad record may end the match early: still whole stops only.
  if (m.length < cut) {
    const int64_t keep = whole_stops(run.stops, m.length);
    int64_t at = 0;
    size_t i = 0;
    for (; i < m.pieces.size() && at < keep; ++i) {
      m.pieces[i].length = std::min(m.pieces[i].length, keep - at);
      at += m.pieces[i].length;
    }
    m.pieces.resize(i);
    if (m.loading.size() > i) m.loading.resize(i);
    m.length = keep;
  }
  return m;
}

void insert_run(RadixIndex& index, const CacheRun& run, const RadixIndex::SpanMaker* make_span,
                size_t bytes_per_token, double cost_per_token, RadixIndex::Match* path) {
  const std::span<const int32_t> all(run.tokens);
  const auto insert = [&](std::span<const int32_t> tokens) {
    if (make_span)
      index.insert(run.ns, tokens, *make_span, cost_per_token, path);
    else
      index.insert_virtual(run.ns, tokens, bytes_per_token, cost_per_token, path);
  };
  // A node per stop: each insert adds the next one under the last (what is
  // cached already is walked, not added).
  for (int64_t stop : run.stops)
    if (stop < static_cast<int64_t>(all.size())) insert(all.first(static_cast<size_t>(stop)));
  insert(all);
}

uint64_t scoped_namespace(uint64_t ns, uint64_t scope) {
  if (scope == 0) return ns;
  const uint64_t both[2] = {ns, scope};
  return hash_bytes(both, sizeof both, 0x73636f7065ULL);
}

void scope_plan(RequestPlan& plan, uint64_t scope) {
  plan.scope = scope;
  for (CacheRun& run : plan.runs) run.ns = scoped_namespace(run.ns, scope);
}

uint64_t strategy_namespace(uint64_t fingerprint, DType kv_type, std::string_view kind) {
  uint64_t h = hash_bytes(&fingerprint, sizeof fingerprint);
  const auto t = static_cast<int32_t>(kv_type);
  h = hash_bytes(&t, sizeof t, h);
  return hash_string(kind, h);
}

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
  // unchanged, or the tree sees nothing but itself (TreeContext::None) and
  // moved whole: its KV depends on distances inside it alone, so the
  // rotation is exact wherever the matched nodes kept theirs.
  std::vector<bool> has_child(prompt.nodes().size(), false);
  for (const PromptNode& node : prompt.nodes())
    if (node.parent >= 0) has_child[node.parent] = true;
  const auto scheme_id = static_cast<int32_t>(scheme);
  for (int32_t si = 0; si < static_cast<int32_t>(prompt.segments().size()); ++si) {
    const PromptSegment& seg = prompt.segments()[si];
    if (seg.kind != SegmentKind::Tree) continue;
    // What the tree saw keys it: the segments it depends on (none for a tree
    // alone, which keeps its keys apart from a tree that saw an empty one).
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

TreeContext default_tree_context(const ModelConfig& config) {
  if (config.tree_context.empty()) return TreeContext::System;
  const auto c = parse_tree_context(config.tree_context);
  if (!c)
    fail(ErrorKind::InvalidInput, "the model's {} is '{}', not a tree context (system, none)",
         kTreeContextKey, config.tree_context);
  return *c;
}

PlanExecution::PlanExecution(const RequestPlan& plan, RadixIndex& index, KvCache& kv, int64_t row0,
                             bool read_remote)
    : plan_(plan), index_(index), lease_(index), n_layer_(kv.n_layer()) {
  const auto n = static_cast<int64_t>(plan.tokens.size());
  if (n == 0) fail(ErrorKind::InvalidInput, "an empty prompt");
  if (row0 < 0 || row0 + n > kv.n_ctx())
    fail(ErrorKind::LimitExceeded, "the prompt holds {} tokens, more than the context size {}", n,
         kv.n_ctx() - std::max<int64_t>(row0, 0));
  if (!plan.fill_positions.empty() && (plan.fill_positions.size() != plan.tokens.size() || !plan.next_pass))
    fail(ErrorKind::Internal, "fill positions without a next pass, or not one per token");
  const std::vector<int32_t>& at = plan.fill_positions.empty() ? plan.positions : plan.fill_positions;
  placed_.assign(n, false);
  placed_ns_.assign(n, 0);
  placed_tier_.assign(n, 0);
  if (!plan.runs.empty()) {
    const auto lk = index.lock();  // match, place and pin before anything else moves
    const uint64_t tick = index.begin_request();
    // What the request will compute, as far as a look ahead tells: only the
    // automatic layer-wise preload depth needs it.
    int64_t fresh = 0;
    if (index.layer_preload().mode == RadixIndex::LayerPreload::Mode::Auto) {
      std::vector<bool> found(n, false);
      for (const CacheRun& run : plan.runs) {
        const int64_t len = cached_length(index, {run.ns, run.tokens, run.stops});
        for (int64_t i = 0; i < len; ++i) found[run.rows[i]] = true;
      }
      fresh = std::max<int64_t>(1, std::count(found.begin(), found.end(), false));
    }
    for (const CacheRun& run : plan.runs) {
      if (run.whole) {
        if (std::any_of(run.rows.begin(), run.rows.end(), [&](int64_t r) { return placed_[r]; })) continue;
        const auto whole = static_cast<int64_t>(run.tokens.size());
        RadixIndex::Match peeked = index.peek(run.ns, run.tokens);
        if (peeked.length < whole && read_remote &&
            index.prefetch(run.ns, run.tokens) > 0)  // from the remote store
          peeked = index.peek(run.ns, run.tokens);
        if (peeked.length < whole) continue;
        if (run.fix_overhead >= 0) index.set_fix_overhead(peeked, run.fix_overhead);
      }
      const RadixIndex::Match match = match_run(index, run, tick, fresh, read_remote);
      report_.load_ms += match.load_ms;
      place_match(match, run, row0, at, kv);
      lease_.hold(match);
    }
  }
  // The last token always runs (its logits start the answer), so it is not
  // reused even when cached.
  placed_[n - 1] = false;
  // Nor placed from a load: the hook places after the pass set each row's
  // position, and would give the last row its cached one.
  for (auto it = layered_.begin(); it != layered_.end(); ++it)
    if (it->row + it->n == n) {
      it->positions.pop_back();
      if (--it->n == 0) layered_.erase(it);
      break;
    }
  std::vector<int64_t> computed;
  if (!plan.next_pass) {
    for (int64_t r = 0; r < n; ++r)
      if (!placed_[r]) computed.push_back(r);
    Visibility visibility = plan.visibility(computed);
    set_pass({std::move(computed), std::move(visibility), {}, {}, true}, plan.positions);
    hook_layered_placement();
    return;
  }
  // Several passes: first the rows to fill.
  for (int64_t r = 0; r < std::min(plan.fill_end, n - 1); ++r)
    if (!placed_[r]) computed.push_back(r);
  if (computed.empty()) {
    settle_layered(kv, row0);  // no pass to hide the reads behind
    after_fill(kv, row0, 0);
    return;
  }
  filling_ = true;
  Visibility visibility = plan.visibility(computed);
  set_pass({std::move(computed), std::move(visibility), {}, {}, false}, at);
  hook_layered_placement();
}

void PlanExecution::place_match(const RadixIndex::Match& match, const CacheRun& run, int64_t row0,
                                std::span<const int32_t> positions, KvCache& kv) {
  // Each piece covers the run's next tokens; its rows may be split in runs
  // of consecutive rows, each placed at its prompt positions (or, without
  // realign, at the positions it was cached at).
  int64_t at = 0;
  for (size_t k = 0; k < match.pieces.size() && at < match.length; ++k) {
    const RadixIndex::Piece& p = match.pieces[k];
    const LayerLoader* loading = k < match.loading.size() ? match.loading[k].get() : nullptr;
    // Every load is adopted after the pass, even one whose rows came from
    // elsewhere: a node's children must not be hot while it stays on disk.
    if (loading && std::none_of(loads_.begin(), loads_.end(),
                                [&](const LayeredLoad& l) { return l.loader.get() == loading; }))
      loads_.push_back({match.loading[k], p.node});
    const KvSpan& span = loading ? loading->span() : index_.span(p.node);
    const int64_t len = std::min(p.length, match.length - at);
    for (int64_t i = 0; i < len;) {
      if (placed_[run.rows[at + i]]) {
        ++i;
        continue;
      }
      int64_t j = i + 1;
      while (j < len && run.rows[at + j] == run.rows[at + j - 1] + 1 && !placed_[run.rows[at + j]]) ++j;
      const std::span<const int32_t> to =
          plan_.realign ? positions.subspan(run.rows[at + i], j - i)
                        : std::span<const int32_t>(span.positions()).subspan(p.offset + i, j - i);
      if (loading)
        layered_.push_back({match.loading[k], p.node, p.offset + i, j - i, run.rows[at + i],
                            std::vector<int32_t>(to.begin(), to.end())});
      else
        kv.place(span, p.offset + i, j - i, row0 + run.rows[at + i], to);
      for (int64_t r = i; r < j; ++r) {
        placed_[run.rows[at + r]] = true;
        placed_ns_[run.rows[at + r]] = run.ns;
        placed_tier_[run.rows[at + r]] = found_tier(match, at + r);
      }
      i = j;
    }
    at += len;
  }
}

void PlanExecution::hook_layered_placement() {
  if (layered_.empty()) return;
  prefill_.hook = [this, inner = std::move(prefill_.hook)](const LayerKv& layer) {
    // Where the assembly sits now (the engine may have moved it since).
    const int64_t row0 = layer.rows.front() - prefill_.rows.front();
    place_layers(*layer.kv, row0, layer.layer + 1);
    return inner ? inner(layer) : std::vector<int64_t>(layer.active.begin(), layer.active.end());
  };
}

void PlanExecution::place_layers(KvCache& kv, int64_t row0, int layer_end) {
  for (; layers_placed_ < layer_end; ++layers_placed_)
    for (const LayeredPlacement& p : layered_) {
      if (!p.loader->wait(layers_placed_)) throw LayerLoadError(p.node, p.loader->key(), layers_placed_);
      kv.place(p.loader->span(), p.from, p.n, row0 + p.row, p.positions, layers_placed_, layers_placed_ + 1);
    }
}

double PlanExecution::settle_layered(KvCache& kv, int64_t row0) {
  if (loads_.empty()) return 0;
  place_layers(kv, row0, n_layer_);  // a pass that stopped early did not reach them all
  double waited = 0;
  // In match order, parents before children.
  for (const LayeredLoad& l : loads_) {
    waited += l.loader->waited_ms();
    // A load no row needed may be bad: the node goes, with what hangs below.
    if (!index_.adopt_loaded(l.node, *l.loader) && l.loader->failed())
      index_.drop_bad_load(l.node, l.loader->key());
  }
  loads_.clear();
  layered_.clear();
  report_.layer_wait_ms += waited;
  return waited;
}

void PlanExecution::after_pass(KvCache& kv, int64_t row0, const PassResult& done) {
  // A pass that waited for layers timed the disk too, not only computation.
  if (settle_layered(kv, row0) == 0) index_.note_prefill(done.ms_per_token);
}

LayerLoadError::LayerLoadError(RadixIndex::NodeId node, uint64_t disk_key, int layer)
    : Error(ErrorKind::InvalidInput,
            fmt::format(
                "a cached span's layer {} on disk failed its checksum (the tokens are computed instead)",
                layer)),
      node_(node),
      disk_key_(disk_key) {}

void PlanExecution::set_pass(PassPlan pass, std::span<const int32_t> positions) {
  const auto n = static_cast<int64_t>(plan_.tokens.size());
  if (pass.rows.empty() || !std::is_sorted(pass.rows.begin(), pass.rows.end()) || pass.rows.front() < 0 ||
      pass.rows.back() >= n || (pass.last && pass.rows.back() != n - 1))
    fail(ErrorKind::Internal,
         "a pass must compute ascending prompt rows, the last one ending with the last row");
  prefill_ = PrefillPlan{};
  for (int64_t r : pass.rows) {
    prefill_.tokens.push_back(plan_.tokens[r]);
    prefill_.positions.push_back(positions[r]);
  }
  prefill_.rows = std::move(pass.rows);
  prefill_.visibility = std::move(pass.visibility);
  last_ = pass.last;
  if (last_) prefill_.logits_for = {static_cast<int64_t>(prefill_.rows.size()) - 1};
  if (!pass.probe.queries.empty()) {
    for (int64_t q : pass.probe.queries) {
      const auto it = std::lower_bound(prefill_.rows.begin(), prefill_.rows.end(), q);
      if (it == prefill_.rows.end() || *it != q)
        fail(ErrorKind::Internal, "a probe query the pass does not compute");
      prefill_.stats_queries.push_back(it - prefill_.rows.begin());
    }
    prefill_.stats_targets = std::move(pass.probe.targets);
    prefill_.stats_from_layer = pass.probe.from_layer < 0 ? n_layer_ - 1 : pass.probe.from_layer;
  }
  if (pass.hook) {
    // Counts what the hook's choices compute, layer by layer.
    prefill_.hook = [this, hook = std::move(pass.hook)](const LayerKv& layer) {
      layer_tokens_ += static_cast<int64_t>(layer.active.size());
      return hook(layer);
    };
  } else {
    layer_tokens_ += static_cast<int64_t>(prefill_.rows.size()) * n_layer_;
  }
}

void PlanExecution::insert_runs(const KvCache& kv, int64_t row0, double ms_per_token, RunInsert when) {
  if (plan_.runs.empty()) return;
  const auto lk = index_.lock();
  // Every node this request computed is charged the request's cost per
  // computed token (RAGCache's Cost_i / NewSize_i).
  const auto cached = static_cast<int64_t>(std::count(placed_.begin(), placed_.end(), true));
  const double cost_per_token =
      index_.cost_per_token(cached, static_cast<int64_t>(placed_.size()) - cached, ms_per_token);
  // Each inserted run stays held until all are in, so one run's insert
  // cannot evict another this request just computed.
  std::vector<int64_t> kv_rows;
  for (const CacheRun& run : plan_.runs) {
    if (run.insert != when) continue;
    if (std::any_of(run.rows.begin(), run.rows.end(),
                    [&](int64_t r) { return placed_[r] && placed_ns_[r] != run.ns; }))
      continue;
    kv_rows.assign(run.rows.begin(), run.rows.end());
    for (int64_t& r : kv_rows) r += row0;
    RadixIndex::Match path;
    const RadixIndex::SpanMaker make_span = rows_span(kv, kv_rows);
    insert_run(index_, run, &make_span, 0, cost_per_token, &path);
    lease_.hold(path);
  }
}

void PlanExecution::after_fill(KvCache& kv, int64_t row0, double ms_per_token) {
  filling_ = false;
  insert_runs(kv, row0, ms_per_token,
              RunInsert::AfterFill);  // as computed alone, wherever this request puts them
  if (!plan_.fill_positions.empty() && plan_.realign) {
    // Every row where the fill put it elsewhere, re-encoded at its place
    // (without realign, an ablation, they stay where they were computed).
    const auto n = static_cast<int64_t>(plan_.tokens.size());
    for (int64_t r = 0; r < n;) {
      if (plan_.fill_positions[r] == plan_.positions[r]) {
        ++r;
        continue;
      }
      int64_t e = r + 1;
      while (e < n && plan_.fill_positions[e] != plan_.positions[e]) ++e;
      std::vector<int64_t> rows;
      for (int64_t i = r; i < e; ++i) rows.push_back(row0 + i);
      kv.place(kv.extract(rows), 0, e - r, row0 + r,
               std::span<const int32_t>(plan_.positions)
                   .subspan(static_cast<size_t>(r), static_cast<size_t>(e - r)));
      r = e;
    }
  }
  set_pass(plan_.next_pass(PassState{kv, row0, placed_, placed_ns_, done_, nullptr, plan_.scope}),
           plan_.positions);
  ++done_;
}

void PlanExecution::next_pass(KvCache& kv, int64_t row0, const PassResult& done) {
  if (last_) fail(ErrorKind::Internal, "next_pass after the final pass");
  after_pass(kv, row0, done);
  report_.attention_pairs += done.attention_pairs;
  if (filling_) {
    after_fill(kv, row0, done.ms_per_token);
    return;
  }
  set_pass(plan_.next_pass(PassState{kv, row0, placed_, placed_ns_, done_, probed(done), plan_.scope}),
           plan_.positions);
  ++done_;
}

const AttentionMass* PlanExecution::probed(const PassResult& done) const {
  if (prefill_.stats_queries.empty()) return nullptr;
  if (done.attention_mass.size() != static_cast<size_t>(n_layer_))
    fail(ErrorKind::Internal, "a probing pass returned no attention statistics");
  return &done.attention_mass;
}

int64_t PlanExecution::keep_computed(const KvCache& kv, int64_t row0, int64_t n_computed,
                                     double ms_per_token) {
  if (plan_.next_pass || whole_pass() || n_computed <= 0) return 0;
  std::vector<bool> ready = placed_;
  for (int64_t q = 0; q < n_computed && q < static_cast<int64_t>(prefill_.rows.size()); ++q)
    ready[static_cast<size_t>(prefill_.rows[static_cast<size_t>(q)])] = true;
  const auto lk = index_.lock();
  const auto cached = static_cast<int64_t>(std::count(placed_.begin(), placed_.end(), true));
  const double cost_per_token =
      index_.cost_per_token(cached, static_cast<int64_t>(placed_.size()) - cached, ms_per_token);
  int64_t kept = 0;
  std::vector<int64_t> kv_rows;
  for (const CacheRun& run : plan_.runs) {
    if (run.insert != RunInsert::AfterFill) continue;
    if (std::any_of(run.rows.begin(), run.rows.end(),
                    [&](int64_t r) { return placed_[r] && placed_ns_[r] != run.ns; }))
      continue;
    auto n = static_cast<int64_t>(
        std::find_if(run.rows.begin(), run.rows.end(), [&](int64_t r) { return !ready[r]; }) -
        run.rows.begin());
    if (n < static_cast<int64_t>(run.rows.size())) n = whole_stops(run.stops, n);
    if (n == 0) continue;
    CacheRun part{run.ns,
                  {run.tokens.begin(), run.tokens.begin() + n},
                  {run.rows.begin(), run.rows.begin() + n},
                  run.segment};
    for (int64_t stop : run.stops)
      if (stop <= n) part.stops.push_back(stop);
    kv_rows.assign(part.rows.begin(), part.rows.end());
    for (int64_t& r : kv_rows) r += row0;
    const RadixIndex::SpanMaker make_span = rows_span(kv, kv_rows);
    insert_run(index_, part, &make_span, 0, cost_per_token, nullptr);
    kept += n;
  }
  return kept;
}

PrefillReport PlanExecution::finish(KvCache& kv, int64_t row0, std::vector<float> logits,
                                    const PassResult& done) {
  after_pass(kv, row0, done);
  if (!plan_.next_pass) insert_runs(kv, row0, done.ms_per_token, RunInsert::AfterFill);
  insert_runs(kv, row0, done.ms_per_token, RunInsert::AtEnd);
  if (plan_.learn) plan_.learn(PassState{kv, row0, placed_, placed_ns_, done_, probed(done), plan_.scope});
  lease_.release();
  const auto n = static_cast<int64_t>(plan_.tokens.size());
  report_.prompt_tokens = n;
  report_.computed_tokens = (layer_tokens_ + n_layer_ / 2) / std::max(n_layer_, 1);
  // Each placed row once, to the tier its first placement found it in: rows
  // shared by several runs (a tree's common prefix) are placed once, so the
  // tiers add up to the rows reused.
  for (int64_t r = 0; r < n; ++r)
    if (placed_[r]) {
      ++report_.reused_tokens;
      ++report_.reused_from[placed_tier_[r]];
    }
  report_.attention_pairs += done.attention_pairs;
  report_.flat_tokens = plan_.flat_tokens;
  report_.logits = std::move(logits);
  return std::move(report_);
}

namespace {

PrefillReport apply_plan_once(const RequestPlan& plan, RadixIndex& index, KvCache& kv, Forward& fwd) {
  kv.clear();
  PlanExecution ex(plan, index, kv, 0);
  const int n_layer = fwd.model().config().n_layer;
  for (;;) {
    const auto t0 = Clock::now();
    PrefillResult result = fwd.prefill(ex.prefill(), kv);
    const PassResult done{result.attention_mass, result.attention_pairs / n_layer,
                          ms_since(t0) / static_cast<double>(ex.prefill().tokens.size())};
    if (!ex.final_pass()) {
      ex.next_pass(kv, 0, done);
      continue;
    }
    kv.set_n_past(static_cast<int64_t>(plan.tokens.size()));
    return ex.finish(kv, 0, std::move(result.logits), done);
  }
}

}  // namespace

PrefillReport apply_plan(const RequestPlan& plan, RadixIndex& index, KvCache& kv, Forward& fwd) {
  for (int stale = 0;;) {
    try {
      return apply_plan_once(plan, index, kv, fwd);
    } catch (const LayerLoadError& e) {
      // The execution (and its pins) is gone: without the bad node the
      // request computes those tokens. Each retry drops one node, unless
      // something else dropped it first (then a few more tries).
      if (!index.drop_bad_load(e.node(), e.disk_key()) && ++stale > 3) throw;
    }
  }
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
  if (plan.next_pass) {
    // They are computed by the last pass, after the prompt.
    if (!out.fill_positions.empty())
      out.fill_positions.insert(out.fill_positions.end(), out.positions.begin() + n, out.positions.end());
    const auto g = static_cast<int64_t>(generated.size());
    out.next_pass = [next = plan.next_pass, n, g](const PassState& state) {
      PassPlan pass = next(state);
      if (!pass.last) return pass;
      std::vector<QueryGroup> groups = pass.visibility.groups();
      groups.push_back({static_cast<int64_t>(pass.rows.size()), g, {}, 0, n});
      for (int64_t i = 0; i < g; ++i) pass.rows.push_back(n + i);
      pass.visibility = Visibility(std::move(groups));
      return pass;
    };
    return out;
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
  for (const CacheRun& run : runs) out.push_back({run.ns, run.tokens, run.stops});
  return out;
}

std::vector<std::string> strategy_names() {
  return {"full", "prefix", "ragcache", "depcache", "fullreuse", "cacheblend", "fusionrag", "cachecraft"};
}

std::unique_ptr<Strategy> make_strategy(std::string_view name, RadixIndex& index, const Model& model,
                                        DType kv_type, const StrategyOptions& options) {
  return make_strategy(name, index, model.fingerprint(), kv_type, options);
}

std::unique_ptr<Strategy> make_strategy(std::string_view name, RadixIndex& index, uint64_t fp, DType kv_type,
                                        const StrategyOptions& options) {
  if (name == "full" || name == "prefix")
    return std::make_unique<FlatStrategy>(std::string(name), index, strategy_namespace(fp, kv_type, "prefix"),
                                          name == "prefix" && options.reuse, false);
  // Its own namespace: a knowledge tree's nodes end at documents, a prefix
  // tree's anywhere (sharing one tree would let either split the other's).
  if (name == "ragcache")
    return std::make_unique<FlatStrategy>(std::string(name), index,
                                          strategy_namespace(fp, kv_type, "ragcache"), options.reuse, true);
  if (name == "depcache")
    return std::make_unique<DepCacheStrategy>(index, strategy_namespace(fp, kv_type, "depcache"), options);
  if (name == "cachecraft") return make_cache_craft(index, fp, kv_type, options);
  const std::pair<std::string_view, ChunkRecompute> chunk[] = {{"fullreuse", ChunkRecompute::None},
                                                               {"cacheblend", ChunkRecompute::CacheBlend},
                                                               {"fusionrag", ChunkRecompute::FusionRag}};
  for (const auto& [chunk_name, recompute] : chunk)
    if (name == chunk_name) return make_chunk_strategy(name, recompute, index, fp, kv_type, options);
  fail(ErrorKind::InvalidInput, "unknown strategy '{}' (expected {})", name,
       fmt::join(strategy_names(), ", "));
}

}  // namespace depcache

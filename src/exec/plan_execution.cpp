#include "exec/plan_execution.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"
#include "util/timing.h"

namespace depcache {
namespace {

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

RadixIndex::SpanMaker rows_span(const KvAssembly& kv, std::span<const int64_t> rows) {
  return [&kv, rows](int64_t begin, int64_t end) { return kv.extract(rows.subspan(begin, end - begin)); };
}

}  // namespace

PlanExecution::PlanExecution(const RequestPlan& plan, RadixIndex& index, KvAssembly& kv, int64_t row0,
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
                                std::span<const int32_t> positions, KvAssembly& kv) {
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

void PlanExecution::place_layers(KvAssembly& kv, int64_t row0, int layer_end) {
  for (; layers_placed_ < layer_end; ++layers_placed_)
    for (const LayeredPlacement& p : layered_) {
      if (!p.loader->wait(layers_placed_)) throw LayerLoadError(p.node, p.loader->key(), layers_placed_);
      kv.place(p.loader->span(), p.from, p.n, row0 + p.row, p.positions, layers_placed_, layers_placed_ + 1);
    }
}

double PlanExecution::settle_layered(KvAssembly& kv, int64_t row0) {
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

void PlanExecution::after_pass(KvAssembly& kv, int64_t row0, const PassResult& done) {
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

void PlanExecution::insert_runs(const KvAssembly& kv, int64_t row0, double ms_per_token, RunInsert when) {
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

void PlanExecution::after_fill(KvAssembly& kv, int64_t row0, double ms_per_token) {
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

void PlanExecution::next_pass(KvAssembly& kv, int64_t row0, const PassResult& done) {
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

int64_t PlanExecution::keep_computed(const KvAssembly& kv, int64_t row0, int64_t n_computed,
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

PrefillReport PlanExecution::finish(KvAssembly& kv, int64_t row0, std::vector<float> logits,
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

}  // namespace depcache

#include "strategy/cache_craft.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "exec/visibility.h"
#include "strategy/chunk_reuse.h"
#include "util/error.h"
#include "util/hash.h"

namespace depcache {

VariantFit fit_variant(const ChunkVariant& v, std::span<const uint64_t> context, double alpha) {
  VariantFit f;
  f.cci = v.cci;
  // Where each chunk of the new context sits (its first occurrence).
  const auto at = [&](uint64_t h) {
    const auto it = std::find(context.begin(), context.end(), h);
    return it == context.end() ? -1 : static_cast<int64_t>(it - context.begin());
  };
  std::vector<int64_t> shared_at;  // new positions of the shared chunks, in the old order
  double total = 0, shared = 0;
  for (size_t j = 0; j < v.context.size(); ++j) {
    const double inter = j < v.inter.size() ? v.inter[j] : 0.0;
    total += inter;
    const int64_t now = at(v.context[j]);
    if (now < 0) continue;
    shared += inter;
    shared_at.push_back(now);
  }
  if (v.context.empty())
    f.beta = context.empty() ? 1.0 : 0.0;  // it saw no earlier chunk: all of this context is new to it
  else if (total > 0)
    f.beta = shared / total;
  else
    f.beta = static_cast<double>(shared_at.size()) / static_cast<double>(v.context.size());
  const auto m = static_cast<int64_t>(shared_at.size());
  if (m >= 2) {
    int64_t discordant = 0;
    for (int64_t a = 0; a < m; ++a)
      for (int64_t b = a + 1; b < m; ++b) discordant += shared_at[a] > shared_at[b];
    f.gamma = static_cast<double>(discordant) / static_cast<double>(m * (m - 1) / 2);
  }
  f.beta_adjusted = f.beta * (1 - f.gamma);
  f.score = f.cci * (1 - f.beta_adjusted);
  f.cfo = std::clamp(alpha * f.score, 0.0, 1.0);
  return f;
}

std::vector<int> focused_chunks(std::span<const double> cumulative) {
  const auto k = static_cast<int>(cumulative.size());
  std::vector<int> order(k);
  std::iota(order.begin(), order.end(), 0);
  if (k < 3) return order;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cumulative[a] > cumulative[b]; });
  const double spread = cumulative[order.front()] - cumulative[order.back()];
  if (!(spread > 0)) {
    std::sort(order.begin(), order.end());
    return order;
  }
  // Algorithm 1 with its indices: p_i = the i-th gap between neighbours in
  // the ranking as a share of the whole spread, h_i the entropy of p_1..p_i;
  // the cut keeps the top i* chunks, i* in [1, k-2] maximizing h_{i+1} - h_i.
  const auto gap = [&](int i) { return (cumulative[order[i - 1]] - cumulative[order[i]]) / spread; };
  int cut = 1;
  double best = -1;
  for (int i = 1; i <= k - 2; ++i) {
    const double p = gap(i + 1);
    const double gain = p > 0 ? -p * std::log(p) : 0.0;
    if (gain > best) {
      best = gain;
      cut = i;
    }
  }
  order.resize(cut);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<ChunkVariant> ChunkVariants::of(uint64_t chunk) const {
  std::lock_guard lk(mu_);
  const auto it = by_chunk_.find(chunk);
  if (it == by_chunk_.end()) return {};
  return {it->second.begin(), it->second.end()};
}

void ChunkVariants::add(uint64_t chunk, ChunkVariant v) {
  std::lock_guard lk(mu_);
  std::deque<ChunkVariant>& vs = by_chunk_[chunk];
  std::erase_if(vs, [&](const ChunkVariant& old) { return old.ns == v.ns; });
  vs.push_back(std::move(v));
  while (vs.size() > std::max<size_t>(per_chunk_, 1)) vs.pop_front();
}

size_t ChunkVariants::size() const {
  std::lock_guard lk(mu_);
  size_t n = 0;
  for (const auto& [chunk, vs] : by_chunk_) n += vs.size();
  return n;
}

void ChunkVariants::save(const std::filesystem::path& file) const {
  std::lock_guard lk(mu_);
  std::filesystem::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail(ErrorKind::Unavailable, "cannot write {}", tmp.string());
    for (const auto& [chunk, vs] : by_chunk_)
      for (const ChunkVariant& v : vs)
        out << nlohmann::json{{"chunk", chunk},   {"ns", v.ns},   {"context", v.context},
                              {"inter", v.inter}, {"cci", v.cci}, {"ranked", v.ranked}}
                   .dump()
            << '\n';
    if (!out.flush()) fail(ErrorKind::Unavailable, "cannot write {} (disk full?)", tmp.string());
  }
  std::filesystem::rename(tmp, file);
}

size_t ChunkVariants::load(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return 0;
  size_t dropped = 0;
  for (std::string line; std::getline(in, line);) {
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      ChunkVariant v;
      v.ns = j.at("ns").get<uint64_t>();
      v.context = j.at("context").get<std::vector<uint64_t>>();
      v.inter = j.at("inter").get<std::vector<double>>();
      v.cci = j.at("cci").get<double>();
      v.ranked = j.at("ranked").get<std::vector<int32_t>>();
      if (v.inter.size() != v.context.size() || !std::isfinite(v.cci) ||
          std::any_of(v.ranked.begin(), v.ranked.end(), [](int32_t r) { return r < 0; })) {
        ++dropped;
        continue;
      }
      add(j.at("chunk").get<uint64_t>(), std::move(v));
    } catch (const nlohmann::json::exception&) {
      ++dropped;
    }
  }
  return dropped;
}

namespace {

// A variant a plan may place, with its fit to the request.
struct Candidate {
  uint64_t ns = 0;
  VariantFit fit;
  std::vector<int32_t> ranked;
};

// What a request's plan knows of its chunks.
struct CraftPlan {
  ChunkLayout layout;
  std::vector<uint64_t> hashes;                 // per chunk, of its tokens
  std::vector<uint64_t> own;                    // per chunk, the namespace of its variant in this context
  std::vector<std::vector<Candidate>> choices;  // per chunk, the variants it may place, best first
  int window = 0;
  std::shared_ptr<ChunkVariants> store;
};

// Chunks no row of which was placed: computed in full by this request.
std::vector<bool> computed_chunks(const CraftPlan& cp, const PassState& state) {
  std::vector<bool> out;
  for (const RowRange& c : cp.layout.chunks)
    out.push_back(std::none_of(state.placed.begin() + c.begin, state.placed.begin() + c.end,
                               [](bool placed) { return placed; }));
  return out;
}

// The focused-chunk cut as a layer hook: from the layer after the set of
// focused chunks has held for `window` layers, the tokens recomputed in the
// other chunks (fixing[c]: their batch indices) stop.
LayerHook focus_hook(std::vector<std::vector<int64_t>> fixing, size_t first_question, int window) {
  struct Focus {
    std::vector<double> cumulative;
    std::vector<std::vector<int>> history;
    std::vector<int64_t> stopped;  // batch indices that no longer compute, sorted
    bool settled = false;
  };
  auto focus = std::make_shared<Focus>();
  focus->cumulative.assign(fixing.size(), 0.0);
  return [focus, fixing = std::move(fixing), first_question, window](const LayerKv& layer) {
    Focus& f = *focus;
    if (!f.settled && layer.layer > 0 && layer.mass != nullptr) {
      const std::vector<double> prev = summed_mass((*layer.mass)[static_cast<size_t>(layer.layer - 1)],
                                                   first_question, f.cumulative.size());
      for (size_t c = 0; c < prev.size(); ++c) f.cumulative[c] += prev[c];
      f.history.push_back(focused_chunks(f.cumulative));
      const auto w = static_cast<size_t>(window);
      if (f.history.size() >= w &&
          std::all_of(f.history.end() - static_cast<std::ptrdiff_t>(w), f.history.end(),
                      [&](const std::vector<int>& set) { return set == f.history.back(); })) {
        f.settled = true;
        const std::vector<int>& keep = f.history.back();
        for (size_t c = 0; c < fixing.size(); ++c)
          if (!std::binary_search(keep.begin(), keep.end(), static_cast<int>(c)))
            f.stopped.insert(f.stopped.end(), fixing[c].begin(), fixing[c].end());
        std::sort(f.stopped.begin(), f.stopped.end());
      }
    }
    std::vector<int64_t> next;
    std::set_difference(layer.active.begin(), layer.active.end(), f.stopped.begin(), f.stopped.end(),
                        std::back_inserter(next));
    return next;
  };
}

// The one pass: the system prompt rows not placed, every row of the chunks
// computed in full, the tokens to fix of the placed ones, and the rest, each
// seeing every row before it. Probed for the metadata of the computed chunks
// (every layer) and, where the focused-chunk cut runs, for the question's
// attention to each chunk.
PassPlan craft_pass(const CraftPlan& cp, const PassState& state) {
  const ChunkLayout& l = cp.layout;
  std::vector<int64_t> rows;
  for (int64_t r = l.system.begin; r < l.system.end; ++r)
    if (!state.placed[r]) rows.push_back(r);
  const std::vector<bool> computed = computed_chunks(cp, state);
  std::vector<std::vector<int64_t>> fixing(l.chunks.size());  // plan rows, for now
  for (size_t c = 0; c < l.chunks.size(); ++c) {
    const RowRange chunk = l.chunks[c];
    if (computed[c]) {
      for (int64_t r = chunk.begin; r < chunk.end; ++r) rows.push_back(r);
      continue;
    }
    const uint64_t source = state.source[chunk.begin];
    for (const Candidate& cand : cp.choices[c]) {
      if (scoped_namespace(cand.ns, state.scope) != source) continue;
      const auto n = std::min<int64_t>(static_cast<int64_t>(cand.ranked.size()),
                                       static_cast<int64_t>(std::ceil(cand.fit.cfo * chunk.size() - 1e-9)));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = chunk.begin + cand.ranked[static_cast<size_t>(i)];
        if (r < chunk.end) fixing[c].push_back(r);
      }
      std::sort(fixing[c].begin(), fixing[c].end());
      rows.insert(rows.end(), fixing[c].begin(), fixing[c].end());
      break;
    }
  }
  // The prompt's last row always runs (its logits start the answer), also
  // when it ends a placed chunk.
  if (l.tail.size() == 0 && !l.chunks.empty() && !state.placed[l.chunks.back().end - 1])
    rows.push_back(l.chunks.back().end - 1);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  PassPlan pass = recompute_pass(std::move(rows), l.tail, true);
  if (l.chunks.empty()) return pass;
  // A first chunk has no earlier one to attend to: its metadata is known
  // without a probe (learn_variants).
  for (size_t c = 1; c < l.chunks.size(); ++c)
    if (computed[c])
      for (int64_t r = l.chunks[c].begin; r < l.chunks[c].end; ++r) pass.probe.queries.push_back(r);
  // The question's attention feeds the focused-chunk cut only: probed where
  // there are tokens to fix and a window to settle in.
  const bool fixes = std::any_of(fixing.begin(), fixing.end(), [](const auto& f) { return !f.empty(); });
  const bool focus = cp.window > 0 && fixes && l.chunks.size() >= 3;
  const size_t first_question = pass.probe.queries.size();
  if (focus)
    for (int64_t r = l.tail.begin; r < l.tail.end; ++r) pass.probe.queries.push_back(r);
  if (pass.probe.queries.empty()) return pass;
  pass.probe.targets = l.chunks;
  pass.probe.from_layer = 0;
  if (focus) {
    for (std::vector<int64_t>& f : fixing)
      for (int64_t& r : f) r = std::lower_bound(pass.rows.begin(), pass.rows.end(), r) - pass.rows.begin();
    pass.hook = focus_hook(std::move(fixing), first_question, cp.window);
  }
  return pass;
}

// The metadata of each chunk the request computed in full, from the pass's
// probe (its queries: those chunks' rows in order but the first chunk's,
// then the question). The first chunk's needs none: with no earlier chunk
// its CCI is sigmoid(0) = 0.5 and no token outranks another.
void learn_variants(const CraftPlan& cp, const PassState& state) {
  const std::vector<bool> computed = computed_chunks(cp, state);
  size_t q0 = 0;
  for (size_t i = 0; i < cp.layout.chunks.size(); ++i) {
    if (!computed[i]) continue;
    const RowRange chunk = cp.layout.chunks[i];
    const auto n = static_cast<size_t>(chunk.size());
    ChunkVariant v;
    v.ns = cp.own[i];
    v.context.assign(cp.hashes.begin(), cp.hashes.begin() + static_cast<std::ptrdiff_t>(i));
    v.inter.assign(i, 0.0);
    if (i == 0) {
      v.cci = 0.5;
      v.ranked.resize(n);
      std::iota(v.ranked.begin(), v.ranked.end(), 0);
      cp.store->add(cp.hashes[i], std::move(v));
      continue;
    }
    if (state.mass == nullptr) return;
    const AttentionMass& mass = *state.mass;
    std::vector<double> token_score(n, 0.0);
    double a_sum = 0, b_sum = 0;
    int layers = 0;
    for (const std::vector<std::vector<double>>& layer : mass) {
      if (layer.size() < q0 + n) continue;
      double intra = 0, a = 0;
      std::vector<double> inter(i, 0.0);
      for (size_t t = 0; t < n; ++t) {
        const std::vector<double>& m = layer[q0 + t];
        if (m.size() <= i) continue;
        for (size_t j = 0; j < i; ++j) {
          inter[j] += m[j];
          token_score[t] += m[j];
        }
        intra += m[i];
      }
      for (size_t j = 0; j < i; ++j) {
        v.inter[j] += inter[j];
        a += inter[j] / (static_cast<double>(n) * static_cast<double>(cp.layout.chunks[j].size()));
      }
      a_sum += a;
      b_sum += intra / (static_cast<double>(n) * static_cast<double>(n));
      ++layers;
    }
    q0 += n;
    if (layers == 0) continue;
    const double ratio = b_sum > 0 ? a_sum / b_sum : (a_sum > 0 ? INFINITY : 0.0);
    v.cci = 1 / (1 + std::exp(-ratio));
    v.ranked.resize(n);
    std::iota(v.ranked.begin(), v.ranked.end(), 0);
    std::stable_sort(v.ranked.begin(), v.ranked.end(),
                     [&](int32_t x, int32_t y) { return token_score[x] > token_score[y]; });
    cp.store->add(cp.hashes[i], std::move(v));
  }
}

class CacheCraftStrategy final : public Strategy {
 public:
  CacheCraftStrategy(uint64_t fp, DType kv_type, const StrategyOptions& options)
      : Strategy(options.reuse),
        fp_(fp),
        kv_type_(kv_type),
        alpha_(options.cachecraft_alpha),
        window_(options.focus_window),
        store_(std::make_shared<ChunkVariants>(static_cast<size_t>(options.chunk_variants))) {}
  std::string_view name() const override { return "cachecraft"; }
  void save_state(const std::filesystem::path& dir) const override {
    if (reuse()) store_->save(dir / kCacheCraftStateFile);
  }
  size_t load_state(const std::filesystem::path& dir) override {
    return store_->load(dir / kCacheCraftStateFile);
  }

  RequestPlan plan(const PromptParts& parts) const override {
    auto cp = std::make_shared<CraftPlan>();
    cp->layout = chunk_layout(parts);
    cp->window = window_;
    cp->store = store_;
    RequestPlan p;
    p.tokens = parts.flat();
    const auto n = static_cast<int64_t>(p.tokens.size());
    p.flat_tokens = n;
    for (int64_t t = 0; t < n; ++t) p.positions.push_back(static_cast<int32_t>(t));
    const uint64_t base = chunk_namespace(parts, fp_, kv_type_, "cachecraft");
    for (const RowRange& c : cp->layout.chunks) {
      cp->own.push_back(hash_bytes(cp->hashes.data(), cp->hashes.size() * sizeof(uint64_t), base));
      cp->hashes.push_back(hash_bytes(p.tokens.data() + c.begin,
                                      static_cast<size_t>(c.size()) * sizeof(int32_t), hash_string("chunk")));
    }
    cp->choices.resize(cp->layout.chunks.size());
    if (reuse()) {
      if (cp->layout.system.size() > 0)
        p.runs.push_back(run_of(p.tokens, strategy_namespace(fp_, kv_type_, "prefix"), cp->layout.system, -1,
                                RunInsert::AtEnd));
      for (size_t c = 0; c < cp->layout.chunks.size(); ++c) {
        const std::span<const uint64_t> context(cp->hashes.data(), c);
        std::vector<Candidate>& choices = cp->choices[c];
        for (ChunkVariant& v : store_->of(cp->hashes[c])) {
          const VariantFit fit = fit_variant(v, context, alpha_);
          if (v.ns == cp->own[c] || fit.cfo < 1) choices.push_back({v.ns, fit, std::move(v.ranked)});
        }
        std::stable_sort(choices.begin(), choices.end(), [&](const Candidate& x, const Candidate& y) {
          return (x.ns == cp->own[c]) > (y.ns == cp->own[c]) ||
                 ((x.ns == cp->own[c]) == (y.ns == cp->own[c]) && x.fit.score < y.fit.score);
        });
        // Its own variant first (inserted when computed here), then the others.
        CacheRun own =
            run_of(p.tokens, cp->own[c], cp->layout.chunks[c], static_cast<int32_t>(c), RunInsert::AtEnd);
        own.whole = true;
        own.fix_overhead = 0;
        p.runs.push_back(std::move(own));
        for (const Candidate& cand : choices) {
          if (cand.ns == cp->own[c]) continue;
          CacheRun run =
              run_of(p.tokens, cand.ns, cp->layout.chunks[c], static_cast<int32_t>(c), RunInsert::Never);
          run.whole = true;
          run.fix_overhead = cand.fit.cfo;
          p.runs.push_back(std::move(run));
        }
      }
    }
    p.visibility = [](std::span<const int64_t> computed) { return causal_by_position(computed); };
    p.fill_end = 0;  // nothing is computed alone: a chunk missed is computed in this context
    p.next_pass = [cp](const PassState& state) { return craft_pass(*cp, state); };
    if (reuse()) p.learn = [cp](const PassState& state) { learn_variants(*cp, state); };
    return p;
  }

 private:
  uint64_t fp_;
  DType kv_type_;
  double alpha_;
  int window_;
  std::shared_ptr<ChunkVariants> store_;
};

}  // namespace

std::unique_ptr<Strategy> make_cache_craft(uint64_t fp, DType kv_type, const StrategyOptions& options) {
  if (!(options.cachecraft_alpha >= 0) || !std::isfinite(options.cachecraft_alpha))
    fail(ErrorKind::InvalidInput, "Cache-Craft's alpha must be a finite number >= 0, not {}",
         options.cachecraft_alpha);
  if (options.chunk_variants < 1)
    fail(ErrorKind::InvalidInput, "a chunk needs room for at least one variant, not {}",
         options.chunk_variants);
  if (options.focus_window < 0)
    fail(ErrorKind::InvalidInput, "the focus window is a number of layers >= 0, not {}",
         options.focus_window);
  return std::make_unique<CacheCraftStrategy>(fp, kv_type, options);
}

}  // namespace depcache

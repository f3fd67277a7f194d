#include "strategy/chunk_reuse.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "exec/visibility.h"
#include "util/error.h"
#include "util/hash.h"

namespace depcache {

int64_t ChunkLayout::chunk_tokens() const {
  int64_t n = 0;
  for (const RowRange& c : chunks) n += c.size();
  return n;
}

ChunkLayout chunk_layout(const PromptParts& parts) {
  ChunkLayout l;
  int64_t at = static_cast<int64_t>(parts.system.size());
  l.system = {0, at};
  for (const ContextItem& item : parts.items) {
    const int64_t begin = at;
    for (const auto& p : item.paths) at += static_cast<int64_t>(p.size());
    if (at > begin) l.chunks.push_back({begin, at});
  }
  l.tail = {at, parts.n_flat_tokens()};
  return l;
}

std::vector<int64_t> top_fraction(std::span<const double> scores, double ratio) {
  const auto n = static_cast<int64_t>(scores.size());
  const auto k =
      std::min<int64_t>(n, static_cast<int64_t>(std::ceil(std::clamp(ratio, 0.0, 1.0) * n - 1e-9)));
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const auto higher = [&](int64_t a, int64_t b) {
    const double x = std::isnan(scores[a]) ? INFINITY : scores[a];
    const double y = std::isnan(scores[b]) ? INFINITY : scores[b];
    return x > y || (x == y && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), higher);
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<int64_t> rows_of(std::span<const RowRange> ranges) {
  std::vector<int64_t> rows;
  for (const RowRange& r : ranges)
    for (int64_t i = r.begin; i < r.end; ++i) rows.push_back(i);
  return rows;
}

std::vector<double> summed_mass(const std::vector<std::vector<double>>& layer, size_t first_query,
                                size_t n_targets) {
  std::vector<double> sum(n_targets, 0.0);
  for (size_t q = first_query; q < layer.size(); ++q)
    for (size_t t = 0; t < layer[q].size() && t < n_targets; ++t) sum[t] += layer[q][t];
  return sum;
}

PassPlan recompute_pass(std::vector<int64_t> picked, RowRange tail, bool last) {
  PassPlan pass;
  pass.rows = std::move(picked);
  for (int64_t r = tail.begin; r < tail.end; ++r) pass.rows.push_back(r);
  pass.visibility = causal_by_position(pass.rows);
  pass.last = last;
  return pass;
}

namespace {

// CacheBlend's choice at kCacheBlendSelectLayer: of the chunk tokens (the
// pass's first n_chunk), those whose fresh K/V differ most from what was
// placed (squared L2 over keys and values), and every later token.
LayerHook cacheblend_hook(int64_t n_chunk, double ratio) {
  return [n_chunk, ratio](const LayerKv& layer) -> std::vector<int64_t> {
    if (layer.layer != kCacheBlendSelectLayer) return {layer.active.begin(), layer.active.end()};
    const int64_t width = layer.kv->row_elems();
    std::vector<float> k(width), v(width);
    std::vector<double> deviation;
    size_t i = 0;
    for (; i < layer.active.size() && layer.active[i] < n_chunk; ++i) {
      layer.kv->read(layer.layer, layer.rows[layer.active[i]], k.data(), v.data());
      const float* kf = layer.k_fresh + static_cast<int64_t>(i) * width;
      const float* vf = layer.v_fresh + static_cast<int64_t>(i) * width;
      double d = 0;
      for (int64_t e = 0; e < width; ++e) {
        const double dk = kf[e] - k[e], dv = vf[e] - v[e];
        d += dk * dk + dv * dv;
      }
      deviation.push_back(d);
    }
    std::vector<int64_t> keep;
    for (int64_t j : top_fraction(deviation, ratio)) keep.push_back(layer.active[j]);
    keep.insert(keep.end(), layer.active.begin() + static_cast<std::ptrdiff_t>(i), layer.active.end());
    return keep;
  };
}

}  // namespace

CacheRun run_of(const std::vector<int32_t>& tokens, uint64_t ns, RowRange r, int32_t item, RunInsert insert) {
  CacheRun run{ns, {tokens.begin() + r.begin, tokens.begin() + r.end}, {}, item, insert};
  for (int64_t i = r.begin; i < r.end; ++i) run.rows.push_back(i);
  return run;
}

uint64_t chunk_namespace(const PromptParts& parts, uint64_t fp, DType kv_type, std::string_view kind) {
  return hash_bytes(parts.system.data(), parts.system.size() * sizeof(int32_t),
                    strategy_namespace(fp, kv_type, kind));
}

namespace {

// A fused cache depends on neighbours its key does not name, so even its
// first tokens are no one else's: each chunk's namespace is its own.
uint64_t fused_namespace(const PromptParts& parts, const std::vector<int32_t>& tokens, RowRange chunk,
                         uint64_t fp, DType kv_type) {
  return hash_bytes(tokens.data() + chunk.begin, static_cast<size_t>(chunk.size()) * sizeof(int32_t),
                    chunk_namespace(parts, fp, kv_type, "fused-chunk"));
}

// The flat prompt with every chunk to be filled as computed alone after the
// system prompt: tokens, positions, the runs of the system prompt and of the
// chunks (with reuse), and the fill.
RequestPlan chunk_plan(const PromptParts& parts, const ChunkLayout& layout, uint64_t fp, DType kv_type,
                       bool reuse, bool fused_first) {
  RequestPlan p;
  p.tokens = parts.flat();
  const auto n = static_cast<int64_t>(p.tokens.size());
  p.flat_tokens = n;
  for (int64_t t = 0; t < n; ++t) p.positions.push_back(static_cast<int32_t>(t));
  if (reuse) {
    if (layout.system.size() > 0)
      p.runs.push_back(run_of(p.tokens, strategy_namespace(fp, kv_type, "prefix"), layout.system, -1,
                              RunInsert::AfterFill));
    const uint64_t plain = chunk_namespace(parts, fp, kv_type, "chunk");
    for (size_t c = 0; c < layout.chunks.size(); ++c) {
      const auto item = static_cast<int32_t>(c);
      if (fused_first)
        p.runs.push_back(run_of(p.tokens, fused_namespace(parts, p.tokens, layout.chunks[c], fp, kv_type),
                                layout.chunks[c], item, RunInsert::Never));
      p.runs.push_back(run_of(p.tokens, plain, layout.chunks[c], item, RunInsert::AfterFill));
    }
  }
  // First every chunk not placed, computed alone after the system prompt
  // (at the positions it has there, so what is stored never depends on
  // where a request put it), then the passes of the strategy.
  p.fill_end = layout.chunks.empty() ? layout.system.end : layout.chunks.back().end;
  p.fill_positions = p.positions;
  for (const RowRange& c : layout.chunks)
    for (int64_t r = c.begin; r < c.end; ++r)
      p.fill_positions[r] = static_cast<int32_t>(layout.system.end + r - c.begin);
  p.visibility = [layout](std::span<const int64_t> computed) {
    return chunks_alone(std::span<const RowRange>(&layout.system, 1), layout.chunks, computed);
  };
  return p;
}

class ChunkStrategy final : public Strategy {
 public:
  ChunkStrategy(std::string name, ChunkRecompute recompute, uint64_t fp, DType kv_type,
                const StrategyOptions& options)
      : Strategy(options.reuse),
        name_(std::move(name)),
        recompute_(recompute),
        fp_(fp),
        kv_type_(kv_type),
        ratio_(options.recompute_ratio),
        realign_(options.realign) {}
  std::string_view name() const override { return name_; }

  RequestPlan plan(const PromptParts& parts) const override {
    const ChunkLayout layout = chunk_layout(parts);
    RequestPlan p =
        chunk_plan(parts, layout, fp_, kv_type_, reuse(), recompute_ == ChunkRecompute::FusionRag);
    p.realign = realign_;
    const ChunkRecompute recompute = layout.chunks.empty() ? ChunkRecompute::None : recompute_;
    p.next_pass = [layout, recompute, ratio = ratio_](const PassState& state) {
      switch (recompute) {
        case ChunkRecompute::None:
          return recompute_pass({}, layout.tail, true);
        case ChunkRecompute::CacheBlend: {
          PassPlan pass = recompute_pass(rows_of(layout.chunks), layout.tail, true);
          pass.hook = cacheblend_hook(layout.chunk_tokens(), ratio);
          return pass;
        }
        case ChunkRecompute::FusionRag:
          break;
      }
      const std::vector<int64_t> rows = rows_of(layout.chunks);
      if (state.done == 0) {  // the question over the placed chunks, scoring them
        PassPlan pass = recompute_pass({}, layout.tail, false);
        pass.probe.queries = rows_of(std::span<const RowRange>(&layout.tail, 1));
        for (int64_t r : rows) pass.probe.targets.push_back({r, r + 1});
        return pass;
      }
      // Each chunk token's last-layer attention from the question.
      const std::vector<double> scores = summed_mass(state.mass->back(), 0, rows.size());
      std::vector<int64_t> picked;
      for (int64_t i : top_fraction(scores, ratio)) picked.push_back(rows[static_cast<size_t>(i)]);
      return recompute_pass(std::move(picked), layout.tail, true);
    };
    return p;
  }

 private:
  std::string name_;
  ChunkRecompute recompute_;
  uint64_t fp_;
  DType kv_type_;
  double ratio_;
  bool realign_;
};

}  // namespace

std::unique_ptr<Strategy> make_chunk_strategy(std::string_view name, ChunkRecompute recompute, uint64_t fp,
                                              DType kv_type, const StrategyOptions& options) {
  if (!(options.recompute_ratio >= 0 && options.recompute_ratio <= 1))
    fail(ErrorKind::InvalidInput, "the recompute ratio must be in [0, 1], not {}", options.recompute_ratio);
  return std::make_unique<ChunkStrategy>(std::string(name), recompute, fp, kv_type, options);
}

CacheRun fused_run(const PromptParts& parts, size_t item, uint64_t fp, DType kv_type) {
  const ChunkLayout layout = chunk_layout(parts);
  if (item >= layout.chunks.size()) fail(ErrorKind::Internal, "fused_run: no chunk {}", item);
  const std::vector<int32_t> tokens = parts.flat();
  return run_of(tokens, fused_namespace(parts, tokens, layout.chunks[item], fp, kv_type), layout.chunks[item],
                static_cast<int32_t>(item), RunInsert::AtEnd);
}

RequestPlan fusion_plan(const PromptParts& parts, uint64_t fp, DType kv_type) {
  if (!parts.text.empty() || !parts.task.empty() || parts.items.empty())
    fail(ErrorKind::Internal, "fusion_plan: the parts must be chunks only");
  const ChunkLayout all = chunk_layout(parts);
  ChunkLayout neighbours = all;
  neighbours.chunks.pop_back();  // the one to fuse is not filled alone
  RequestPlan p = chunk_plan(parts, neighbours, fp, kv_type, true, false);
  if (p.fill_end == 0) p.fill_end = all.chunks.back().begin;  // no system prompt, no neighbours
  p.runs.push_back(fused_run(parts, parts.items.size() - 1, fp, kv_type));
  p.next_pass = [target = all.chunks.back()](const PassState&) { return recompute_pass({}, target, true); };
  return p;
}

}  // namespace depcache

#include "compute/attention.h"

#include <algorithm>
#include <cmath>

#include "compute/attention_lanes.h"
#include "compute/dot.h"
#include "compute/kv_format.h"
#include "compute/vec.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {
namespace {

// AVX2 traits for the lane kernel (attention_lanes.h).
struct SimdAvx2 {
  static constexpr int W = 8;
  using V = __m256;
  using I = __m256i;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static I load_i(const int32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  // -inf in the lanes whose end is below row_plus_1.
  static V hide_past(V x, int32_t row_plus_1, I end) {
    const __m256i hidden = _mm256_cmpgt_epi32(_mm256_set1_epi32(row_plus_1), end);
    return _mm256_blendv_ps(x, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(hidden));
  }
  static V zero_if_neg_inf(V x) { return _mm256_andnot_ps(_mm256_cmp_ps(x, set1(-INFINITY), _CMP_EQ_OQ), x); }
  static V inv_or_one(V l) {  // 1 only where nothing was seen (l = 0); NaN stays NaN
    const __m256 seen = _mm256_cmp_ps(l, zero(), _CMP_NEQ_UQ);
    return _mm256_blendv_ps(set1(1.0f), _mm256_div_ps(set1(1.0f), l), seen);
  }
  static V exp_nonpositive(V x) { return vec::exp(x); }  // exactly 0 below -87.3 (and for -inf)
  static void widen(const float* src, float* dst, int d) { std::copy(src, src + d, dst); }
  static void widen(const uint16_t* src, float* dst, int d) {
    int i = 0;
    for (; i + 8 <= d; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < d; ++i) dst[i] = _cvtsh_ss(src[i]);
  }
  static float half(uint16_t h) { return _cvtsh_ss(h); }
  static void widen_q8(const BlockQ8_0& b, float* dst) {  // 32 values
    const __m256 scale = _mm256_set1_ps(_cvtsh_ss(b.d));
    for (int i = 0; i < 32; i += 8) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + i));
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    }
  }
};

// A task: KV head, a run of batch rows whose queries share one group, and
// the range of query heads of that KV head it covers; the key parts its
// lanes see (kKeyPart), and where its parts go when they run apart.
struct Task {
  int kv_head;
  int64_t r0, r1;
  int h0, h1;
  std::vector<int64_t> parts;
  int64_t part_at = 0;  // floats into the buffer of parts
};

// acc (m, l, o of attend_lanes' parts) merged with the next part p: both
// sums rescaled to the larger maximum. A part that saw nothing (m = -inf)
// changes nothing; a NaN anywhere makes the result NaN.
void merge_part(float* acc, const float* p, int d) {
  const float ma = acc[0], mp = p[0];
  if (std::isnan(ma) || std::isnan(mp)) {
    acc[0] = acc[1] = NAN;
    return;
  }
  if (mp == -INFINITY) return;
  if (ma == -INFINITY) {
    std::copy(p, p + d + 2, acc);
    return;
  }
  const float mn = std::max(ma, mp), ca = std::exp(ma - mn), cp = std::exp(mp - mn);
  acc[0] = mn;
  acc[1] = acc[1] * ca + p[1] * cp;
  for (int i = 0; i < d; ++i) acc[2 + i] = acc[2 + i] * ca + p[2 + i] * cp;
}

// The normalised output of merged parts (as the kernel normalises: 1 where
// nothing was seen, NaN kept).
void write_merged(const float* acc, int d, float* o) {
  const float inv = acc[1] != 0 ? 1.0f / acc[1] : 1.0f;
  for (int i = 0; i < d; ++i) o[i] = acc[2 + i] * inv;
}

}  // namespace

namespace detail {
AttendLanesFn attend_lanes_avx2(DType type) { return attend_lanes_of<SimdAvx2>(type); }
}  // namespace detail

Visibility::Visibility(std::vector<QueryGroup> groups) : groups_(std::move(groups)) {
  int64_t next = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const QueryGroup& g = groups_[gi];
    if (g.first != next || g.count <= 0)
      fail(ErrorKind::Internal, "visibility group {} covers queries [{}, {}) after query {}", gi, g.first,
           g.first + g.count, next);
    if (g.causal_begin < 0 || g.causal_begin > g.self_row)
      fail(ErrorKind::Internal,
           "visibility group {}: causal run starts at row {} after its first query row {}", gi,
           g.causal_begin, g.self_row);
    int64_t context_rows = 0, prev_end = 0;
    for (const RowRange& r : g.context) {
      if (r.begin < prev_end || r.end < r.begin || r.end > g.causal_begin)
        fail(ErrorKind::Internal,
             "visibility group {}: context range [{}, {}) is unsorted, overlapping or not "
             "before the causal run at {}",
             gi, r.begin, r.end, g.causal_begin);
      context_rows += r.size();
      prev_end = r.end;
    }
    // Query i sees context_rows + (self_row - causal_begin) + i + 1 rows.
    const int64_t own = g.self_row - g.causal_begin;
    n_pairs_ += g.count * (context_rows + own) + g.count * (g.count + 1) / 2;
    max_row_ = std::max(max_row_, g.self_row + g.count);
    context_rows_.push_back(context_rows);
    next += g.count;
    group_of_.insert(group_of_.end(), g.count, static_cast<int32_t>(gi));
  }
}

std::vector<RowRange> Visibility::visible(int64_t query) const {
  const QueryGroup& g = group_of(query);
  std::vector<RowRange> out = g.context;
  out.push_back({g.causal_begin, g.self_row + (query - g.first) + 1});
  return out;
}

int64_t Visibility::n_visible(int64_t query) const {
  const int32_t gi = group_of_[query];
  const QueryGroup& g = groups_[gi];
  return context_rows_[gi] + (g.self_row - g.causal_begin) + (query - g.first) + 1;
}

void attention(const float* q, int64_t n_q, std::span<const int64_t> ids, const Visibility& vis,
               const KvLayerView& kv, int n_head, int n_head_kv, int head_dim, float* out, ThreadPool& pool,
               float softcap) {
  if (!ids.empty() && static_cast<int64_t>(ids.size()) != n_q)
    fail(ErrorKind::Internal, "attention: {} query ids for {} query rows", ids.size(), n_q);
  const int group = n_head / n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t q_stride = int64_t{n_head} * head_dim;
  auto id_of = [&](int64_t r) { return ids.empty() ? r : ids[r]; };
  // Lanes per task are (query, head) pairs: as many queries as fill 64
  // lanes with all heads of a KV head (decode: one query, its heads).
  using detail::kKeyPart;
  using detail::kMaxLanes;
  detail::AttendLanesFn kernel = nullptr;
  if (current_isa() == Isa::Avx512) kernel = detail::attend_lanes_avx512(kv.type);
  if (!kernel) kernel = detail::attend_lanes_avx2(kv.type);
  if (!kernel) fail(ErrorKind::Internal, "attention: no kernel for KV type {}", dtype_info(kv.type).name);
  const int heads_per_task = std::min(group, kMaxLanes);
  const int64_t rows_per_task = std::max(1, kMaxLanes / heads_per_task);
  auto end_of = [&](const QueryGroup& g, int64_t r) { return g.self_row + (id_of(r) - g.first) + 1; };
  std::vector<Task> tasks;
  for (int64_t r0 = 0; r0 < n_q;) {
    const QueryGroup* g = &vis.group_of(id_of(r0));
    int64_t r1 = r0 + 1;
    while (r1 < n_q && r1 - r0 < rows_per_task && &vis.group_of(id_of(r1)) == g) ++r1;
    // The key parts the lanes see: of each context range and of the causal
    // run up to the latest end.
    std::vector<int64_t> parts;
    auto add_parts = [&](int64_t begin, int64_t end) {
      for (int64_t p = begin / kKeyPart; begin < end && p <= (end - 1) / kKeyPart; ++p)
        if (parts.empty() || parts.back() < p) parts.push_back(p);
    };
    int64_t max_end = 0;
    for (int64_t r = r0; r < r1; ++r) max_end = std::max(max_end, end_of(*g, r));
    for (const RowRange& r : g->context) add_parts(r.begin, r.end);
    add_parts(g->causal_begin, max_end);
    for (int kvh = 0; kvh < n_head_kv; ++kvh)
      for (int h0 = 0; h0 < group; h0 += heads_per_task)
        tasks.push_back(
            {kvh, r0, r1, kvh * group + h0, kvh * group + std::min(group, h0 + heads_per_task), parts});
    r0 = r1;
  }
  const int64_t part_floats = int64_t{kMaxLanes} * (head_dim + 2);
  auto prepare = [&](detail::TileScratch& scratch) {
    scratch.qt.resize(static_cast<size_t>(kMaxLanes) * head_dim);
    scratch.ot.resize(scratch.qt.size());
    scratch.kf.resize(static_cast<size_t>(detail::kKeyBlock) * head_dim);
    scratch.vf.resize(scratch.kf.size());
    scratch.p.resize(static_cast<size_t>(detail::kKeyBlock) * kMaxLanes);
  };
  auto lanes_of = [&](const Task& t) {
    detail::LaneSet ls;
    const QueryGroup& g = vis.group_of(id_of(t.r0));
    for (int64_t r = t.r0; r < t.r1; ++r)
      for (int h = t.h0; h < t.h1; ++h) {
        ls.row[ls.n] = r;
        ls.head[ls.n] = h;
        ls.end[ls.n] = static_cast<int32_t>(end_of(g, r));
        ++ls.n;
      }
    return ls;
  };
  auto run = [&](const Task& t, const detail::LaneSet& ls, int64_t part, float* out_or_null, float* parts,
                 detail::TileScratch& scratch) {
    const int64_t lo = part < 0 ? 0 : part * kKeyPart, hi = part < 0 ? INT64_MAX : lo + kKeyPart;
    kernel(ls, q, q_stride, kv, int64_t{t.kv_head} * head_dim, vis.group_of(id_of(t.r0)), head_dim, scale,
           softcap, lo, hi, out_or_null, parts, scratch);
  };
  // The parts of a task merged in row order into its outputs.
  auto merge = [&](const detail::LaneSet& ls, const float* parts, int64_t n_parts, float* acc) {
    for (int lane = 0; lane < ls.n; ++lane) {
      const int64_t at = int64_t{lane} * (head_dim + 2);
      std::copy(parts + at, parts + at + head_dim + 2, acc);
      for (int64_t p = 1; p < n_parts; ++p) merge_part(acc, parts + p * part_floats + at, head_dim);
      write_merged(acc, head_dim, out + ls.row[lane] * q_stride + int64_t{ls.head[lane]} * head_dim);
    }
  };
  // Tasks with long keys too few to spread evenly over the threads (a
  // decode step of a model with one or two KV heads, a question over a long
  // cached context) run their parts side by side, then merge; otherwise each
  // task runs and merges its own parts, without a second hand-out. Both do
  // the same arithmetic.
  int64_t split_floats = 0;
  bool split = false;
  for (Task& t : tasks) {
    t.part_at = split_floats;
    split_floats += static_cast<int64_t>(t.parts.size()) * part_floats;
    split = split || t.parts.size() > 1;
  }
  constexpr int64_t kMaxSplitFloats = int64_t{16} << 20;
  const auto n_tasks = static_cast<int64_t>(tasks.size());
  const int64_t threads = pool.size();
  split = split && (n_tasks < threads || (n_tasks < 2 * threads && n_tasks % threads != 0)) &&
          split_floats <= kMaxSplitFloats;
  if (split) {
    std::vector<std::pair<int64_t, int64_t>> items;  // (task, part index)
    for (size_t ti = 0; ti < tasks.size(); ++ti)
      for (size_t p = 0; p < tasks[ti].parts.size(); ++p) items.emplace_back(ti, p);
    // Kept by the calling thread across layers and steps: a decode step
    // would otherwise allocate and clear it in every layer.
    // (A lambda names a thread_local of the thread it runs on: the workers
    // get the buffer's address.)
    thread_local std::vector<float> kept;
    if (kept.size() < static_cast<size_t>(split_floats)) kept.resize(static_cast<size_t>(split_floats));
    float* const parts = kept.data();
    pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t i, int) {
      thread_local detail::TileScratch scratch;
      prepare(scratch);
      const Task& t = tasks[items[i].first];
      const int64_t p = items[i].second;
      run(t, lanes_of(t), t.parts.size() > 1 ? t.parts[p] : -1, out,
          t.parts.size() > 1 ? parts + t.part_at + p * part_floats : nullptr, scratch);
    });
    pool.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti, int) {
      const Task& t = tasks[ti];
      if (t.parts.size() < 2) return;
      thread_local std::vector<float> acc;
      acc.resize(head_dim + 2);
      merge(lanes_of(t), parts + t.part_at, static_cast<int64_t>(t.parts.size()), acc.data());
    });
    return;
  }
  pool.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti, int) {
    thread_local detail::TileScratch scratch;
    thread_local std::vector<float> parts;
    prepare(scratch);
    const Task& t = tasks[ti];
    const detail::LaneSet ls = lanes_of(t);
    const auto n_parts = static_cast<int64_t>(t.parts.size());
    if (n_parts < 2) return run(t, ls, -1, out, nullptr, scratch);
    parts.resize(static_cast<size_t>((n_parts + 1) * part_floats));
    for (int64_t p = 0; p < n_parts; ++p)
      run(t, ls, t.parts[p], out, parts.data() + p * part_floats, scratch);
    merge(ls, parts.data(), n_parts, parts.data() + n_parts * part_floats);
  });
}

namespace {

// Scaled scores of NH query heads (q: their rows, head_dim apart) that share
// one KV head (kt: its keys in blocks of 16) over the visible rows, by row in
// each head's array (`room` floats apart). A block is computed whole, also
// where a range begins or ends inside it: rows no range holds get scores
// nobody reads.
template <int NH>
void mass_scores(const float* q, int hd, const float* kt, std::span<const RowRange> visible, float scale,
                 float* out, int64_t room) {
  const int64_t block_floats = int64_t{hd} * 16;
  for (const RowRange& r : visible) {
    for (int64_t j = r.begin / 16 * 16; j < r.end; j += 16) {
      __m256 acc[NH][2];
      for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
      const float* k = kt + j / 16 * block_floats;
      for (int d = 0; d < hd; ++d, k += 16) {
        const __m256 k0 = _mm256_loadu_ps(k), k1 = _mm256_loadu_ps(k + 8);
        for (int h = 0; h < NH; ++h) {
          const __m256 qd = _mm256_broadcast_ss(q + h * hd + d);
          acc[h][0] = _mm256_fmadd_ps(qd, k0, acc[h][0]);
          acc[h][1] = _mm256_fmadd_ps(qd, k1, acc[h][1]);
        }
      }
      const __m256 sc = _mm256_set1_ps(scale);
      for (int h = 0; h < NH; ++h) {
        _mm256_storeu_ps(out + h * room + j, _mm256_mul_ps(acc[h][0], sc));
        _mm256_storeu_ps(out + h * room + j + 8, _mm256_mul_ps(acc[h][1], sc));
      }
    }
  }
}

}  // namespace

void mass_keys(const KvLayerView& kv, int64_t n_rows, int n_head_kv, int head_dim, MassKeys& out) {
  const int64_t width = int64_t{n_head_kv} * head_dim, n_blocks = (n_rows + 15) / 16;
  out.n_rows = n_rows, out.n_head_kv = n_head_kv, out.head_dim = head_dim;
  out.t.assign(static_cast<size_t>(width * n_blocks * 16), 0.0f);
  thread_local std::vector<float> rows;
  rows.resize(static_cast<size_t>(n_rows * width));
  dequantize_rows(kv.type, kv.k, kv.row_bytes, n_rows, width, rows.data());
  for (int64_t j = 0; j < n_rows; ++j)
    for (int64_t kh = 0; kh < n_head_kv; ++kh)
      for (int64_t d = 0; d < head_dim; ++d)
        out.t[static_cast<size_t>(((kh * n_blocks + j / 16) * head_dim + d) * 16 + j % 16)] =
            rows[j * width + kh * head_dim + d];
}

std::vector<double> attention_mass(const float* q_row, std::span<const RowRange> visible,
                                   std::span<const RowRange> targets, const MassKeys& keys, int n_head,
                                   float softcap) {
  // Targets by where they begin, for one sweep over the ascending rows.
  std::vector<size_t> order(targets.size());
  for (size_t t = 0; t < order.size(); ++t) order[t] = t;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return targets[a].begin < targets[b].begin; });
  for (size_t t = 0; t < order.size(); ++t)
    if (targets[order[t]].begin > targets[order[t]].end ||
        (t > 0 && targets[order[t]].begin < targets[order[t - 1]].end))
      fail(ErrorKind::Internal, "attention_mass: the targets overlap");
  // The visible rows cut where targets begin and end, each run with its
  // target or -1.
  struct Run {
    int64_t begin, end;
    int target;
  };
  std::vector<Run> runs;
  int64_t n_vis = 0;
  size_t t = 0;
  for (const RowRange& r : visible) {
    if (r.begin < 0 || r.end > keys.n_rows)
      fail(ErrorKind::Internal, "attention_mass: row {} past the {} keys made", r.end, keys.n_rows);
    for (int64_t row = r.begin; row < r.end;) {
      while (t < order.size() && targets[order[t]].end <= row) ++t;
      int64_t end = r.end;
      int target = -1;
      if (t < order.size() && targets[order[t]].begin <= row) {
        target = static_cast<int>(order[t]);
        end = std::min(end, targets[order[t]].end);
      } else if (t < order.size()) {
        end = std::min(end, targets[order[t]].begin);
      }
      runs.push_back({row, end, target});
      row = end;
    }
    n_vis += r.size();
  }
  if (n_vis == 0) return std::vector<double>(targets.size(), 0.0);
  const int hd = keys.head_dim, group = n_head / keys.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<double> mass(targets.size(), 0.0), part(targets.size());
  thread_local std::vector<float> scores;
  const int64_t n_room = (keys.n_rows + 15) / 16 * 16, block_floats = int64_t{hd} * n_room;
  scores.resize(static_cast<size_t>(group * n_room));
  for (int h = 0; h < n_head; ++h) {
    if (h % group == 0)  // the scores of this KV head's query heads, its keys read once for up to four
      for (int h0 = 0; h0 < group; h0 += 4) {
        const float* kt = keys.t.data() + int64_t{h / group} * block_floats;
        const float* q = q_row + int64_t{h + h0} * hd;
        float* out = scores.data() + h0 * n_room;
        switch (std::min(group - h0, 4)) {
          case 1:
            mass_scores<1>(q, hd, kt, visible, scale, out, n_room);
            break;
          case 2:
            mass_scores<2>(q, hd, kt, visible, scale, out, n_room);
            break;
          case 3:
            mass_scores<3>(q, hd, kt, visible, scale, out, n_room);
            break;
          default:
            mass_scores<4>(q, hd, kt, visible, scale, out, n_room);
            break;
        }
      }
    float* const head_scores = scores.data() + (h % group) * n_room;
    float m = -INFINITY;
    bool nan = false;
    for (const RowRange& r : visible)
      for (int64_t i = r.begin; i < r.end; ++i) {
        float& x = head_scores[i];
        if (softcap > 0) x = softcap * std::tanh(x / softcap);
        nan |= std::isnan(x);
        m = std::max(m, x);
      }
    if (nan) return std::vector<double>(targets.size(), NAN);
    // Each run's exponentials summed in fp32 vectors, the runs in double:
    // the total is the sum of the same parts, so the masses sum to 1.
    double total = 0;
    std::fill(part.begin(), part.end(), 0.0);
    const __m256 mv = _mm256_set1_ps(m);
    for (const Run& run : runs) {
      __m256 acc = _mm256_setzero_ps();
      int64_t i = run.begin;
      for (; i + 8 <= run.end; i += 8)
        acc = _mm256_add_ps(acc, vec::exp(_mm256_sub_ps(_mm256_loadu_ps(head_scores + i), mv)));
      double sum = vec::hsum(acc);
      for (; i < run.end; ++i) sum += std::exp(head_scores[i] - m);
      total += sum;
      if (run.target >= 0) part[static_cast<size_t>(run.target)] += sum;
    }
    for (size_t k = 0; k < mass.size(); ++k) mass[k] += part[k] / total;
  }
  for (double& x : mass) x /= n_head;
  return mass;
}

std::vector<double> attention_mass(const float* q_row, std::span<const RowRange> visible,
                                   std::span<const RowRange> targets, const KvLayerView& kv, int n_head,
                                   int n_head_kv, int head_dim, float softcap) {
  int64_t n_rows = 0;
  for (const RowRange& r : visible) n_rows = std::max(n_rows, r.end);
  MassKeys keys;
  mass_keys(kv, n_rows, n_head_kv, head_dim, keys);
  return attention_mass(q_row, visible, targets, keys, n_head, softcap);
}

}  // namespace depcache

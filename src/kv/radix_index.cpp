#include "kv/radix_index.h"

#include <algorithm>

#include "util/timing.h"

namespace depcache {

RadixIndex::RadixIndex(size_t byte_budget, std::unique_ptr<ReplacementPolicy> policy)
    : tree_(std::move(policy)), controller_(tree_, mu_, byte_budget) {}

RadixIndex::~RadixIndex() = default;

void RadixIndex::attach_host(size_t byte_budget, bool swap_out_once) {
  auto lk = lock();
  controller_.attach_host(byte_budget, swap_out_once);
}

void RadixIndex::attach_disk(DiskSpanStore& store) {
  auto lk = lock();
  controller_.attach_disk(store);
}

void RadixIndex::attach_remote(RemoteStore& store, int64_t block_tokens, std::shared_ptr<const MacKey> key) {
  attach_remote(std::shared_ptr<RemoteStore>(&store, [](RemoteStore*) {}), block_tokens, std::move(key));
}

void RadixIndex::attach_remote(std::shared_ptr<RemoteStore> store, int64_t block_tokens,
                               std::shared_ptr<const MacKey> key) {
  auto lk = lock();
  controller_.attach_remote(std::make_shared<RemoteBlocks>(std::move(store), block_tokens, std::move(key)));
}

void RadixIndex::set_observer(std::shared_ptr<IndexObserver> observer) {
  auto lk = lock();
  tree_.set_observer(std::move(observer));
}

void RadixIndex::detach_remote() {
  std::shared_ptr<RemoteBlocks> remote;
  {
    auto lk = lock();
    remote = controller_.detach_remote();
  }
  // Draining the queue waits on the store: without the lock (rule 4). A
  // fetch still running holds its own reference and finishes first.
  if (remote) remote->flush();
}

void RadixIndex::flush_remote() {
  std::shared_ptr<RemoteBlocks> remote;
  {
    auto lk = lock();
    remote = controller_.remote();
  }
  if (remote) remote->flush();
}

void RadixIndex::expect_span_shape(const SpanShape& shape) {
  auto lk = lock();
  controller_.expect_span_shape(shape);
}

void RadixIndex::persist() {
  auto lk = lock();
  controller_.persist();
}

void RadixIndex::set_cost_model(std::function<double(int64_t, int64_t)> cost) {
  auto lk = lock();
  controller_.set_cost_model(std::move(cost));
}

double RadixIndex::cost_per_token(int64_t cached, int64_t fresh, double measured) const {
  auto lk = lock();
  return controller_.cost_per_token(cached, fresh, measured);
}

const RadixIndex::Stats& RadixIndex::stats() const {
  auto lk = lock();
  return controller_.folded_stats();
}

RadixIndex::Match RadixIndex::match(uint64_t ns, std::span<const int32_t> tokens, uint64_t request_tick,
                                    int64_t fresh_tokens, bool remote) {
  auto lk = lock();
  const auto t0 = Clock::now();
  Match m = controller_.load(ns, tokens, std::max<int64_t>(fresh_tokens, 0), request_tick, remote, true);
  const uint64_t tick = request_tick > 0 ? request_tick : tree_.next_tick();
  tree_.count_access(m, tick, request_tick > 0);
  Stats& stats = controller_.stats();
  for (int t = 0; t < kTiers; ++t) stats.hit_tokens[t] += m.tokens_from[t];
  m.load_ms = ms_since(t0);
  stats.load_ms += m.load_ms;
  return m;
}

void RadixIndex::note_prefill(double ms_per_token) {
  auto lk = lock();
  controller_.note_prefill(ms_per_token);
}

bool RadixIndex::adopt_loaded(NodeId node, LayerLoader& loader) {
  KvSpan span = loader.take();  // waits for the last layers: outside the lock (rule 4)
  auto lk = lock();
  return controller_.adopt_loaded(node, std::move(span), loader);
}

bool RadixIndex::drop_bad_load(NodeId node, uint64_t disk_key) {
  auto lk = lock();
  return controller_.drop_bad_load(node, disk_key);
}

uint64_t RadixIndex::begin_request() {
  auto lk = lock();
  return tree_.next_tick();
}

RadixIndex::Match RadixIndex::peek(uint64_t ns, std::span<const int32_t> tokens) const {
  auto lk = lock();
  return tree_.peek(ns, tokens);
}

int64_t RadixIndex::prefetch(uint64_t ns, std::span<const int32_t> tokens, bool disk) {
  auto lk = lock();
  const auto t0 = Clock::now();
  const Match m = controller_.load(ns, tokens, -1, 0, true, disk);
  controller_.stats().load_ms += ms_since(t0);
  return m.length - m.tokens_from[static_cast<int>(Tier::Hot)];
}

bool RadixIndex::has_io_tiers() const {
  auto lk = lock();
  return controller_.tiers().disk() || controller_.remote();
}

bool RadixIndex::all_hot(uint64_t ns, std::span<const int32_t> tokens) const {
  auto lk = lock();
  const Match m = tree_.peek(ns, tokens);
  return std::all_of(m.pieces.begin(), m.pieces.end(),
                     [&](const Piece& p) { return tree_.tier(p.node) == Tier::Hot; });
}

int64_t RadixIndex::insert(uint64_t ns, std::span<const int32_t> tokens, const SpanMaker& make_span,
                           double cost_per_token, Match* path) {
  auto lk = lock();
  if (controller_.span_shape())
    return controller_.insert(ns, tokens, &make_span, 0, cost_per_token, path, true);
  // Unset, the shape is what this process computes: learned from its first span.
  const SpanMaker learning = [&](int64_t begin, int64_t end) {
    KvSpan span = make_span(begin, end);
    if (!controller_.span_shape() && span.n_layer() > 0)
      controller_.expect_span_shape({span.n_layer(), span.row_elems(), span.type()});
    return span;
  };
  return controller_.insert(ns, tokens, &learning, 0, cost_per_token, path, true);
}

int64_t RadixIndex::insert_virtual(uint64_t ns, std::span<const int32_t> tokens, size_t bytes_per_token,
                                   double cost_per_token, Match* path) {
  auto lk = lock();
  return controller_.insert(ns, tokens, nullptr, bytes_per_token, cost_per_token, path, false);
}

void RadixIndex::pin(const Match& m) {
  auto lk = lock();
  tree_.pin(m);
}

void RadixIndex::unpin(const Match& m) {
  auto lk = lock();
  controller_.unpin(m, true);
}

void RadixIndex::set_lookahead(std::unordered_map<int32_t, double> weights) {
  auto lk = lock();
  tree_.set_lookahead(std::move(weights));
}

void RadixIndex::set_fix_overhead(const Match& m, double cfo) {
  auto lk = lock();
  tree_.set_fix_overhead(m, cfo);
}

size_t RadixIndex::n_pinned() const {
  auto lk = lock();
  return tree_.n_pinned();
}

size_t RadixIndex::n_nodes(Tier t) const {
  auto lk = lock();
  return tree_.n_nodes(t);
}

void RadixIndex::evict_to(size_t target) {
  auto lk = lock();
  controller_.evict_to(target);
}

void RadixIndex::check_invariants() const {
  auto lk = lock();
  tree_.check_invariants();
  controller_.check_invariants();
}

}  // namespace depcache

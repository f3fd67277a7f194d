#include "engine/engine.h"

#include <algorithm>
#include <future>

#include "engine/visibility.h"
#include "kv/policy.h"
#include "strategy/lookahead.h"
#include "strategy/scheduler.h"
#include "util/error.h"
#include "util/numeric.h"
#include "util/timing.h"

namespace depcache {

struct Engine::Sequence {
  RequestId id = 0;
  Strategy* strategy = nullptr;
  PromptParts parts;
  SamplingParams sampling;
  std::function<void(const TokenEvent&)> on_token;
  Sampler sampler;
  std::vector<Lookup> lookups;               // what it will look up (LACR, prefetch)
  RequestPlan plan;                          // made at submission
  std::unique_ptr<PlanExecution> execution;  // from admission to the end of its prefill
  RowBlock rows;                             // its block of pool rows
  int64_t n_rows_used = 0;                   // rows written so far
  int32_t next_position = 0;                 // RoPE position of the next token
  int passed_over = 0;                       // times the scheduler picked another
  Sequence(const SamplingParams& s) : sampling(s), sampler(s.sampler) {}
};

Engine::Engine(std::shared_ptr<const Model> model, const EngineOptions& options)
    : model_(std::move(model)),
      options_(options),
      threads_(options.threads),
      fwd_(model_, threads_),
      pool_(model_->config(), options.pool_rows, options.kv_type),
      index_(options.cache_bytes, make_policy(options.policy)) {
  if (options.batch_tokens < 1) fail(ErrorKind::InvalidInput, "batch tokens must be at least 1");
  check_scheduler(options.scheduler.order);
  for (const std::string& name : strategy_names())
    strategies_.emplace(name, make_strategy(name, index_, *model_, options.kv_type, options.strategy));
}

Engine::~Engine() = default;

Strategy& Engine::strategy(std::string_view name) {
  const auto it = strategies_.find(name);
  if (it == strategies_.end())
    fail(ErrorKind::InvalidInput, "unknown strategy '{}' (expected full, prefix or depcache)", name);
  return *it->second;
}

RequestId Engine::submit(std::string_view strategy_name, PromptParts parts, const SamplingParams& sampling,
                         std::function<void(const TokenEvent&)> on_token) {
  if (sampling.max_tokens < 1) fail(ErrorKind::InvalidInput, "max_tokens must be at least 1");
  sampling.sampler.validate();
  auto s = std::make_unique<Sequence>(sampling);
  s->strategy = &strategy(strategy_name);
  s->parts = std::move(parts);
  s->on_token = std::move(on_token);
  s->plan = s->strategy->plan(s->parts);  // planning changes nothing: done once, up front
  s->lookups = s->plan.lookups();
  s->id = next_id_++;
  RequestResult& r = results_[s->id];
  r.submitted = Clock::now();
  waiting_.push_back(s->id);
  const RequestId id = s->id;
  live_.emplace(id, std::move(s));
  return id;
}

void Engine::cancel(RequestId id) {
  if (!live_.count(id)) return;  // done already
  retire(id, RequestState::Cancelled);
}

void Engine::retire(RequestId id, RequestState state, const std::string& error) {
  RequestResult& r = results_[id];
  r.state = state;
  r.error = error;
  r.done = Clock::now();
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  live_.erase(id);  // its rows go back to the pool, its pins (if any) to the index
}

void Engine::emit(Sequence& s, int32_t token) {
  RequestResult& r = results_[s.id];
  r.tokens.push_back(token);
  const int index = static_cast<int>(r.tokens.size()) - 1;
  if (index == 0) r.first_token = Clock::now();
  const bool eog = s.sampling.stop_at_eog && std::find(options_.eog_ids.begin(), options_.eog_ids.end(),
                                                       token) != options_.eog_ids.end();
  const bool last = eog || static_cast<int>(r.tokens.size()) >= s.sampling.max_tokens;
  if (s.on_token) s.on_token({s.id, token, index, last});
  if (last) retire(s.id, RequestState::Finished);
}

bool Engine::step() {
  if (waiting_.empty() && running_.empty()) return false;
  if (options_.policy == "lacr") {
    std::vector<const std::vector<Lookup>*> pending;
    for (size_t i = 0; i < waiting_.size() && i < options_.window; ++i)
      pending.push_back(&live_.at(waiting_[i])->lookups);
    index_.set_lookahead(lookahead_weights(index_, pending));
  }
  // Admission in the scheduler's order: take a block of rows for the
  // request's plan (made at submission) and apply its first half (match,
  // place, pin) in it.
  std::vector<Sequence*> admitted;
  int64_t admitted_tokens = 0;
  while (!waiting_.empty()) {
    // The scheduler's pick among the first `window` waiting requests.
    std::vector<WaitingRequest> window;
    for (size_t i = 0; i < waiting_.size() && i < std::max<size_t>(options_.window, 1); ++i) {
      const Sequence& w = *live_.at(waiting_[i]);
      window.push_back({&w.lookups, static_cast<int64_t>(w.plan.tokens.size()), w.passed_over});
    }
    const size_t pick = pick_next(options_.scheduler, window, index_);
    Sequence& s = *live_.at(waiting_[pick]);
    const auto n = static_cast<int64_t>(s.plan.tokens.size());
    const int64_t need = n + s.sampling.max_tokens - 1;
    if (need > pool_.n_rows()) {
      retire(s.id, RequestState::Failed,
             fmt::format("the request needs {} KV rows (prompt {} + {} generated), more than the pool's {}",
                         need, n, s.sampling.max_tokens - 1, pool_.n_rows()));
      continue;
    }
    const int n_vocab = model_->config().n_vocab;
    if (std::any_of(s.plan.tokens.begin(), s.plan.tokens.end(),
                    [&](int32_t t) { return t < 0 || t >= n_vocab; })) {
      retire(s.id, RequestState::Failed,
             fmt::format("the prompt holds a token outside the vocabulary of {}", n_vocab));
      continue;
    }
    if (!admitted.empty() && admitted_tokens + n > options_.batch_tokens) break;
    std::optional<RowBlock> block = pool_.allocate(need);
    if (!block) break;  // the scheduler's pick waits for rows; nothing overtakes it
    for (size_t i = 0; i < window.size(); ++i)
      if (i != pick) ++live_.at(waiting_[i])->passed_over;
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(pick));
    s.rows = std::move(*block);
    try {
      s.execution = std::make_unique<PlanExecution>(s.plan, index_, pool_.kv(), s.rows.row0());
    } catch (const Error& e) {
      retire(s.id, RequestState::Failed, e.what());
      continue;
    }
    s.n_rows_used = n;
    s.next_position = *std::max_element(s.plan.positions.begin(), s.plan.positions.end()) + 1;
    admitted.push_back(&s);
    admitted_tokens += n;
  }
  // One plan for everything: the admitted requests' prefills, then one
  // decode token of every running sequence; each sees only its own rows.
  PrefillPlan batch;
  std::vector<QueryGroup> groups;
  for (Sequence* s : admitted) {
    const PrefillPlan& p = s->execution->prefill();
    const auto q0 = static_cast<int64_t>(batch.tokens.size());
    append_shifted(groups, p.visibility, q0, 0);
    batch.tokens.insert(batch.tokens.end(), p.tokens.begin(), p.tokens.end());
    batch.positions.insert(batch.positions.end(), p.positions.begin(), p.positions.end());
    batch.rows.insert(batch.rows.end(), p.rows.begin(), p.rows.end());
    batch.logits_for.push_back(q0 + p.logits_for.front());
  }
  std::vector<Sequence*> decoding;
  for (RequestId id : running_) {
    Sequence& s = *live_.at(id);
    const auto q = static_cast<int64_t>(batch.tokens.size());
    const int64_t row = s.rows.row0() + s.n_rows_used;
    batch.tokens.push_back(results_.at(id).tokens.back());
    batch.positions.push_back(s.next_position);
    batch.rows.push_back(row);
    groups.push_back({q, 1, {}, s.rows.row0(), row});  // all of its rows, itself included
    batch.logits_for.push_back(q);
    decoding.push_back(&s);
  }
  if (batch.tokens.empty()) return !waiting_.empty() || !running_.empty();
  batch.visibility = Visibility(std::move(groups));

  // Prefetching overlaps the forward pass, which does not touch the index.
  std::vector<const std::vector<Lookup>*> ahead;
  for (size_t i = 0; i < waiting_.size() && i < options_.prefetch; ++i)
    ahead.push_back(&live_.at(waiting_[i])->lookups);
  std::future<int64_t> prefetch;
  if (!ahead.empty())
    prefetch = std::async(std::launch::async, [this, ahead] {
      int64_t loaded = 0;
      for (const auto* lookups : ahead)
        for (const Lookup& l : *lookups) loaded += index_.prefetch(l.ns, l.tokens);
      return loaded;
    });
  const auto t0 = Clock::now();
  PrefillResult out;
  std::exception_ptr failure;
  try {
    out = fwd_.prefill(batch, pool_.kv());
  } catch (...) {
    failure = std::current_exception();
  }
  if (prefetch.valid()) prefetched_ += prefetch.get();
  try {
    if (failure) std::rethrow_exception(failure);
  } catch (const Error& e) {
    // Nothing of this batch can be trusted: every request in it fails (their
    // leases and rows are released as they retire).
    for (Sequence* s : admitted) retire(s->id, RequestState::Failed, e.what());
    for (Sequence* s : decoding) retire(s->id, RequestState::Failed, e.what());
    return true;
  }
  const double ms_per_token = ms_since(t0) / static_cast<double>(batch.tokens.size());
  const int n_vocab = model_->config().n_vocab;
  size_t at = 0;
  for (Sequence* s : admitted) {
    const std::span<const float> logits(out.logits.data() + at * n_vocab, n_vocab);
    ++at;
    RequestResult& r = results_.at(s->id);
    r.report = s->execution->finish(pool_.kv(), std::vector<float>(logits.begin(), logits.end()),
                                    s->execution->prefill().visibility.n_pairs(), ms_per_token);
    s->execution.reset();
    r.finite = all_finite(logits);
    running_.push_back(s->id);
    emit(*s, s->sampler.sample(logits));
  }
  for (Sequence* s : decoding) {
    const std::span<const float> logits(out.logits.data() + at * n_vocab, n_vocab);
    ++at;
    ++s->n_rows_used;
    ++s->next_position;
    RequestResult& r = results_.at(s->id);
    r.finite = r.finite && all_finite(logits);
    emit(*s, s->sampler.sample(logits));
  }
  return true;
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

const RequestResult& Engine::result(RequestId id) const {
  const auto it = results_.find(id);
  if (it == results_.end()) fail(ErrorKind::NotFound, "no request {}", id);
  return it->second;
}

}  // namespace depcache

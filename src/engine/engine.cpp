#include "engine/engine.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "compute/dot.h"
#include "exec/visibility.h"
#include "kv/policy.h"
#include "strategy/scheduler.h"
#include "util/error.h"
#include "util/hash.h"
#include "util/numeric.h"
#include "util/timing.h"

namespace depcache {

const char* request_state_name(RequestState s) {
  switch (s) {
    case RequestState::Waiting:
      return "waiting";
    case RequestState::Running:
      return "running";
    case RequestState::Finished:
      return "finished";
    case RequestState::Cancelled:
      return "cancelled";
    case RequestState::Failed:
      return "failed";
  }
  return "unknown";
}

struct Engine::Sequence {
  RequestId id = 0;
  SamplingParams sampling;
  std::function<void(const TokenEvent&)> on_token;
  Sampler sampler;
  std::optional<TextOutput> text;            // with a tokenizer
  std::vector<Lookup> lookups;               // what it will look up (LACR, prefetch)
  RequestPlan plan;                          // made at submission
  std::optional<RequestPlan> resumed;        // after a preemption: the plan and what it generated
  bool requeued = false;                     // preempted and waiting: admitted before the scheduler's picks
  std::shared_ptr<SpanFetcher::Job> fetch;   // its lower tiers read ahead (when fetching ahead)
  int fetches = 0;                           // fetches started since it last began waiting
  std::unique_ptr<PlanExecution> execution;  // from admission to the end of its prefill
  int64_t prefilled = 0;                     // queries of execution->prefill() computed
  RowBlock rows;                             // its block of pool rows
  int64_t rows_needed = 0;                   // prompt + tokens it may still generate
  int64_t n_rows_used = 0;                   // rows written so far
  int32_t next_position = 0;                 // RoPE position of the next token
  int passed_over = 0;                       // times the scheduler picked another
  uint64_t admitted = 0;                     // admission order (the latest is preempted first)
  // Logprobs of tokens whose text is still held back (text_offset: in bytes
  // of the decoded text, until released), and how far offsets were counted
  // in characters.
  std::deque<OutputLogprob> held_logprobs;
  std::vector<float> prompt_logits;  // of the prefill under way (SamplingParams::prompt_logits)
  size_t counted_bytes = 0;
  int64_t counted_chars = 0;
  Sequence(const SamplingParams& s) : sampling(s), sampler(s.sampler) {}
  const RequestPlan& active_plan() const { return resumed ? *resumed : plan; }
};

Engine::Engine(std::shared_ptr<const Model> model, const EngineOptions& options)
    : model_(std::move(model)),
      cache_fingerprint_([&] {
        const std::string mode = matmul_mode_tag();  // K/V of an approximate mode kept apart
        return mode.empty() ? model_->fingerprint() : hash_string(mode, model_->fingerprint());
      }()),
      options_(options),
      admission_({options.scheduler, options.window, policy_reads_lookahead(options.policy)}),
      threads_(options.threads),
      fwd_(model_, threads_),
      pool_(model_->config(), options.pool_rows, options.kv_type),
      index_(options.cache_bytes, make_policy(options.policy)) {
  if (options.batch_tokens < 1) fail(ErrorKind::InvalidInput, "batch tokens must be at least 1");
  // Records from the shared tiers of any other shape are refused, not placed.
  index_.expect_span_shape({pool_.kv().n_layer(), pool_.kv().row_elems(), options.kv_type});
  for (const std::string& name : strategy_names())
    strategies_.emplace(name, make_strategy(name, cache_fingerprint_, options.kv_type, options.strategy));
}

Engine::~Engine() = default;

Strategy& Engine::strategy(std::string_view name, CacheUse cache) {
  const auto it = strategies_.find(name);
  if (it == strategies_.end())
    fail(ErrorKind::InvalidInput, "unknown strategy '{}' (expected {})", name,
         fmt::join(strategy_names(), ", "));
  if (cache == CacheUse::Shared) return *it->second;
  auto& alone = alone_strategies_[it->first];
  if (!alone) {
    StrategyOptions o = options_.strategy;
    o.reuse = false;
    alone = make_strategy(name, cache_fingerprint_, options_.kv_type, o);
  }
  return *alone;
}

void Engine::save_strategy_state(const std::filesystem::path& dir) const {
  for (const auto& [name, s] : strategies_) s->save_state(dir);
}

size_t Engine::load_strategy_state(const std::filesystem::path& dir) {
  size_t dropped = 0;
  for (const auto& [name, s] : strategies_) dropped += s->load_state(dir);
  return dropped;
}

RequestId Engine::submit(std::string_view strategy_name, PromptParts parts, const SamplingParams& sampling,
                         std::function<void(const TokenEvent&)> on_token, CacheUse cache) {
  // Planning changes nothing: done once, up front.
  RequestPlan plan = strategy(strategy_name, cache).plan(parts);
  scope_plan(plan, parts.cache_scope);
  return enqueue(std::move(plan), sampling, std::move(on_token));
}

std::vector<Lookup> Engine::lookups_of(std::string_view strategy_name, PromptParts parts) {
  RequestPlan plan = strategy(strategy_name, CacheUse::Shared).plan(parts);
  scope_plan(plan, parts.cache_scope);
  return plan.lookups();
}

RequestId Engine::submit_plan(RequestPlan plan, const SamplingParams& sampling,
                              std::function<void(const TokenEvent&)> on_token) {
  return enqueue(std::move(plan), sampling, std::move(on_token));
}

RequestId Engine::enqueue(RequestPlan plan, const SamplingParams& sampling,
                          std::function<void(const TokenEvent&)> on_token) {
  if (sampling.max_tokens < 1) fail(ErrorKind::InvalidInput, "max_tokens must be at least 1");
  if (sampling.prefill_piece_tokens < 0)
    fail(ErrorKind::InvalidInput, "prefill_piece_tokens must not be negative");
  sampling.sampler.validate(model_->config().n_vocab);
  if (sampling.logprobs < -1 || sampling.logprobs > SamplingParams::kMaxTopLogprobs)
    fail(ErrorKind::InvalidInput, "logprobs must be from 0 to {} (or -1: none), got {}",
         SamplingParams::kMaxTopLogprobs, sampling.logprobs);
  if (!sampling.stop.empty() && !options_.tokenizer)
    fail(ErrorKind::InvalidInput, "stop strings need an engine with a tokenizer");
  auto s = std::make_unique<Sequence>(sampling);
  if (options_.tokenizer) s->text.emplace(*options_.tokenizer, sampling.stop);
  s->on_token = std::move(on_token);
  s->plan = std::move(plan);
  s->lookups = s->plan.lookups();
  s->rows_needed = static_cast<int64_t>(s->plan.tokens.size()) + sampling.max_tokens - 1;
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
  keep_partial(live(id));
  retire(id, RequestState::Cancelled);
}

void Engine::set_prefill_piece_tokens(RequestId id, int64_t n) {
  if (n < 0) fail(ErrorKind::InvalidInput, "prefill_piece_tokens must not be negative");
  if (live_.count(id)) live(id).sampling.prefill_piece_tokens = n;
}

void Engine::keep_partial(Sequence& s) {
  if (!s.execution || s.prefilled == 0) return;
  kept_partial_ += s.execution->keep_computed(pool_.kv(), s.rows.row0(), s.prefilled, ms_per_token_);
}

void Engine::retire(RequestId id, RequestState state, const std::string& error, ErrorKind kind) {
  RequestResult& r = results_[id];
  r.state = state;
  r.error = error;
  r.error_kind = kind;
  r.done = Clock::now();
  if (const auto it = live_.find(id); it != live_.end() && it->second->fetch)
    it->second->fetch->cancelled = true;
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  std::erase(prefilling_, id);
  std::erase(decoding_, id);
  live_.erase(id);  // its rows go back to the pool, its pins (if any) to the index
}

void Engine::emit(Sequence& s, int32_t token, std::span<const float> logits) {
  RequestResult& r = results_[s.id];
  r.tokens.push_back(token);
  if (s.sampling.token_logits) r.token_logits.insert(r.token_logits.end(), logits.begin(), logits.end());
  const int index = static_cast<int>(r.tokens.size()) - 1;
  if (index == 0) r.first_token = Clock::now();
  const bool eog = s.sampling.stop_at_eog && std::find(options_.eog_ids.begin(), options_.eog_ids.end(),
                                                       token) != options_.eog_ids.end();
  TokenEvent event{s.id, token, index, false, {}, {}};
  if (s.sampling.logprobs >= 0 && !eog)
    s.held_logprobs.push_back({token_logprob(logits, token, s.sampling.logprobs),
                               static_cast<int64_t>(s.text ? s.text->decoded_size() : 0)});
  if (s.text && !eog) event.text = s.text->push(token);
  const bool stopped = s.text && s.text->stopped();
  const bool length = static_cast<int>(r.tokens.size()) >= s.sampling.max_tokens;
  event.last = eog || stopped || length;
  if (event.last && s.text && !stopped) event.text += s.text->finish();
  r.text += event.text;  // what TextOutput emitted, piece by piece
  // A token's logprobs go out with the first of its text, so they are held
  // back as its text is (a stop string may yet swallow it); at the end,
  // those whose text was cut off by a stop string are dropped.
  const size_t emitted = s.text ? s.text->text().size() : 0;
  while (!s.held_logprobs.empty()) {
    OutputLogprob& lp = s.held_logprobs.front();
    const auto begin = static_cast<size_t>(lp.text_offset);
    if (s.text && begin >= emitted && !(event.last && !stopped)) break;
    if (s.text) {
      const std::string& text = s.text->text();
      for (; s.counted_bytes < std::min(begin, text.size()); ++s.counted_bytes)
        s.counted_chars += (static_cast<unsigned char>(text[s.counted_bytes]) & 0xC0) != 0x80;
      lp.text_offset = s.counted_chars;
    }
    event.logprobs.push_back(std::move(lp));
    s.held_logprobs.pop_front();
  }
  if (event.last) s.held_logprobs.clear();
  r.logprobs.insert(r.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
  if (event.last)
    r.finish_reason = stopped ? FinishReason::Stop
                      : eog   ? FinishReason::EndOfGeneration
                              : FinishReason::Length;
  if (s.on_token) s.on_token(event);
  if (event.last) retire(s.id, RequestState::Finished);
}

void Engine::preempt(Sequence& s) {
  keep_partial(s);
  s.execution.reset();  // its pins go back to the index
  s.rows.reset();
  s.prefilled = 0;
  s.prompt_logits.clear();
  std::erase(prefilling_, s.id);
  std::erase(decoding_, s.id);
  const std::vector<int32_t>& generated = results_.at(s.id).tokens;
  if (!generated.empty()) s.resumed = with_generated(s.plan, generated);
  s.requeued = true;
  s.fetch.reset();  // fetched again before it runs again
  s.fetches = 0;
  waiting_.push_front(s.id);
  ++results_.at(s.id).preemptions;
  ++preemptions_;
}

void Engine::requeue_after_bad_load(Sequence& s, const LayerLoadError& e) {
  preempt(s);  // its execution and pins first, so the node can go at once
  index_.drop_bad_load(e.node(), e.disk_key());
}

void Engine::make_room_to_decode() {
  for (size_t i = 0; i < decoding_.size();) {
    Sequence& s = live(decoding_[i]);
    if (s.n_rows_used < s.rows.n_rows()) {
      ++i;
      continue;
    }
    const int64_t want = std::min(s.rows_needed, s.n_rows_used + rows_ahead());
    if (pool_.grow(s.rows, want)) {
      ++i;
      continue;
    }
    // The latest admitted gives its rows back (possibly s itself); a
    // sequence alone in the pool always fits, as admission checked.
    Sequence* victim = &s;
    for (const auto* list : {&prefilling_, &decoding_})
      for (RequestId id : *list)
        if (live(id).admitted > victim->admitted) victim = &live(id);
    preempt(*victim);
    i = 0;
  }
}

bool Engine::fetched(Sequence& s, bool admitting) {
  if (s.lookups.empty()) return true;
  // A fetch that ended before other requests pushed its spans down again is
  // made once more when the request is about to run (once: under heavy
  // eviction the match then brings them back itself).
  if (s.fetch && admitting && s.fetch->done.load(std::memory_order_acquire) && s.fetches < 2 &&
      !std::all_of(s.lookups.begin(), s.lookups.end(),
                   [&](const Lookup& l) { return index_.all_hot(l.ns, l.tokens); }))
    s.fetch.reset();
  if (!s.fetch) {
    if (!fetcher_) fetcher_ = std::make_unique<SpanFetcher>(index_);
    s.fetch = fetcher_->start(s.lookups);
    ++s.fetches;
  }
  return s.fetch->done.load(std::memory_order_acquire);
}

int64_t Engine::computed_in_flight(const std::vector<Lookup>& lookups) {
  int64_t shared = 0;
  for (const Lookup& l : lookups) {
    if (l.tokens.empty()) continue;
    int64_t longest = 0;
    for (RequestId id : prefilling_)
      for (const CacheRun& run : live(id).active_plan().runs) {
        if (run.ns != l.ns || run.tokens.empty() || run.tokens.front() != l.tokens.front()) continue;
        const auto common =
            std::mismatch(run.tokens.begin(), run.tokens.end(), l.tokens.begin(), l.tokens.end());
        longest = std::max<int64_t>(longest, common.first - run.tokens.begin());
      }
    if (longest > 0) shared += std::max<int64_t>(0, longest - index_.peek(l.ns, l.tokens).length);
  }
  return shared;
}

bool Engine::admit_next() {
  if (options_.max_running > 0 && n_running() >= options_.max_running) return false;
  const bool fetch_ahead = fetching_ahead();
  std::set<RequestId> deferred;  // they share tokens a prefill under way is computing
  while (!waiting_.empty()) {
    // Preempted requests first; otherwise the scheduler's pick among the
    // first `window` waiting requests.
    size_t pick = 0, chosen = 0;
    std::vector<WaitingRequest> window;
    std::vector<size_t> at;  // window entry -> position in waiting_
    if (!live(waiting_.front()).requeued) {
      for (size_t i = 0; i < waiting_.size() && at.size() < admission_.window(); ++i) {
        Sequence& w = live(waiting_[i]);
        if (deferred.count(w.id)) continue;
        window.push_back({&w.lookups, static_cast<int64_t>(w.plan.tokens.size()), &w.passed_over});
        at.push_back(i);
      }
      if (window.empty()) return false;  // every candidate waits for a prefill under way or a fetch
      chosen = admission_.pick(window, index_);
      pick = at[chosen];
    }
    Sequence& s = live(waiting_[pick]);
    // Its lower tiers are read on the fetcher's thread; meanwhile the others
    // go ahead (a preempted request, which goes first, holds them back).
    if (fetch_ahead && !fetched(s, true)) {
      if (s.requeued) return false;
      deferred.insert(s.id);
      continue;
    }
    const RequestPlan& plan = s.active_plan();
    const auto n = static_cast<int64_t>(plan.tokens.size());
    if (s.rows_needed > pool_.n_rows()) {
      retire(s.id, RequestState::Failed,
             fmt::format("the request needs {} KV rows (prompt {} + {} generated), more than the pool's {}",
                         s.rows_needed, s.plan.tokens.size(), s.sampling.max_tokens - 1, pool_.n_rows()),
             ErrorKind::LimitExceeded);
      continue;
    }
    const int n_vocab = model_->config().n_vocab;
    if (std::any_of(plan.tokens.begin(), plan.tokens.end(),
                    [&](int32_t t) { return t < 0 || t >= n_vocab; })) {
      retire(s.id, RequestState::Failed,
             fmt::format("the prompt holds a token outside the vocabulary of {}", n_vocab),
             ErrorKind::InvalidInput);
      continue;
    }
    if (options_.wait_for_shared && !s.requeued && s.passed_over < admission_.scheduler().starvation_bound &&
        computed_in_flight(s.lookups) > 0) {
      deferred.insert(s.id);
      continue;
    }
    std::optional<RowBlock> block = pool_.allocate(std::min(s.rows_needed, n + rows_ahead()));
    if (!block) return false;  // the pick waits for rows; nothing overtakes it
    if (!window.empty()) Admission::admitted(window, chosen);
    for (RequestId d : deferred) ++live(d).passed_over;
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(pick));
    s.rows = std::move(*block);
    s.requeued = false;
    try {
      s.execution = std::make_unique<PlanExecution>(plan, index_, pool_.kv(), s.rows.row0(), !s.fetch);
    } catch (const LayerLoadError& e) {
      requeue_after_bad_load(s, e);
      continue;
    } catch (const Error& e) {
      retire(s.id, RequestState::Failed, e.what(), e.kind());
      continue;
    }
    const auto& rows = s.execution->prefill().rows;
    if (!std::is_sorted(rows.begin(), rows.end()))  // pieces rely on it (slice_queries)
      fail(ErrorKind::Internal, "a prefill plan with rows out of order");
    s.prefilled = 0;
    s.n_rows_used = n;
    s.next_position = *std::max_element(plan.positions.begin(), plan.positions.end()) + 1;
    s.admitted = ++admissions_;
    prefilling_.push_back(s.id);
    return true;
  }
  return false;
}

namespace {

// The layer hook of a prefill pass that sits at batch indices [q0, end) of a
// step's batch.
struct BatchHook {
  int64_t q0 = 0, end = 0;
  const LayerHook* hook = nullptr;
};

// One hook for a batch: each pass's hook sees its own tokens, numbered from
// 0 as in its pass; every other token goes on.
LayerHook batch_hook(std::vector<BatchHook> hooks, int64_t n_embd_kv) {
  return [hooks = std::move(hooks), n_embd_kv](const LayerKv& layer) {
    std::vector<int64_t> keep, local;
    size_t a = 0;
    for (const BatchHook& h : hooks) {
      while (a < layer.active.size() && layer.active[a] < h.q0) keep.push_back(layer.active[a++]);
      size_t b = a;
      local.clear();
      while (b < layer.active.size() && layer.active[b] < h.end) local.push_back(layer.active[b++] - h.q0);
      const LayerKv own{layer.layer,
                        local,
                        layer.k_fresh + static_cast<int64_t>(a) * n_embd_kv,
                        layer.v_fresh + static_cast<int64_t>(a) * n_embd_kv,
                        layer.kv,
                        layer.rows.subspan(static_cast<size_t>(h.q0), static_cast<size_t>(h.end - h.q0)),
                        layer.mass};  // one whole pass a step: the statistics are its own
      for (int64_t i : (*h.hook)(own)) keep.push_back(h.q0 + i);
      a = b;
    }
    while (a < layer.active.size()) keep.push_back(layer.active[a++]);
    return keep;
  };
}

}  // namespace

bool Engine::step() {
  if (waiting_.empty() && prefilling_.empty() && decoding_.empty()) return false;
  prepare_step();
  const StepBatch batch = schedule();
  if (batch.plan.tokens.empty()) {
    // Nothing to compute until a fetch ends: wait for one (bounded, so the
    // caller's other work goes on).
    if (fetcher_ && !waiting_.empty()) fetcher_->wait_any(std::chrono::milliseconds(20));
    return !waiting_.empty() || n_running() > 0;
  }
  if (const std::optional<StepOutput> out = run(batch)) commit(batch, *out);
  return true;
}

void Engine::prepare_step() {
  if (admission_.lookahead()) {
    std::vector<WaitingRequest> pending;
    for (size_t i = 0; i < waiting_.size() && i < admission_.window(); ++i) {
      Sequence& w = live(waiting_[i]);
      pending.push_back({&w.lookups, static_cast<int64_t>(w.plan.tokens.size()), &w.passed_over});
    }
    admission_.refresh_lookahead(index_, pending);
  }
  make_room_to_decode();
  if (fetching_ahead())
    for (size_t i = 0; i < waiting_.size() && i < options_.prefetch; ++i) fetched(live(waiting_[i]), false);
}

Engine::StepBatch Engine::schedule() {
  // What this step computes: a decode token of every running sequence, then
  // pieces of prefills (those under way first, then new admissions in the
  // scheduler's order) while the budget lasts.
  StepBatch b;
  int64_t budget = options_.batch_tokens - static_cast<int64_t>(decoding_.size());
  // A pass that must run whole (a layer hook, attention statistics) goes in
  // a step with room for it, or first in a step of its own; one per step, so
  // its statistics are its own.
  bool whole_taken = false;
  for (size_t i = 0; budget > 0; ++i) {
    if (i == prefilling_.size() && !admit_next()) break;
    Sequence& s = live(prefilling_[i]);
    const auto n_q = static_cast<int64_t>(s.execution->prefill().tokens.size());
    const bool whole = s.execution->whole_pass();
    if (whole && (whole_taken || (!b.pieces.empty() && n_q > budget))) continue;
    whole_taken = whole_taken || whole;
    const int64_t piece =
        s.sampling.prefill_piece_tokens > 0 ? std::min(budget, s.sampling.prefill_piece_tokens) : budget;
    const int64_t end = whole ? n_q : std::min(n_q, s.prefilled + piece);
    // Prompt logits: of the final pass of the prompt alone (nothing generated yet).
    const bool all_logits =
        s.sampling.prompt_logits && s.execution->final_pass() && results_.at(s.id).tokens.empty();
    b.pieces.push_back({&s, s.id, s.prefilled, end, end == n_q, all_logits});
    budget -= end - s.prefilled;
  }
  // One plan for all of it, each sequence its own visibility group. Rows are
  // read from the pool only now: admissions may have moved blocks.
  std::vector<QueryGroup> groups;
  for (RequestId id : decoding_) {
    Sequence& s = live(id);
    const auto q = static_cast<int64_t>(b.plan.tokens.size());
    const int64_t row = s.rows.row0() + s.n_rows_used;
    b.plan.tokens.push_back(results_.at(id).tokens.back());
    b.plan.positions.push_back(s.next_position);
    b.plan.rows.push_back(row);
    groups.push_back({q, 1, {}, s.rows.row0(), row});  // all of its rows, itself included
    b.plan.logits_for.push_back(q);
    b.decoding.push_back(&s);
  }
  std::vector<BatchHook> hooks;
  for (const StepBatch::Piece& piece : b.pieces) {
    const PrefillPlan& p = piece.s->execution->prefill();
    const int64_t begin = piece.begin, row0 = piece.s->rows.row0();
    const auto q0 = static_cast<int64_t>(b.plan.tokens.size());
    append_shifted(groups, slice_queries(p.visibility, begin, piece.end), q0, row0);
    for (int64_t q = begin; q < piece.end; ++q) {
      b.plan.tokens.push_back(p.tokens[q]);
      b.plan.positions.push_back(p.positions[q]);
      b.plan.rows.push_back(row0 + p.rows[q]);
    }
    if (piece.all_logits)
      for (int64_t q = 0; q < piece.end - begin; ++q) b.plan.logits_for.push_back(q0 + q);
    else if (piece.last && piece.s->execution->final_pass())
      b.plan.logits_for.push_back(q0 + (piece.end - begin) - 1);
    // Whole passes only (begin is 0): hooks and statistics see all of it.
    if (p.hook) hooks.push_back({q0, piece.end, &p.hook});
    if (!p.stats_queries.empty()) {
      for (int64_t q : p.stats_queries) b.plan.stats_queries.push_back(q0 + q);
      for (const RowRange& t : p.stats_targets)
        b.plan.stats_targets.push_back({row0 + t.begin, row0 + t.end});
      b.plan.stats_from_layer = p.stats_from_layer;
    }
  }
  if (b.plan.tokens.empty()) return b;
  b.plan.visibility = Visibility(std::move(groups));
  if (!hooks.empty()) b.plan.hook = batch_hook(std::move(hooks), model_->config().n_embd_kv());
  return b;
}

std::optional<Engine::StepOutput> Engine::run(const StepBatch& b) {
  const auto t0 = Clock::now();
  StepOutput step;
  std::exception_ptr failure;
  try {
    step.out = fwd_.prefill(b.plan, pool_.kv());
  } catch (...) {
    failure = std::current_exception();
  }
  try {
    if (failure) std::rethrow_exception(failure);
  } catch (const LayerLoadError& e) {
    // A span read during the pass was bad: the sequence that placed it runs
    // again without it. Nothing else in the batch advanced; it is simply
    // computed again next step.
    for (const StepBatch::Piece& p : b.pieces)
      if (p.s->execution->loading()) requeue_after_bad_load(*p.s, e);
    return std::nullopt;
  } catch (const Error& e) {
    // Nothing of this batch can be trusted: every request in it fails (their
    // leases and rows are released as they retire).
    for (const StepBatch::Piece& p : b.pieces) retire(p.s->id, RequestState::Failed, e.what(), e.kind());
    for (Sequence* s : b.decoding) retire(s->id, RequestState::Failed, e.what(), e.kind());
    return std::nullopt;
  }
  step.ms_per_token = ms_since(t0) / static_cast<double>(b.plan.tokens.size());
  return step;
}

void Engine::commit(const StepBatch& b, const StepOutput& step) {
  const PrefillResult& out = step.out;
  const double ms_per_token = step.ms_per_token;
  ms_per_token_ = ms_per_token;
  const int n_vocab = model_->config().n_vocab;
  size_t at = 0;
  for (Sequence* s : b.decoding) {
    const std::span<const float> logits(out.logits.data() + at * n_vocab, n_vocab);
    ++at;
    ++s->n_rows_used;
    ++s->next_position;
    RequestResult& r = results_.at(s->id);
    r.finite = r.finite && all_finite(logits);
    emit(*s, s->sampler.sample(logits), logits);
  }
  for (const StepBatch::Piece& piece : b.pieces) {
    Sequence& s = *piece.s;
    if (piece.all_logits) {
      // Every row but the last is the prompt's only; the last is read below
      // as the first token's too.
      const int64_t n = piece.end - s.prefilled;
      s.prompt_logits.insert(s.prompt_logits.end(), out.logits.begin() + static_cast<int64_t>(at) * n_vocab,
                             out.logits.begin() + (static_cast<int64_t>(at) + n) * n_vocab);
      at += static_cast<size_t>(piece.last ? n - 1 : n);
    }
    s.prefilled = piece.end;
    if (!piece.last) continue;
    const PassResult done{out.attention_mass, s.execution->prefill().visibility.n_pairs(), ms_per_token};
    if (!s.execution->final_pass()) {
      try {
        s.execution->next_pass(pool_.kv(), s.rows.row0(), done);
      } catch (const LayerLoadError& e) {
        requeue_after_bad_load(s, e);
        continue;
      } catch (const Error& e) {
        retire(s.id, RequestState::Failed, e.what(), e.kind());
        continue;
      }
      s.prefilled = 0;
      continue;
    }
    const std::span<const float> logits(out.logits.data() + at * n_vocab, n_vocab);
    ++at;
    RequestResult& r = results_.at(s.id);
    PrefillReport report;
    try {
      report = s.execution->finish(pool_.kv(), s.rows.row0(),
                                   std::vector<float>(logits.begin(), logits.end()), done);
    } catch (const LayerLoadError& e) {
      requeue_after_bad_load(s, e);
      continue;
    }
    if (!s.resumed) {  // the first prefill is the request's
      r.report = std::move(report);
      if (s.sampling.prompt_kv) {
        std::vector<int64_t> rows(s.plan.tokens.size());
        std::iota(rows.begin(), rows.end(), s.rows.row0());
        r.prompt_kv = pool_.kv().extract(rows);
      }
    }
    if (piece.all_logits) r.prompt_logits = std::move(s.prompt_logits);
    s.execution.reset();
    r.finite = r.finite && all_finite(logits);
    std::erase(prefilling_, s.id);
    decoding_.push_back(s.id);
    emit(s, s.sampler.sample(logits), logits);
  }
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

PrefillCostTable Engine::profile_prefill_cost(int64_t max_tokens) {
  // Timed in the pool's own rows, which no request holds yet: no second
  // assembly beside the pool.
  if (!waiting_.empty() || n_running() > 0 || pool_.n_free() != pool_.n_rows())
    fail(ErrorKind::Internal, "the prefill cost is profiled before any request is submitted");
  return depcache::profile_prefill_cost(fwd_, pool_.kv(), std::min(max_tokens, pool_.n_rows()));
}

const RequestResult& Engine::wait(RequestId id) {
  while (live_.count(id) && step()) {
  }
  const RequestResult& r = result(id);
  if (r.state == RequestState::Failed) fail(r.error_kind, "{}", r.error);
  return r;
}

void Engine::forget(RequestId id) {
  if (!live_.count(id)) results_.erase(id);
}

const RequestResult& Engine::result(RequestId id) const {
  const auto it = results_.find(id);
  if (it == results_.end()) fail(ErrorKind::NotFound, "no request {}", id);
  return it->second;
}

}  // namespace depcache

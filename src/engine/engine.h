#pragma once
// The engine: many requests in flight over one model. It owns the forward
// pass, a KV pool shared by every running sequence, the radix index (with
// whatever tiers the caller attaches) and the strategies. Front ends submit
// requests and read their tokens as they come; step() runs one batched
// forward pass that mixes one decode token of every running sequence with
// pieces of the prefills of admitted requests (each planned by its strategy
// and applied in its own block of pool rows) up to a token budget, each
// sequence seeing only its own rows. When a decoding sequence needs a row
// and none is free, the most recently admitted sequence is preempted: its
// rows go back to the pool and it waits at the head of the queue, to be
// prefilled again with the tokens it generated (mostly from the index, which
// kept its prompt's spans).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compute/sampling.h"
#include "engine/cost_profile.h"
#include "engine/kv_pool.h"
#include "engine/span_fetcher.h"
#include "engine/text_output.h"
#include "exec/forward.h"
#include "kv/kv_span.h"
#include "kv/radix_index.h"
#include "prompt/prompt_parts.h"
#include "strategy/admission.h"
#include "strategy/strategy.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace depcache {

struct SamplingParams {
  SamplerParams sampler;    // temperature <= 0: greedy; penalties, logit bias
  int max_tokens = 16;      // tokens generated, the first included
  bool stop_at_eog = true;  // end at EngineOptions::eog_ids
  // The text ends before the first of these (needs EngineOptions::tokenizer).
  std::vector<std::string> stop;
  // >= 0: each generated token's log-probability under the model's raw
  // logits (before bias, penalties and temperature) and this many of the
  // most likely tokens (at most kMaxTopLogprobs). A pass over the vocabulary
  // per token: only when asked.
  int logprobs = -1;
  static constexpr int kMaxTopLogprobs = 20;
  // At most this many of its prompt tokens are computed in one step (0: as
  // many as the step's budget allows). Small pieces let a cancel take effect
  // soon (speculative prefills).
  int64_t prefill_piece_tokens = 0;
  // The logits of every prompt token the prefill computes, not only the
  // last (RequestResult::prompt_logits): what an oracle comparison reads.
  bool prompt_logits = false;
  // The K/V of every prompt row once the prefill is done
  // (RequestResult::prompt_kv), and the logits every generated token was
  // sampled from (RequestResult::token_logits): what a comparison of two
  // ways of computing a request (reuse against none) reads.
  bool prompt_kv = false;
  bool token_logits = false;
};

struct EngineOptions {
  int64_t pool_rows = 4096;  // rows of the shared KV pool
  DType kv_type = DType::F16;
  size_t cache_bytes = size_t{1} << 30;  // the index's hot tier
  std::string policy = "lru";
  StrategyOptions strategy;  // position scheme, reuse
  // Tokens computed per step: one per decoding sequence, the rest prefill
  // (long prompts are split over several steps). 512: on a loaded GraphRAG
  // stream (qwen2-0.5b, 2 cores) 256-512 gave the lowest TTFT at the same
  // throughput as 1024-4096 (pieces finish in admission order sooner), and
  // prefill runs as fast per token at 512 as at 2048 (docs/performance.md, "Throughput").
  int64_t batch_tokens = 512;
  // Rows a sequence gets beyond its prompt when admitted, and adds each time
  // it runs out while decoding (never more than it can still generate).
  int64_t decode_rows_ahead = 32;
  // Sequences in flight at most (0: as many as the pool and budget allow;
  // 1: one request at a time, the others queueing).
  size_t max_running = 0;
  int threads = 0;
  // LACR (policy "lacr"): before each step, the lookahead weights are taken
  // from the first `window` waiting requests.
  size_t window = 32;
  // The spans of the next `prefetch` waiting requests are brought to the hot
  // tier on another thread (SpanFetcher) while the engine computes. With a
  // disk or remote tier attached, a request's spans are read on that thread
  // in any case (when it is next to be admitted, if not ahead), and it is
  // admitted once its fetch is done: the engine's thread never reads those
  // tiers itself.
  size_t prefetch = 0;
  // Which waiting request is admitted next (among the first `window`).
  SchedulerOptions scheduler;
  // A waiting request that shares uncached tokens with a prefill under way
  // (the same run in the same context) waits for it to finish and reuses
  // its KV, instead of computing the same tokens beside it; unless it was
  // passed over scheduler.starvation_bound times.
  bool wait_for_shared = true;
  std::vector<int32_t> eog_ids;  // end-of-generation tokens (from the front end's tokenizer)
  // When set, requests also stream text (TokenEvent::text, RequestResult::
  // text) and may end at stop strings.
  std::shared_ptr<const Tokenizer> tokenizer;
};

using RequestId = int64_t;

// Whether a request's strategy reads and fills the index: Shared (the
// default), or None — its prompt computed alone, nothing looked up, nothing
// stored (the reference a reuse is compared with: `run --verify`).
enum class CacheUse { Shared, None };

enum class RequestState { Waiting, Running, Finished, Cancelled, Failed };
const char* request_state_name(RequestState s);  // "waiting", "running", "finished", ...
// Why a finished request ended: max_tokens, an end-of-generation token, a
// stop string.
enum class FinishReason { None, Length, EndOfGeneration, Stop };

// A generated token's log-probabilities (SamplingParams::logprobs) and where
// its text begins in the request's text, in characters (code points).
struct OutputLogprob {
  TokenLogprob logprob;
  int64_t text_offset = 0;
};

struct TokenEvent {
  RequestId id = 0;
  int32_t token = 0;
  int index = 0;      // 0 for the first generated token
  bool last = false;  // the request is done after this one
  std::string text;   // with a tokenizer: the text that became final with this token
  // With SamplingParams::logprobs: those of the tokens whose text begins in
  // `text` (held back with it; a token wholly inside a stop string or an
  // end-of-generation token has none).
  std::vector<OutputLogprob> logprobs;
};

struct RequestResult {
  RequestState state = RequestState::Waiting;
  std::string error;                           // Failed: why
  ErrorKind error_kind = ErrorKind::Internal;  // Failed: what kind of failure
  PrefillReport report;                        // its prefill (logits: of the first generated token)
  std::vector<int32_t> tokens;                 // generated
  std::string text;                            // with a tokenizer: their text, up to any stop string
  std::vector<OutputLogprob> logprobs;         // every TokenEvent's, in order
  // With SamplingParams::prompt_logits: (computed prompt tokens, n_vocab),
  // in prompt order; every prompt token when nothing was reused.
  std::vector<float> prompt_logits;
  // With SamplingParams::prompt_kv: the prompt's rows as its first prefill
  // left them (placed and computed alike), in prompt order, with their
  // positions.
  KvSpan prompt_kv;
  // With SamplingParams::token_logits: (generated tokens, n_vocab), the
  // model's logits before bias, penalties and temperature.
  std::vector<float> token_logits;
  FinishReason finish_reason = FinishReason::None;
  bool finite = true;   // every logits row it produced was finite
  int preemptions = 0;  // times its rows were taken back and it was prefilled again
  std::chrono::steady_clock::time_point submitted, first_token, done;
};

// Not thread-safe: one thread submits, cancels and steps (a server serializes
// its calls).
class Engine {
 public:
  Engine(std::shared_ptr<const Model> model, const EngineOptions& options);
  ~Engine();

  // strategy: one of strategy_names(). on_token is called from step().
  RequestId submit(std::string_view strategy, PromptParts parts, const SamplingParams& sampling,
                   std::function<void(const TokenEvent&)> on_token = {}, CacheUse cache = CacheUse::Shared);
  // What a request would look up (namespaces and token sequences), planned
  // as submit() plans it, without queuing it: a router's view of a request.
  std::vector<Lookup> lookups_of(std::string_view strategy, PromptParts parts);
  // A plan made outside the engine's strategies (FusionRAG's offline fusion
  // of a chunk after its neighbours), run as any other request, in the
  // scope it was confined to (scope_plan).
  RequestId submit_plan(RequestPlan plan, const SamplingParams& sampling,
                        std::function<void(const TokenEvent&)> on_token = {});
  // A waiting request never runs; a running one stops and frees its rows (a
  // prefill stopped midway leaves what it computed in the index).
  void cancel(RequestId id);
  // Changes a live request's SamplingParams::prefill_piece_tokens (a
  // confirmed speculation computes the rest of its prefill at full speed).
  void set_prefill_piece_tokens(RequestId id, int64_t n);
  // One batched forward pass; false when nothing was waiting or running.
  bool step();
  void run_until_idle();
  // Steps until request `id` has ended (other requests advance with it) and
  // returns its result; a request that failed throws its error.
  const RequestResult& wait(RequestId id);

  const RequestResult& result(RequestId id) const;
  // Drops an ended request's result (a long-running front end forgets what it
  // has delivered); a live request is kept.
  void forget(RequestId id);
  size_t n_waiting() const { return waiting_.size(); }
  size_t n_running() const { return prefilling_.size() + decoding_.size(); }
  int64_t preemptions() const { return preemptions_; }
  int64_t prefetched_tokens() const { return fetcher_ ? fetcher_->loaded() : 0; }
  // Tokens that prefills stopped midway (cancelled, preempted) left in the index.
  int64_t kept_partial_tokens() const { return kept_partial_; }
  // PGDSF's cost of recomputing tokens after cached ones, timed on this
  // machine with this model (engine/cost_profile.h) in the pool's first
  // max_tokens rows; call before submitting any request (Internal otherwise).
  PrefillCostTable profile_prefill_cost(int64_t max_tokens);
  // The cache index, to read (statistics, sizes, what it holds); under its
  // lock() while a fetch ahead may be moving spans.
  const RadixIndex& index() const { return index_; }
  // Setting up the cache, before requests run: the cost of recomputing
  // tokens after cached ones, for cost-aware policies (PGDSF); an observer of
  // what enters and leaves it (KV events). Its lower tiers are attached by
  // LowerTiers (engine/engine_tiers.h).
  void set_cache_cost_model(std::function<double(int64_t cached, int64_t n)> cost) {
    index_.set_cost_model(std::move(cost));
  }
  void observe_cache(std::shared_ptr<IndexObserver> observer) { index_.set_observer(std::move(observer)); }
  // Moves what the cache holds in memory to its disk tier (a clean shutdown).
  void persist_cache() { index_.persist(); }
  // The pool's rows, to read (sizes, invariants): only the engine changes them.
  const KvPool& pool() const { return pool_; }
  // What every cache namespace of this engine is keyed by: the model's
  // fingerprint and, when matmuls are approximate (int8 activations, set
  // when the engine is made), that mode, so approximate K/V never meets
  // exact K/V in a shared tier.
  uint64_t cache_fingerprint() const { return cache_fingerprint_; }
  // Every strategy's state beside a persistent tier (Strategy::save_state);
  // call while no request runs. Load returns the records dropped.
  void save_strategy_state(const std::filesystem::path& dir) const;
  size_t load_strategy_state(const std::filesystem::path& dir);

 private:
  friend class LowerTiers;       // attaches the cache's lower tiers
  friend struct EngineTestPeer;  // tests: the index as the engine's own code sees it
  struct Sequence;
  Strategy& strategy(std::string_view name, CacheUse cache);
  RequestId enqueue(RequestPlan plan, const SamplingParams& sampling,
                    std::function<void(const TokenEvent&)> on_token);
  Sequence& live(RequestId id) { return *live_.at(id); }
  // The token sampled from `logits` (the model's, for logprobs) goes out.
  void emit(Sequence& s, int32_t token, std::span<const float> logits);
  void retire(RequestId id, RequestState state, const std::string& error = {},
              ErrorKind kind = ErrorKind::Internal);
  void preempt(Sequence& s);
  // A span read layer by layer was bad (LayerLoadError): the sequence waits
  // at the head of the queue again, as if preempted, and the node leaves the
  // index, so it computes those tokens.
  void requeue_after_bad_load(Sequence& s, const LayerLoadError& e);
  // A prefill under way gives what it computed so far to the index.
  void keep_partial(Sequence& s);

  // A step in phases. prepare_step: the scheduler's lookahead, room for the
  // decodes, fetches ahead. schedule: what the step computes, a decode
  // token of every running sequence then pieces of prefills while the
  // budget lasts, as one plan. run: the forward pass over it (nullopt when it
  // failed: its requests are requeued or failed). commit: what the outputs
  // do (tokens out, passes advanced, prefills finished).
  struct StepBatch {
    struct Piece {
      Sequence* s;
      RequestId id;
      int64_t begin, end;       // queries [begin, end) of its prefill (begin: what was prefilled)
      bool last;                // its prefill's last piece
      bool all_logits = false;  // every query's logits (SamplingParams::prompt_logits)
    };
    std::vector<Piece> pieces;
    std::vector<Sequence*> decoding;
    PrefillPlan plan;  // empty: nothing to compute this step
  };
  // What run computed, and at what cost per token.
  struct StepOutput {
    PrefillResult out;
    double ms_per_token = 0;
  };
  void prepare_step();
  StepBatch schedule();
  std::optional<StepOutput> run(const StepBatch& b);
  void commit(const StepBatch& b, const StepOutput& step);

  void make_room_to_decode();
  int64_t rows_ahead() const { return std::max<int64_t>(options_.decode_rows_ahead, 1); }
  // Tokens of `lookups` that the prefills under way will insert and the
  // index does not hold yet.
  int64_t computed_in_flight(const std::vector<Lookup>& lookups);
  // The scheduler's next waiting request admitted into the pool, or false.
  bool admit_next();
  // Fetching ahead is on: a prefetch depth is set or the index has a tier
  // with I/O.
  bool fetching_ahead() const { return options_.prefetch > 0 || index_.has_io_tiers(); }
  // Starts the fetch of a waiting request (if it has none, or, when
  // `admitting`, if its spans left the hot tier since); true when it is done
  // (or there is nothing to fetch).
  bool fetched(Sequence& s, bool admitting);

  std::shared_ptr<const Model> model_;
  uint64_t cache_fingerprint_;
  EngineOptions options_;
  Admission admission_;
  ThreadPool threads_;
  Forward fwd_;
  KvPool pool_;
  RadixIndex index_;
  std::map<std::string, std::unique_ptr<Strategy>, std::less<>> strategies_;
  // The same strategies without reuse (CacheUse::None), made when first asked for.
  std::map<std::string, std::unique_ptr<Strategy>, std::less<>> alone_strategies_;
  RequestId next_id_ = 1;
  std::deque<RequestId> waiting_;      // preempted ones first
  std::vector<RequestId> prefilling_;  // admitted, prefill not done; in admission order
  std::vector<RequestId> decoding_;    // in admission order
  std::map<RequestId, std::unique_ptr<Sequence>> live_;
  std::map<RequestId, RequestResult> results_;
  std::unique_ptr<SpanFetcher> fetcher_;  // after index_: stopped before it goes
  int64_t kept_partial_ = 0;
  double ms_per_token_ = 0;  // of the last step committed
  int64_t preemptions_ = 0;
  uint64_t admissions_ = 0;
};

}  // namespace depcache

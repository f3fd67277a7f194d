#pragma once
// The engine on a thread of its own, for front ends that serve many clients
// from threads of their own (the HTTP server). submit() and cancel() may be
// called from any thread: they are queued, and the loop thread applies them
// between steps, steps while anything is waiting or running, and sleeps
// otherwise. Each request's token events reach its caller through a
// RequestStream, a blocking queue that ends with the request's result.
// Nothing of the Engine is touched from another thread; what front ends
// report (queue depth, rows, pins, index bytes) is a snapshot the loop
// publishes after every step.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"

namespace depcache {

class RequestStream {
 public:
  // The next token event; nullopt when the request has ended (result() is
  // then final) or, with a timeout, when none came in time (check done()).
  std::optional<TokenEvent> next(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  bool done() const;
  // After the end: the request's state, error, report, tokens and text.
  RequestResult result() const;
  RequestId id() const;  // 0 until the loop accepted it

 private:
  friend class EngineLoop;
  void push(const TokenEvent& e);
  void end(RequestResult r);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool ended_ = false;
  RequestResult result_;
  RequestId id_ = 0;
};

struct EngineSnapshot {
  size_t waiting = 0, running = 0;
  int64_t pool_rows = 0, pool_free = 0;
  size_t pinned_nodes = 0;
  size_t tier_bytes[RadixIndex::kTiers] = {};
  RadixIndex::Stats index;
  int64_t preemptions = 0;
  int64_t steps = 0;
  int64_t finished = 0, cancelled = 0, failed = 0;  // requests ended so far, by how
};

class EngineLoop {
 public:
  // setup runs on the loop thread before the first step (attach tiers, set a
  // cost model: whatever must touch the engine); teardown after the last,
  // when the loop is destroyed (persist the index).
  EngineLoop(std::shared_ptr<const Model> model, const EngineOptions& options,
             std::function<void(Engine&)> setup = {}, std::function<void(Engine&)> teardown = {});
  ~EngineLoop();  // cancels what is left and joins
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a request. Errors the engine finds on submission (an unknown
  // strategy, a bad parameter) end the stream with state Failed; after
  // drain() every submission ends so at once.
  std::shared_ptr<RequestStream> submit(std::string strategy, PromptParts parts, SamplingParams sampling);
  // Stops a request (its stream ends Cancelled); unknown or ended: nothing.
  void cancel(const std::shared_ptr<RequestStream>& stream);
  // Engine::set_prefill_piece_tokens, between steps; unknown or ended: nothing.
  void set_prefill_piece_tokens(const std::shared_ptr<RequestStream>& stream, int64_t n);
  // Stops accepting, lets what is in flight finish until `deadline`, then
  // cancels the rest. Returns true when everything finished in time.
  bool drain(std::chrono::steady_clock::time_point deadline);
  // The state after the last step; `waiting` also counts submissions the
  // engine has not taken in yet.
  EngineSnapshot snapshot() const;

 private:
  using Live = std::map<RequestId, std::shared_ptr<RequestStream>>;  // submitted, not ended
  using Command = std::function<void(Engine&, Live&)>;
  void run(Engine& engine);

  std::shared_ptr<const Model> model_;
  EngineOptions options_;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::vector<Command> commands_;
  bool stopping_ = false, draining_ = false, busy_ = false;
  EngineSnapshot snapshot_;
  size_t queued_submits_ = 0;  // submissions queued or taken but not yet in snapshot_
  std::exception_ptr setup_failed_;
  std::thread thread_;
};

}  // namespace depcache

#include "engine/engine_loop.h"

#include "util/error.h"

namespace depcache {

std::optional<TokenEvent> RequestStream::next(std::optional<std::chrono::milliseconds> timeout) {
  std::unique_lock lk(mu_);
  const auto ready = [&] { return !events_.empty() || ended_; };
  if (timeout) {
    if (!cv_.wait_for(lk, *timeout, ready)) return std::nullopt;
  } else {
    cv_.wait(lk, ready);
  }
  if (events_.empty()) return std::nullopt;
  TokenEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

bool RequestStream::done() const {
  std::lock_guard lk(mu_);
  return ended_ && events_.empty();
}

RequestResult RequestStream::result() const {
  std::lock_guard lk(mu_);
  return result_;
}

RequestId RequestStream::id() const {
  std::lock_guard lk(mu_);
  return id_;
}

void RequestStream::push(const TokenEvent& e) {
  {
    std::lock_guard lk(mu_);
    events_.push_back(e);
  }
  cv_.notify_all();
}

void RequestStream::end(RequestResult r) {
  {
    std::lock_guard lk(mu_);
    result_ = std::move(r);
    ended_ = true;
  }
  cv_.notify_all();
}

namespace {
RequestResult failed(ErrorKind kind, const std::string& error) {
  RequestResult r;
  r.state = RequestState::Failed;
  r.error = error;
  r.error_kind = kind;
  r.submitted = r.done = std::chrono::steady_clock::now();
  return r;
}
}  // namespace

EngineLoop::EngineLoop(std::shared_ptr<const Model> model, const EngineOptions& options,
                       std::function<void(Engine&)> setup, std::function<void(Engine&)> teardown)
    : model_(std::move(model)), options_(options) {
  bool ready = false;
  thread_ = std::thread([this, setup = std::move(setup), teardown = std::move(teardown), &ready] {
    std::unique_ptr<Engine> engine;
    try {
      engine = std::make_unique<Engine>(model_, options_);
      if (setup) setup(*engine);
    } catch (...) {
      setup_failed_ = std::current_exception();
    }
    {
      std::lock_guard lk(mu_);
      ready = true;
    }
    idle_.notify_all();
    if (!engine || setup_failed_) return;  // the constructor rethrows after joining
    run(*engine);
    if (teardown) teardown(*engine);
  });
  std::unique_lock lk(mu_);
  idle_.wait(lk, [&] { return ready; });
  if (setup_failed_) {
    lk.unlock();
    thread_.join();
    std::rethrow_exception(setup_failed_);
  }
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<RequestStream> EngineLoop::submit(std::string strategy, PromptParts parts,
                                                  SamplingParams sampling) {
  auto stream = std::make_shared<RequestStream>();
  {
    std::lock_guard lk(mu_);
    if (draining_ || stopping_) {
      stream->end(failed(ErrorKind::LimitExceeded, "the engine is shutting down"));
      return stream;
    }
    ++queued_submits_;
    commands_.push_back([stream, strategy = std::move(strategy), parts = std::move(parts),
                         sampling = std::move(sampling)](Engine& e, Live& live) mutable {
      try {
        const RequestId id = e.submit(strategy, std::move(parts), sampling,
                                      [stream](const TokenEvent& ev) { stream->push(ev); });
        {
          std::lock_guard lk(stream->mu_);
          stream->id_ = id;
        }
        live.emplace(id, stream);
      } catch (const Error& err) {
        stream->end(failed(err.kind(), err.what()));
      }
    });
  }
  wake_.notify_all();
  return stream;
}

void EngineLoop::cancel(const std::shared_ptr<RequestStream>& stream) {
  {
    std::lock_guard lk(mu_);
    // Queued after the stream's submission, so by the time it runs the
    // stream has its id (or has ended).
    commands_.push_back([stream](Engine& e, Live& live) {
      const RequestId id = stream->id();
      if (id != 0 && live.count(id)) e.cancel(id);
    });
  }
  wake_.notify_all();
}

void EngineLoop::set_prefill_piece_tokens(const std::shared_ptr<RequestStream>& stream, int64_t n) {
  {
    std::lock_guard lk(mu_);
    commands_.push_back([stream, n](Engine& e, Live& live) {
      const RequestId id = stream->id();
      if (id != 0 && live.count(id)) e.set_prefill_piece_tokens(id, n);
    });
  }
  wake_.notify_all();
}

bool EngineLoop::drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lk(mu_);
  draining_ = true;
  const auto idle = [&] { return commands_.empty() && !busy_ && snapshot_.waiting + snapshot_.running == 0; };
  const bool in_time = idle_.wait_until(lk, deadline, idle);
  if (!in_time) {
    commands_.push_back([](Engine& e, Live& live) {
      for (const auto& [id, stream] : live) e.cancel(id);
    });
    wake_.notify_all();
    idle_.wait(lk, idle);
  }
  return in_time;
}

EngineSnapshot EngineLoop::snapshot() const {
  std::lock_guard lk(mu_);
  EngineSnapshot s = snapshot_;
  // Submissions the engine has not seen in a step yet wait too: a burst
  // that arrives during one long step is counted at once.
  s.waiting += queued_submits_;
  return s;
}

void EngineLoop::run(Engine& engine) {
  Live live;
  EngineSnapshot s;  // its counters run on; the rest is read again after every step
  bool stop = false;
  for (;;) {
    std::vector<Command> commands;
    size_t taken = 0;  // submissions among `commands`
    {
      std::unique_lock lk(mu_);
      busy_ = false;
      const bool work = engine.n_waiting() + engine.n_running() > 0;
      if (!work) idle_.notify_all();
      wake_.wait(lk, [&] { return stopping_ || !commands_.empty() || work; });
      commands.swap(commands_);
      taken = queued_submits_;
      stop = stopping_;
      busy_ = true;
    }
    // Submissions queued before a stop still run, so their streams end below.
    for (auto& c : commands) c(engine, live);
    if (stop) break;
    bool stepped = false;
    try {
      stepped = engine.step();
    } catch (const std::exception& e) {
      // The engine fails requests itself; anything escaping it is a bug:
      // end every request rather than leave clients waiting.
      for (const auto& [id, stream] : live) engine.cancel(id);
      for (const auto& [id, stream] : live) stream->end(failed(ErrorKind::Internal, e.what()));
      live.clear();
    }
    s.steps += stepped;
    // Requests that ended in this round: their streams end, the engine forgets them.
    for (auto it = live.begin(); it != live.end();) {
      const RequestResult& r = engine.result(it->first);
      if (r.state == RequestState::Waiting || r.state == RequestState::Running) {
        ++it;
        continue;
      }
      ++(r.state == RequestState::Finished    ? s.finished
         : r.state == RequestState::Cancelled ? s.cancelled
                                              : s.failed);
      it->second->end(r);
      engine.forget(it->first);
      it = live.erase(it);
    }
    s.waiting = engine.n_waiting();
    s.running = engine.n_running();
    s.pool_rows = engine.pool().n_rows();
    s.pool_free = engine.pool().n_free();
    {
      const RadixIndex& index = engine.index();
      const auto ilk = index.lock();
      s.pinned_nodes = index.n_pinned();
      for (int t = 0; t < RadixIndex::kTiers; ++t) s.tier_bytes[t] = index.bytes(static_cast<Tier>(t));
      s.index = index.stats();
    }
    s.preemptions = engine.preemptions();
    std::lock_guard lk(mu_);
    snapshot_ = s;
    queued_submits_ -= taken;  // now in s.waiting or running (or ended)
  }
  // Stopping: whatever is left is cancelled, and its stream ends.
  for (const auto& [id, stream] : live) {
    engine.cancel(id);
    stream->end(engine.result(id));
  }
}

}  // namespace depcache

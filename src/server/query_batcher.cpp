#include "server/query_batcher.h"

#include <algorithm>

#include "util/error.h"

namespace depcache {

QueryBatcher::QueryBatcher(QueryBatchOptions options) : options_(std::move(options)) {
  if (options_.subgcache.batch == 0 || options_.subgcache.clusters == 0)
    fail(ErrorKind::InvalidInput, "SubGCache batches need at least one query and one cluster");
  thread_ = std::thread([this] { run(); });
}

QueryBatcher::~QueryBatcher() { stop(); }

void QueryBatcher::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

QueryBatcher::Batched QueryBatcher::submit(RagRequest context, Submit submit, uint64_t scope) {
  std::future<Batched> done;
  {
    std::lock_guard lk(mu_);
    if (stopping_) fail(ErrorKind::Unavailable, "the server is shutting down");
    Pending p{std::move(context), std::move(submit), Clock::now(), {}, scope};
    done = p.done.get_future();
    pending_.push_back(std::move(p));
  }
  wake_.notify_all();
  return done.get();
}

void QueryBatcher::run() {
  std::unique_lock lk(mu_);
  while (true) {
    wake_.wait(lk, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, nothing left
    // A batch is full, or its first query waited the window, or the server
    // stops. A batch holds the first query's scope only.
    const uint64_t scope = pending_.front().scope;
    const auto same_scope = [&] {
      return static_cast<size_t>(std::count_if(pending_.begin(), pending_.end(),
                                               [&](const Pending& p) { return p.scope == scope; }));
    };
    const auto deadline = pending_.front().arrived + options_.window;
    wake_.wait_until(lk, deadline, [&] { return stopping_ || same_scope() >= options_.subgcache.batch; });
    std::vector<Pending> batch, rest;
    for (Pending& p : pending_)
      (p.scope == scope && batch.size() < options_.subgcache.batch ? batch : rest).push_back(std::move(p));
    pending_ = std::move(rest);
    lk.unlock();
    serve(std::move(batch));
    lk.lock();
  }
}

void QueryBatcher::serve(std::vector<Pending> batch) {
  std::vector<RagRequest> requests;
  for (const Pending& p : batch) requests.push_back(p.context);
  SubgcacheOptions o = options_.subgcache;
  o.batch = batch.size();
  SubgcachePlan plan;
  const auto t0 = Clock::now();
  try {
    plan = plan_subgcache(requests, o);
  } catch (...) {
    for (Pending& p : batch) p.done.set_exception(std::current_exception());
    return;
  }
  const double clustering_ms = ms_since(t0);
  for (size_t i : plan.order) {
    Pending& p = batch[i];
    try {
      Batched b;
      b.stream = p.submit(plan.requests[i]);
      b.report = {batch.size(), plan.cluster[i], plan.n_clusters, ms_since(p.arrived), clustering_ms};
      p.done.set_value(std::move(b));
    } catch (...) {
      p.done.set_exception(std::current_exception());
    }
  }
}

}  // namespace depcache

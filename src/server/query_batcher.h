#pragma once
// SubGCache in the server. GraphRAG requests that ask for strategy
// "subgcache" wait, up to a window after the first of them arrived, for up
// to a batch of others; the batch is clustered by subgraph (plan_subgcache)
// and each request is submitted, cluster by cluster, with its cluster's
// representative subgraph as context. The caller submits under the prefix
// strategy, so the first of a cluster computes the representative's KV and
// the others reuse it (the engine lets them wait for that prefill rather
// than compute it beside it).
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/engine_loop.h"
#include "retrieval/rag_request.h"
#include "strategy/subgcache.h"
#include "util/timing.h"

namespace depcache {

struct QueryBatchOptions {
  SubgcacheOptions subgcache;  // subgcache.batch: the most queries in a batch
  // How long a batch's first query waits for others before the batch is
  // clustered with what it has.
  std::chrono::milliseconds window{50};
};

// How one request was batched.
struct BatchReport {
  size_t size = 0;      // queries in its batch
  size_t cluster = 0;   // its cluster, 0-based within the batch
  size_t clusters = 0;  // clusters of the batch
  double wait_ms = 0;   // from its arrival here to its submission
  double clustering_ms = 0;
};

class QueryBatcher {
 public:
  explicit QueryBatcher(QueryBatchOptions options);
  ~QueryBatcher();  // stop()
  QueryBatcher(const QueryBatcher&) = delete;
  QueryBatcher& operator=(const QueryBatcher&) = delete;

  // Submits a request given its context (the representative's in place of
  // its own); called on the batcher's thread, in serving order. It may
  // throw: the exception is that request's.
  using Submit = std::function<std::shared_ptr<RequestStream>(const RagRequest& context)>;
  struct Batched {
    std::shared_ptr<RequestStream> stream;
    BatchReport report;
  };
  // Blocks until the request's batch is clustered and the request submitted
  // (`submit` must stay callable until then). Throws the batch's planning
  // error (a subgraph that does not parse: InvalidInput) or submit's.
  // After stop(): Unavailable. Requests are batched only with requests of
  // the same cache scope (tenant): a cluster's representative subgraph is
  // the union of its members' contexts.
  Batched submit(RagRequest context, Submit submit, uint64_t scope = 0);

  // Serves what is waiting at once, and refuses what comes after.
  void stop();

 private:
  struct Pending {
    RagRequest context;
    Submit submit;
    Clock::time_point arrived;
    std::promise<Batched> done;
    uint64_t scope = 0;
  };
  void run();
  void serve(std::vector<Pending> batch);

  QueryBatchOptions options_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Pending> pending_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace depcache

#pragma once
// What the server measures, in the Prometheus text format (/metrics):
// latency histograms (time to first token, end-to-end, between tokens),
// token counters (prompt, computed, reused, reused by the tier the KV came
// from), HTTP responses by status, and the engine's state at its last step
// (queue depth, running sequences, pool rows, pins, bytes per tier, index
// hits by tier, requests ended by outcome), and the corpus searches (their
// time, the part no prefill overlapped, speculative prefills). Thread-safe: request threads
// record, the scrape renders.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_loop.h"
#include "server/speculation.h"

namespace depcache {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // ascending upper bounds; +Inf is implied
  void observe(double v);
  // name_bucket{le=...}, name_sum, name_count (cumulative, as Prometheus wants).
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, the last one +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void first_token(double seconds);  // from the request's arrival
  void between_tokens(double seconds);
  // A request that ran on the engine ended (any outcome).
  void request_done(const RequestResult& r, double seconds);
  void response(int http_status);
  // A corpus search the server ran (speculative pipelining's figures).
  void search(const RetrievalReport& r);
  std::string render(const EngineSnapshot& engine) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, e2e_, itl_, search_, non_overlapped_;
  int64_t speculations_ = 0, discarded_ = 0, accepted_ = 0;
  int64_t prompt_tokens_ = 0, computed_tokens_ = 0, reused_tokens_ = 0, generated_tokens_ = 0;
  int64_t reused_from_[RadixIndex::kTiers] = {};
  std::map<int, int64_t> responses_;  // by HTTP status
};

}  // namespace depcache

#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace depcache {
namespace {

const std::vector<double> kLatencyBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,  5,     10,   25,  60,   120};
const std::vector<double> kTokenGapBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
const char* const kTierNames[RadixIndex::kTiers] = {"hot", "host", "disk", "remote"};

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

template <class T>
void metric(std::string& out, const std::string& name, const char* type, const std::string& help, T value) {
  header(out, name, type, help);
  out += fmt::format("{} {}\n", name, value);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const auto at = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[at];
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name,
                     count_);
}

ServerMetrics::ServerMetrics()
    : ttft_(kLatencyBounds),
      e2e_(kLatencyBounds),
      itl_(kTokenGapBounds),
      search_(kTokenGapBounds),
      non_overlapped_(kTokenGapBounds) {}

void ServerMetrics::search(const RetrievalReport& r) {
  std::lock_guard lk(mu_);
  search_.observe(r.search_ms / 1000);
  non_overlapped_.observe(r.non_overlapped_ms / 1000);
  speculations_ += r.speculations;
  discarded_ += r.discarded;
  accepted_ += r.accepted ? 1 : 0;
}

void ServerMetrics::first_token(double seconds) {
  std::lock_guard lk(mu_);
  ttft_.observe(seconds);
}

void ServerMetrics::between_tokens(double seconds) {
  std::lock_guard lk(mu_);
  itl_.observe(seconds);
}

void ServerMetrics::request_done(const RequestResult& r, double seconds) {
  std::lock_guard lk(mu_);
  e2e_.observe(seconds);
  prompt_tokens_ += r.report.prompt_tokens;
  computed_tokens_ += r.report.computed_tokens;
  reused_tokens_ += r.report.reused_tokens;
  generated_tokens_ += static_cast<int64_t>(r.tokens.size());
  for (int t = 0; t < RadixIndex::kTiers; ++t) reused_from_[t] += r.report.reused_from[t];
}

void ServerMetrics::response(int http_status) {
  std::lock_guard lk(mu_);
  ++responses_[http_status];
}

std::string ServerMetrics::render(const EngineSnapshot& e) const {
  std::string out;
  std::lock_guard lk(mu_);
  ttft_.render(out, "depcache_time_to_first_token_seconds",
               "Time from a request's arrival to its first token.");
  e2e_.render(out, "depcache_request_duration_seconds", "Time from a request's arrival to its last token.");
  search_.render(out, "depcache_search_seconds", "Corpus searches: from the first stage to the final list.");
  non_overlapped_.render(out, "depcache_search_non_overlapped_seconds",
                         "Corpus search time before the prefill that answered was submitted.");
  metric(out, "depcache_speculative_prefills_total", "counter",
         "Speculative prefills started from an intermediate search result.", speculations_);
  metric(out, "depcache_speculative_prefills_discarded_total", "counter",
         "Speculative prefills stopped because the search's list changed.", discarded_);
  metric(out, "depcache_speculations_accepted_total", "counter",
         "Searches whose final list was the one being speculated on.", accepted_);
  itl_.render(out, "depcache_inter_token_seconds", "Time between consecutive tokens of a request.");
  metric(out, "depcache_prompt_tokens_total", "counter", "Prompt tokens of ended requests.", prompt_tokens_);
  metric(out, "depcache_computed_tokens_total", "counter",
         "Prompt tokens run through the model (prompt = computed + reused, except "
         "that a reused token recomputed counts in both).",
         computed_tokens_);
  metric(out, "depcache_reused_tokens_total", "counter", "Prompt tokens placed from the KV index.",
         reused_tokens_);
  metric(out, "depcache_generated_tokens_total", "counter", "Tokens generated.", generated_tokens_);
  header(out, "depcache_reused_tokens_by_tier_total", "counter",
         "Reused prompt tokens by the tier their KV was found in, each once; they sum to "
         "depcache_reused_tokens_total (hit rate by tier: divide by prompt tokens).");
  for (int t = 0; t < RadixIndex::kTiers; ++t)
    out += fmt::format("depcache_reused_tokens_by_tier_total{{tier=\"{}\"}} {}\n", kTierNames[t],
                       reused_from_[t]);
  header(out, "depcache_http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [status, n] : responses_)
    out += fmt::format("depcache_http_responses_total{{code=\"{}\"}} {}\n", status, n);
  header(out, "depcache_requests_total", "counter", "Requests the engine ended, by outcome.");
  out += fmt::format("depcache_requests_total{{outcome=\"finished\"}} {}\n", e.finished);
  out += fmt::format("depcache_requests_total{{outcome=\"cancelled\"}} {}\n", e.cancelled);
  out += fmt::format("depcache_requests_total{{outcome=\"failed\"}} {}\n", e.failed);
  metric(out, "depcache_requests_waiting", "gauge", "Requests queued for admission.", e.waiting);
  metric(out, "depcache_requests_running", "gauge", "Sequences prefilling or decoding.", e.running);
  metric(out, "depcache_kv_pool_rows", "gauge", "Rows of the KV pool.", e.pool_rows);
  metric(out, "depcache_kv_pool_free_rows", "gauge", "Free rows of the KV pool.", e.pool_free);
  metric(out, "depcache_kv_pinned_nodes", "gauge", "Index nodes pinned by requests in flight.",
         e.pinned_nodes);
  metric(out, "depcache_preemptions_total", "counter", "Sequences preempted when the KV pool ran out.",
         e.preemptions);
  metric(out, "depcache_engine_steps_total", "counter", "Batched forward passes.", e.steps);
  header(out, "depcache_kv_tier_bytes", "gauge", "Bytes of cached KV by tier.");
  for (int t = 0; t < RadixIndex::kTiers - 1; ++t)
    out += fmt::format("depcache_kv_tier_bytes{{tier=\"{}\"}} {}\n", kTierNames[t], e.tier_bytes[t]);
  header(out, "depcache_index_hit_tokens_total", "counter",
         "Tokens matched in the KV index by tier found in, per lookup (a token several lookups of a "
         "request match counts in each).");
  for (int t = 0; t < RadixIndex::kTiers; ++t)
    out += fmt::format("depcache_index_hit_tokens_total{{tier=\"{}\"}} {}\n", kTierNames[t],
                       e.index.hit_tokens[t]);
  metric(out, "depcache_index_load_seconds_total", "counter",
         "Time matches spent bringing K/V from lower tiers (layer-wise preload: the layers read first).",
         e.index.load_ms / 1000.0);
  metric(out, "depcache_layered_loads_total", "counter",
         "Spans read from disk layer by layer while computing.", e.index.layered_loads);
  metric(out, "depcache_layer_wait_seconds_total", "counter",
         "Time passes waited for layers still being read (the part of the reads not hidden).",
         e.index.layer_wait_ms / 1000.0);
  metric(out, "depcache_index_bad_records_dropped_total", "counter",
         "Disk or remote records found corrupt and dropped (their tokens recomputed).", e.index.dropped_bad);
  header(out, "depcache_tier_records_rejected_total", "counter",
         "Disk or remote records refused (tokens recomputed), by reason: mac (a tag failed: forged, damaged "
         "or another key), shape (not this model's layers, row size or dtype), other (malformed or not the "
         "span asked for).");
  for (int t = 0; t < 2; ++t)
    for (int r = 0; r < kRejectReasons; ++r)
      out += fmt::format("depcache_tier_records_rejected_total{{tier=\"{}\",reason=\"{}\"}} {}\n",
                         t == RadixIndex::kRejectDisk ? "disk" : "remote", reject_reason_name(r),
                         e.index.rejected[t][r]);
  return out;
}

}  // namespace depcache

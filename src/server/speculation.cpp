#include "server/speculation.h"

#include <thread>

#include "retrieval/retriever.h"

namespace depcache {
namespace {

std::vector<uint32_t> ids_of(const std::vector<ChunkHit>& hits) {
  std::vector<uint32_t> ids;
  for (const ChunkHit& h : hits) ids.push_back(h.chunk);
  return ids;
}

}  // namespace

SpeculativeSearch::SpeculativeSearch(EngineLoop& loop, const ChunkIndex& corpus, SpeculationOptions options)
    : loop_(loop), corpus_(corpus), options_(options) {}

bool SpeculativeSearch::take_slot() {
  size_t n = in_flight_.load();
  while (n < options_.max_prefill_bs)
    if (in_flight_.compare_exchange_weak(n, n + 1)) return true;
  return false;
}

SpeculativeSearch::Submitted SpeculativeSearch::submit(std::string_view question, size_t top_k,
                                                       const PromptOf& prompt, const std::string& strategy,
                                                       const SamplingParams& sampling) {
  Submitted out;
  RetrievalReport& report = out.report;
  const auto t0 = Clock::now();
  const bool speculate = options_.speculate && options_.stages >= 2;
  SamplingParams speculative = sampling;
  speculative.prefill_piece_tokens = options_.piece_tokens;

  // The speculation in flight: its stream, its list, when it was submitted.
  std::shared_ptr<RequestStream> spec;
  std::vector<uint32_t> spec_ids;
  Clock::time_point spec_at{};
  const auto stop_speculation = [&] {
    if (!spec) return;
    loop_.cancel(spec);
    give_slot();
    ++report.discarded;
    spec.reset();
    spec_ids.clear();
  };

  std::vector<ChunkHit> final_hits;
  try {
    final_hits = corpus_.search_staged(
        question, top_k, options_.stages,
        [&](const SearchStage& stage) {
          if (options_.stage_latency.count() > 0) std::this_thread::sleep_for(options_.stage_latency);
          report.stages = stage.n_stages;
          if (!speculate || stage.stage + 1 == stage.n_stages) return true;  // the last is the final list
          const std::vector<ChunkHit> hits = to_hits(stage.top);
          const std::vector<uint32_t> ids = ids_of(hits);
          if (spec && ids == spec_ids) return true;
          stop_speculation();
          if (ids.empty() || !take_slot()) return true;
          PromptParts parts;
          try {
            parts = prompt(request_documents(corpus_, hits));
          } catch (...) {
            give_slot();  // a list the caller refuses is not speculated on
            return true;
          }
          spec = loop_.submit(strategy, std::move(parts), speculative);
          spec_ids = ids;
          spec_at = Clock::now();
          ++report.speculations;
          return true;
        },
        options_.order);
  } catch (...) {
    stop_speculation();
    throw;
  }
  const auto searched = Clock::now();
  report.search_ms = std::chrono::duration<double, std::milli>(searched - t0).count();
  out.documents = request_documents(corpus_, final_hits);
  if (spec && ids_of(final_hits) == spec_ids) {
    give_slot();
    report.accepted = true;
    loop_.set_prefill_piece_tokens(spec, sampling.prefill_piece_tokens);  // confirmed: no longer held back
    report.non_overlapped_ms = std::chrono::duration<double, std::milli>(spec_at - t0).count();
    out.stream = std::move(spec);
  } else {
    stop_speculation();
    PromptParts parts = prompt(out.documents);  // may throw: nothing is in flight any more
    report.non_overlapped_ms = report.search_ms;
    out.stream = loop_.submit(strategy, std::move(parts), sampling);
  }
  report.decided = Clock::now();
  return out;
}

}  // namespace depcache

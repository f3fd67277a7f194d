#pragma once
// Dynamic speculative pipelining (RAGCache): a request's corpus search runs
// in stages on the caller's thread while the engine computes. Each stage's
// top-k that differs from the one being prefilled stops that speculative
// prefill (the engine loop applies the cancel between steps, after the
// current iteration; speculations go in small pieces so that is soon, and
// a prefill stopped midway leaves what it computed in the index) and starts
// one for the new list, when fewer than
// max_prefill_bs speculative prefills are in flight over every request. When
// the search ends, the speculation is kept only if its ordered document list
// equals the final one; otherwise it is stopped and the final prompt is
// submitted, reusing whatever the index holds by then (the knowledge tree
// keeps the documents of speculations that finished their prefill, so the
// longest common document prefix is not computed again). The caller reads
// the stream only once the search has decided, so tokens of a speculation
// are held back until it is confirmed and those of a discarded one are
// never seen. With speculation off it is the server's plain search: the
// same stages and latency, then the prefill.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine_loop.h"
#include "prompt/prompt_parts.h"
#include "retrieval/corpus.h"
#include "retrieval/rag_request.h"
#include "util/timing.h"

namespace depcache {

struct SpeculationOptions {
  size_t stages = 1;  // of the search (Bm25Index::search_staged)
  // On MuSiQue and HotpotQA top-2 the list settles earlier by documents
  // (docs/ragcache.md, "Speculative pipelining").
  StageOrder order = StageOrder::Documents;
  // Off (or one stage): the whole search, then the prefill.
  bool speculate = false;
  size_t max_prefill_bs = 4;  // speculative prefills in flight at once, over every request
  // Prompt tokens a speculative prefill computes per engine step: a stop
  // takes effect after the current step, which on a CPU is long (a 512-token
  // step of qwen2-0.5b takes about a second), so speculations go in small
  // pieces (0: the step's whole budget).
  int64_t piece_tokens = 64;
  // Added to every stage: stands for a retriever slower than BM25 over an
  // in-memory corpus (a remote vector database), whose time speculation hides.
  std::chrono::microseconds stage_latency{0};
};

// How one request's search and prefill overlapped.
struct RetrievalReport {
  double search_ms = 0;  // from the first stage to the final list
  // Search time during which nothing of the answer was computed: until the
  // prefill that answered was submitted (search_ms when it was the final one).
  double non_overlapped_ms = 0;
  int speculations = 0;   // speculative prefills started
  int discarded = 0;      // of them, stopped because the list changed
  bool accepted = false;  // the answer came from a speculative prefill
  size_t stages = 0;
  // When the search decided: tokens are not delivered before it.
  Clock::time_point decided{};
};

class SpeculativeSearch {
 public:
  // The loop and the corpus must outlive it.
  SpeculativeSearch(EngineLoop& loop, const ChunkIndex& corpus, SpeculationOptions options);

  // The prompt for a list of documents; may throw to refuse it (an
  // intermediate list it refuses is not speculated on; a refused final list
  // ends the call with that exception, after stopping any speculation).
  using PromptOf = std::function<PromptParts(const std::vector<RequestDocument>&)>;
  struct Submitted {
    std::shared_ptr<RequestStream> stream;
    std::vector<RequestDocument> documents;  // the final top-k
    RetrievalReport report;
  };
  // Runs the search on the calling thread and returns the stream that
  // answers, as EngineLoop::submit would.
  Submitted submit(std::string_view question, size_t top_k, const PromptOf& prompt,
                   const std::string& strategy, const SamplingParams& sampling);

  const SpeculationOptions& options() const { return options_; }
  size_t in_flight() const { return in_flight_.load(); }

 private:
  bool take_slot();
  void give_slot() { in_flight_.fetch_sub(1); }

  EngineLoop& loop_;
  const ChunkIndex& corpus_;
  SpeculationOptions options_;
  std::atomic<size_t> in_flight_{0};
};

}  // namespace depcache

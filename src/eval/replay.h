#pragma once
// A request stream replayed through an engine, as `run` measures it: each
// request enters at its arrival time (open loop) or when the one before it
// is done (serial), after an optional unmeasured warm-up; per request, what
// it cost and gave (TTFT and end-to-end latency from its arrival, its
// prefill report, its output), checked against its prompt computed alone
// (verify) and against full attention's answer (fidelity).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "eval/fidelity.h"
#include "prompt/prompt_parts.h"
#include "retrieval/rag_request.h"

namespace depcache {

// Full attention's answer to a request (--fidelity): what every strategy is
// compared with.
struct FullAnswer {
  std::vector<float> first_logits;
  std::vector<int32_t> tokens;
  bool finite = true;  // every logits row of it
};

struct RequestRow {
  std::string id;
  double ttft_ms = 0, total_ms = 0;
  PrefillReport report;
  std::vector<int32_t> output;
  double logit_diff = -1;  // --verify: max |logit - logit without reuse| (+inf: not finite)
  bool top1_agrees = true;
  bool finite = true;  // every logit of the request was finite
  // What the index could not keep while serving this request.
  int64_t oversized_spans = 0;        // spans larger than a tier's budget
  int64_t disk_write_failures = 0;    // spans the disk tier failed to write
  std::optional<Fidelity> fidelity;   // --fidelity: against full attention
  std::optional<std::string> answer;  // what the output answers, for requests with reference answers
  bool exact_match = false;
  double f1 = 0;
};

struct StrategyRun {
  std::string name;
  std::vector<RequestRow> rows;
  size_t cached_bytes = 0;
  int64_t evicted = 0;
  RadixIndex::Stats stats;
  bool tiered = false;
  int64_t prefetched = 0;  // tokens the prefetcher brought to the hot tier
  int64_t pool_rows = 0, preemptions = 0;
  double wall_s = 0;  // from the start of the replay to the last token
};

// Progress of a loop over requests on stderr: in place on a terminal, else a
// line per tenth.
class Progress {
 public:
  Progress(std::string label, size_t total)
      : label_(std::move(label)), total_(total), tty_(isatty(fileno(stderr)) != 0) {}
  void step(size_t done) {
    if (tty_) {
      fmt::print(stderr, "\r[{}] {}/{} requests", label_, done, total_);
      if (done == total_) fmt::print(stderr, "\n");
    } else if (done == total_ || done % std::max<size_t>(1, total_ / 10) == 0) {
      fmt::print(stderr, "[{}] {}/{} requests\n", label_, done, total_);
    }
  }

 private:
  std::string label_;
  size_t total_;
  bool tty_;
};

struct ReplayOptions {
  int max_tokens = 1;   // greedy tokens per request, exactly (no stop at an end of generation)
  bool serial = false;  // each request enters when the one before it is done
  bool verify = false;  // each request again alone (CacheUse::None): the largest logit difference
};

// Replays reqs (their arrival_s; parts[i] is reqs[i]'s prompt) on `engine`
// under `strategy`, after serving `warmup` one at a time; `label` names the
// run in progress lines. full: full attention's answers, compared with
// (fidelity). The run's index figures are read at the end.
StrategyRun replay(Engine& engine, const std::string& label, std::string_view strategy,
                   const std::vector<RagRequest>& reqs, const std::vector<PromptParts>& parts,
                   const ReplayOptions& o, const std::vector<FullAnswer>* full = nullptr,
                   const std::vector<PromptParts>* warmup = nullptr);

// Full attention over the flat prompt of every request, n greedy tokens
// each, on an engine of its own (options: pool, KV type, threads).
std::vector<FullAnswer> full_answers(const std::shared_ptr<const Model>& model, EngineOptions options,
                                     const std::vector<PromptParts>& parts, int n);

// Each request with reference answers: what its output answers, exact match
// and token F1 (eval/answers.h).
void score_answers(StrategyRun& run, const std::vector<RagRequest>& reqs, const Tokenizer& tok);

// Per request of a run, TTFT in ms.
std::vector<double> ttfts(const StrategyRun& run);

}  // namespace depcache

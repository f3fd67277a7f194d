#include "eval/replay.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "eval/answers.h"
#include "util/error.h"
#include "util/numeric.h"
#include "util/timing.h"

namespace depcache {
namespace {

RadixIndex::Stats stats_of(const RadixIndex& index) {
  const auto lk = index.lock();  // the prefetcher may be moving spans
  return index.stats();
}

// Served before the stream, one at a time and unmeasured: what they leave
// in the caches (and, for cachecraft, the variants' metadata) is what the
// stream starts from.
void serve_warmup(Engine& engine, const std::string& label, std::string_view strategy,
                  const std::vector<PromptParts>& warmup, const SamplingParams& sampling) {
  Progress warming(label + " warm-up", warmup.size());
  size_t n = 0;
  for (const PromptParts& p : warmup) {
    const RequestId id = engine.submit(strategy, p, sampling);
    engine.run_until_idle();
    if (engine.result(id).state != RequestState::Finished)
      fail(ErrorKind::Internal, "a warm-up request did not finish: {}", engine.result(id).error);
    engine.forget(id);
    warming.step(++n);
  }
}

struct Served {
  std::vector<RequestId> ids;
  std::vector<Clock::time_point> arrived;  // where each request's latencies count from
  double wall_s = 0;
};

// Open-loop replay: a request enters at its arrival time (or, --serial,
// when the one before it is done), and its latencies count from then. What
// the index could not keep is charged to the rows of the requests whose
// prefill finished when it happened.
Served serve_stream(Engine& engine, const std::string& label, std::string_view strategy,
                    const std::vector<RagRequest>& reqs, const std::vector<PromptParts>& parts,
                    const ReplayOptions& o, const SamplingParams& sampling, std::vector<RequestRow>& rows) {
  const RadixIndex& index = engine.index();
  Served out{std::vector<RequestId>(reqs.size(), 0), std::vector<Clock::time_point>(reqs.size()), 0};
  Progress progress(label, reqs.size());
  size_t done = 0;
  RadixIndex::Stats last = stats_of(index);
  const auto on_token = [&](size_t i) {
    return [&, i](const TokenEvent& e) {
      if (e.index == 0) {
        const RadixIndex::Stats now = stats_of(index);
        for (int t = 0; t < RadixIndex::kTiers; ++t)
          rows[i].oversized_spans += now.oversized[t] - last.oversized[t];
        rows[i].disk_write_failures = now.disk_write_failures - last.disk_write_failures;
        last = now;
      }
      if (e.last) progress.step(++done);
    };
  };
  const auto start = Clock::now();
  size_t next = 0;
  const auto submit = [&](size_t i) {
    out.arrived[i] = o.serial ? Clock::now()
                              : start + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(reqs[i].arrival_s));
    out.ids[i] = engine.submit(strategy, parts[i], sampling, on_token(i));
  };
  while (next < reqs.size() || engine.n_waiting() + engine.n_running() > 0) {
    if (o.serial) {
      if (engine.n_waiting() + engine.n_running() == 0) submit(next++);
    } else {
      const double now_s = seconds_since(start);
      while (next < reqs.size() && reqs[next].arrival_s <= now_s) submit(next++);
    }
    if (!engine.step() && next < reqs.size() && !o.serial) {
      const double wait_s = reqs[next].arrival_s - seconds_since(start);
      if (wait_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait_s, 0.05)));
    }
  }
  out.wall_s = seconds_since(start);
  return out;
}

// The same strategy without reuse: its prompt computed alone, its logits
// against the row's.
void verify_against_no_reuse(Engine& engine, std::string_view strategy, const PromptParts& parts,
                             RequestRow& row) {
  SamplingParams first;
  first.max_tokens = 1;
  const RequestId alone = engine.submit(strategy, parts, first, {}, CacheUse::None);
  const PrefillReport ref = engine.wait(alone).report;
  engine.forget(alone);
  row.logit_diff =
      max_abs_difference(std::span<const float>(ref.logits), std::span<const float>(row.report.logits));
  row.top1_agrees = row.finite && argmax(ref.logits) == row.output.front();
}

// A finished request's row: its report, output and latencies, and with
// `full` its fidelity to full attention's answer.
void fill_row(const RequestResult& r, const RagRequest& req, Clock::time_point arrived,
              const FullAnswer* full, RequestRow& row) {
  if (r.state != RequestState::Finished)
    fail(ErrorKind::Internal, "request {} did not finish: {}", req.id, r.error);
  row.id = req.id;
  row.report = r.report;
  row.output = r.tokens;
  row.finite = r.finite;
  row.ttft_ms = std::chrono::duration<double, std::milli>(r.first_token - arrived).count();
  row.total_ms = std::chrono::duration<double, std::milli>(r.done - arrived).count();
  if (full) {
    row.fidelity = compare_to_full(full->first_logits, full->tokens, row.report.logits, row.output);
    if (!row.finite || !full->finite) *row.fidelity = Fidelity{false, INFINITY, false, 0.0};
  }
}

}  // namespace

StrategyRun replay(Engine& engine, const std::string& label, std::string_view strategy,
                   const std::vector<RagRequest>& reqs, const std::vector<PromptParts>& parts,
                   const ReplayOptions& o, const std::vector<FullAnswer>* full,
                   const std::vector<PromptParts>* warmup) {
  const RadixIndex& index = engine.index();
  SamplingParams sampling;
  sampling.max_tokens = o.max_tokens;
  sampling.stop_at_eog = false;  // exactly -n tokens, for comparable figures
  if (warmup != nullptr && !warmup->empty()) serve_warmup(engine, label, strategy, *warmup, sampling);
  StrategyRun run{label, {}, 0, 0, {}, false};
  run.rows.resize(reqs.size());
  const Served served = serve_stream(engine, label, strategy, reqs, parts, o, sampling, run.rows);
  run.wall_s = served.wall_s;

  for (size_t i = 0; i < reqs.size(); ++i) {
    fill_row(engine.result(served.ids[i]), reqs[i], served.arrived[i], full ? &(*full)[i] : nullptr,
             run.rows[i]);
    if (o.verify) verify_against_no_reuse(engine, strategy, parts[i], run.rows[i]);
  }
  run.prefetched = engine.prefetched_tokens();
  run.pool_rows = engine.pool().n_rows();
  run.preemptions = engine.preemptions();
  run.cached_bytes = index.bytes();
  run.evicted = index.n_evicted();
  run.stats = index.stats();
  return run;
}

std::vector<FullAnswer> full_answers(const std::shared_ptr<const Model>& model, EngineOptions options,
                                     const std::vector<PromptParts>& parts, int n) {
  options.cache_bytes = 0;
  Engine engine(model, options);
  SamplingParams sampling;
  sampling.max_tokens = n;
  sampling.stop_at_eog = false;
  Progress progress("full attention, for fidelity", parts.size());
  std::vector<FullAnswer> out;
  for (size_t i = 0; i < parts.size(); ++i) {
    const RequestId id = engine.submit("full", parts[i], sampling);
    const RequestResult& r = engine.wait(id);
    out.push_back({r.report.logits, r.tokens, r.finite});
    engine.forget(id);
    progress.step(i + 1);
  }
  return out;
}

void score_answers(StrategyRun& run, const std::vector<RagRequest>& reqs, const Tokenizer& tok) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].answers.empty()) continue;
    RequestRow& row = run.rows[i];
    row.answer = generated_answer(tok, row.output);
    row.exact_match = answer_matches(*row.answer, reqs[i].answers);
    row.f1 = answer_f1(*row.answer, reqs[i].answers);
  }
}

std::vector<double> ttfts(const StrategyRun& run) {
  std::vector<double> t;
  for (const RequestRow& r : run.rows) t.push_back(r.ttft_ms);
  return t;
}

}  // namespace depcache

#include "eval/fusion_check.h"

#include <algorithm>
#include <cstddef>

#include "eval/replay.h"
#include "prompt/prompt_parts.h"
#include "util/error.h"

namespace depcache {
namespace {

FusionAgreement agreement(const StrategyRun& run) {
  FusionAgreement a;
  for (const RequestRow& row : run.rows) {
    if (!row.fidelity) fail(ErrorKind::Internal, "fusion check: a request has no fidelity figures");
    a.first_token += row.fidelity->first_token_agrees ? 1 : 0;
    a.identical += row.fidelity->identical ? 1 : 0;
    a.kl += row.fidelity->kl_first_token;
  }
  if (!run.rows.empty()) a.kl /= static_cast<double>(run.rows.size());
  return a;
}

}  // namespace

bool FusionCheck::fused_worse() const {
  if (fused.first_token != plain.first_token) return fused.first_token < plain.first_token;
  return fused.identical < plain.identical;
}

FusionCheck check_fusion(const std::shared_ptr<const Model>& model, const EngineOptions& engine,
                         const std::vector<RagRequest>& stream, const Tokenizer& tok,
                         const ChunkFusionOptions& fusion, const FusionCheckOptions& options) {
  FusionCheck c;
  const std::vector<RagRequest> sample(
      stream.begin(),
      stream.begin() + static_cast<std::ptrdiff_t>(std::min(options.requests, stream.size())));
  c.requests = sample.size();
  if (sample.empty()) return c;
  std::vector<PromptParts> parts;
  for (const RagRequest& r : sample) parts.push_back(make_prompt_parts(tok, r, model->config().prompt));
  const std::vector<FullAnswer> full = full_answers(model, engine, parts, options.tokens);
  ReplayOptions ro;
  ro.max_tokens = options.tokens;
  ro.serial = true;
  // The sample's chunks fused as the whole stream's will be: after their
  // neighbours among the stream's chunks unless a pool was given.
  ChunkFusionOptions fo = fusion;
  fo.limit = 0;
  if (fo.neighbour_pool.empty()) fo.neighbour_pool = stream;
  {
    Engine fused(model, engine);
    fuse_chunks(fused, *model, engine.kv_type, sample, tok, fo);
    c.fused = agreement(replay(fused, "fusion check: fused", "fusionrag", sample, parts, ro, &full));
  }
  Engine plain(model, engine);
  c.plain = agreement(replay(plain, "fusion check: plain", "fusionrag", sample, parts, ro, &full));
  return c;
}

}  // namespace depcache

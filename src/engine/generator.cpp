#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "exec/forward.h"
#include "util/error.h"
#include "util/timing.h"

namespace depcache {
GenerateResult generate(Forward& fwd, KvAssembly& kv, const std::vector<int32_t>& prompt,
                        const GenerateOptions& opts, const std::function<bool(int32_t)>& on_token) {
  if (prompt.empty()) fail(ErrorKind::InvalidInput, "the prompt is empty (no tokens to condition on)");
  if (opts.n_predict < 0) fail(ErrorKind::InvalidInput, "n_predict must be >= 0");
  const int64_t needed = kv.n_past() + static_cast<int64_t>(prompt.size()) + opts.n_predict;
  if (needed > kv.n_ctx())
    fail(ErrorKind::LimitExceeded,
         "prompt of {} tokens plus {} to generate needs a context of {}, but it is {}", prompt.size(),
         opts.n_predict, needed, kv.n_ctx());

  GenerateResult r;
  r.n_prompt = static_cast<int64_t>(prompt.size());
  Sampler sampler(opts.sampler);
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  fwd.eval(prompt, kv, Logits::Last, logits);
  r.prompt_ms = ms_since(t0);
  if (opts.n_predict == 0) {
    r.ttft_ms = r.prompt_ms;
    return r;
  }
  for (int i = 0; i < opts.n_predict; ++i) {
    const int32_t id = sampler.sample(logits);
    if (i == 0) r.ttft_ms = ms_since(t0);
    r.tokens.push_back(id);
    const bool eog = std::find(opts.eog_ids.begin(), opts.eog_ids.end(), id) != opts.eog_ids.end();
    if (on_token && !on_token(id)) break;
    if (opts.stop_at_eog && eog) break;
    if (i + 1 == opts.n_predict) break;
    fwd.eval(std::span<const int32_t>(&id, 1), kv, Logits::Last, logits);
  }
  r.decode_ms = ms_since(t0) - r.ttft_ms;
  return r;
}

}  // namespace depcache

#pragma once
// Prompt in, tokens out: prefill the prompt in one batch, then decode one
// token at a time until n_predict tokens or an end-of-generation token.
#include <cstdint>
#include <functional>
#include <vector>

#include "compute/dtype.h"
#include "compute/sampling.h"

namespace depcache {

class Forward;
class KvAssembly;

struct GenerateOptions {
  int n_predict = 64;
  SamplerParams sampler;
  bool stop_at_eog = true;
  std::vector<int32_t> eog_ids;  // end-of-generation tokens (EOS, EOT)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (the prompt excluded)
  int64_t n_prompt = 0;
  double prompt_ms = 0;  // prefill wall time
  double ttft_ms = 0;    // prefill + sampling the first token
  double decode_ms = 0;  // time for tokens after the first
};

// `kv` must be empty or hold a prefix already evaluated; on_token sees each
// id as soon as it is sampled and may return false to stop.
GenerateResult generate(Forward& fwd, KvAssembly& kv, const std::vector<int32_t>& prompt,
                        const GenerateOptions& opts, const std::function<bool(int32_t)>& on_token);

}  // namespace depcache

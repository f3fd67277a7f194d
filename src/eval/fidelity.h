#pragma once
// Fidelity to full attention: how close a strategy's answer is to the one
// full prefill of the flat prompt gives. Reuse that is exact against itself
// (dependency attention, chunk reuse) can still change the attention pattern
// and so the answer; this is the measurement every approximate strategy
// reports against.
#include <cstdint>
#include <span>
#include <vector>

#include "exec/kv_assembly.h"

namespace depcache {

struct Fidelity {
  bool first_token_agrees = false;  // greedy first tokens equal
  double kl_first_token = 0;        // KL(full || strategy) of the first-token distributions, nats
  bool identical = false;           // the greedy continuations are equal token for token
  double rouge_l = 0;               // token ROUGE-L F1 of the continuations, in [0, 1]
};

// KL(softmax(p) || softmax(q)) in double, from logits; +inf when either holds
// a non-finite value or the lengths differ.
double kl_divergence_of_logits(std::span<const float> p, std::span<const float> q);

// ROUGE-L F1 of two token sequences: the longest common subsequence over
// their lengths (precision against `candidate`, recall against `reference`).
// 1 for two empty sequences.
double rouge_l(std::span<const int32_t> reference, std::span<const int32_t> candidate);

// first_logits: each side's logits of the first answer token; tokens: each
// side's greedy continuation (first token included). Non-finite logits on
// either side agree with nothing (KL +inf, ROUGE-L 0).
Fidelity compare_to_full(std::span<const float> full_first_logits, std::span<const int32_t> full_tokens,
                         std::span<const float> first_logits, std::span<const int32_t> tokens);

// Per layer, how far a strategy's K and V moved from full prefill's over the
// same prompt rows [0, n_rows) of two assemblies of the same flat prompt:
// ||got - full|| / ||full|| over those rows (Frobenius). +inf where a value
// is not finite.
struct LayerDeviation {
  double k = 0, v = 0;
};
std::vector<LayerDeviation> kv_deviation(const KvAssembly& full, const KvAssembly& got, int64_t n_rows);

}  // namespace depcache

#pragma once
// A float64 forward pass written for clarity, not speed: every weight is
// dequantized with the float64 reference and every sum is in double. The
// engine is checked against it.
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace depcache::test {

// Logits (n_tokens x n_vocab) for every position of `tokens`, causal.
std::vector<double> reference_logits(const Model& model, const std::vector<int32_t>& tokens);

}  // namespace depcache::test

#pragma once
// Whether a generated answer is right: exact match and token F1 against the
// reference answers of a request.
#include <cstdint>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace depcache {

// What a generated continuation answers: its text up to the first
// end-of-generation token or newline, without surrounding spaces.
std::string generated_answer(const Tokenizer& tok, const std::vector<int32_t>& tokens);
// The same for a continuation received as text (a server's answer, which
// ends at its end-of-generation token): up to the first newline, without
// surrounding spaces.
std::string answer_of_text(std::string text);

// Exact match: the generated answer equals one of the reference answers.
bool answer_matches(const std::string& generated, const std::vector<std::string>& answers);

// Token F1 against the best-matching reference answer, SQuAD-style: both
// lower-cased, punctuation and the articles a/an/the dropped, split at
// white space, F1 of the bags of words. 1 when both are empty, 0 when one is.
double answer_f1(const std::string& generated, const std::vector<std::string>& answers);

}  // namespace depcache

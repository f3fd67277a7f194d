#pragma once
// Text normalisation shared by entity linking, BM25 and path ranking, so that a
// name, a question and a passage are compared in the same vocabulary.
#include <string>
#include <string_view>
#include <vector>

namespace depcache {

// Lower-cases ASCII, turns every ASCII character that is not a letter or digit
// (underscores, hyphens, punctuation, whitespace) into one space, trims.
// Bytes >= 0x80 (UTF-8) are kept as word characters. "Canis_familiaris" and
// "canis familiaris" normalise to the same string.
std::string normalize_text(std::string_view text);

// The words of normalize_text(text), in order, with duplicates.
std::vector<std::string> split_words(std::string_view text);

// True for the short English function words ("the", "of", "what", ...) that
// carry no retrieval signal.
bool is_stopword(std::string_view word);

// split_words without stopwords: the terms BM25 and TF-IDF index.
std::vector<std::string> index_terms(std::string_view text);

}  // namespace depcache

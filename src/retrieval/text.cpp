#include "retrieval/text.h"

#include <algorithm>
#include <array>

namespace depcache {

std::string normalize_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool pending_space = false;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
    if (!word) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : static_cast<char>(c);
  }
  return out;
}

std::vector<std::string> split_words(std::string_view text) {
  const std::string norm = normalize_text(text);
  std::vector<std::string> words;
  size_t start = 0;
  while (start < norm.size()) {
    size_t end = norm.find(' ', start);
    if (end == std::string::npos) end = norm.size();
    words.emplace_back(norm.substr(start, end - start));
    start = end + 1;
  }
  return words;
}

bool is_stopword(std::string_view word) {
  // Sorted for binary search.
  static constexpr std::array<std::string_view, 64> kStopwords = {
      "a",    "about", "an",    "and",   "are",  "as",    "at",    "be",   "been", "but",  "by",
      "can",  "did",   "do",    "does",  "for",  "from",  "had",   "has",  "have", "he",   "her",
      "his",  "how",   "i",     "in",    "is",   "it",    "its",   "of",   "on",   "or",   "she",
      "that", "the",   "their", "them",  "then", "there", "they",  "this", "to",   "was",  "were",
      "what", "when",  "where", "which", "who",  "whom",  "whose", "why",  "will", "with", "would",
      "you",  "your",  "also",  "into",  "than", "these", "those", "been", "being"};
  static const std::vector<std::string_view> sorted = [] {
    std::vector<std::string_view> v(kStopwords.begin(), kStopwords.end());
    std::sort(v.begin(), v.end());
    return v;
  }();
  return std::binary_search(sorted.begin(), sorted.end(), word);
}

std::vector<std::string> index_terms(std::string_view text) {
  std::vector<std::string> words = split_words(text);
  std::erase_if(words, [](const std::string& w) { return is_stopword(w); });
  return words;
}

}  // namespace depcache

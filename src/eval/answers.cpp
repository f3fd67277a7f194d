#include "eval/answers.h"

#include <algorithm>
#include <cctype>
#include <iterator>

namespace depcache {

std::string generated_answer(const Tokenizer& tok, const std::vector<int32_t>& tokens) {
  std::vector<int32_t> kept;
  for (int32_t t : tokens) {
    if (tok.is_eog(t)) break;
    kept.push_back(t);
  }
  return answer_of_text(tok.decode(kept));
}

std::string answer_of_text(std::string text) {
  text = text.substr(0, text.find('\n'));
  const size_t begin = text.find_first_not_of(' ');
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(' ') - begin + 1);
}

bool answer_matches(const std::string& generated, const std::vector<std::string>& answers) {
  return std::find(answers.begin(), answers.end(), generated) != answers.end();
}

namespace {

std::vector<std::string> answer_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  const auto flush = [&] {
    if (!word.empty() && word != "a" && word != "an" && word != "the") words.push_back(word);
    word.clear();
  };
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isspace(c)) {
      flush();
    } else if (!std::ispunct(c)) {
      word.push_back(static_cast<char>(std::tolower(c)));
    }
  }
  flush();
  std::sort(words.begin(), words.end());
  return words;
}

}  // namespace

double answer_f1(const std::string& generated, const std::vector<std::string>& answers) {
  const std::vector<std::string> got = answer_words(generated);
  double best = 0;
  for (const std::string& answer : answers) {
    const std::vector<std::string> want = answer_words(answer);
    if (got.empty() || want.empty()) {
      best = std::max(best, got.empty() && want.empty() ? 1.0 : 0.0);
      continue;
    }
    std::vector<std::string> common;
    std::set_intersection(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(common));
    if (common.empty()) continue;
    const double precision = static_cast<double>(common.size()) / static_cast<double>(got.size());
    const double recall = static_cast<double>(common.size()) / static_cast<double>(want.size());
    best = std::max(best, 2 * precision * recall / (precision + recall));
  }
  return best;
}

}  // namespace depcache

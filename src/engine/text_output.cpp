#include "engine/text_output.h"

#include <algorithm>

namespace depcache {

TextOutput::TextOutput(const Tokenizer& tok, std::vector<std::string> stop)
    : decoder_(tok, false, /*starts_text=*/false) {
  for (std::string& s : stop)
    if (!s.empty()) stop_.push_back(std::move(s));
}

std::string TextOutput::emit(size_t n) {
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  text_ += out;
  return out;
}

std::string TextOutput::push(int32_t token) {
  if (stopped_) return {};
  pending_ += decoder_.push(token);
  return take(false);
}

std::string TextOutput::finish() {
  if (stopped_) return {};
  pending_ += decoder_.flush();
  return take(true);
}

std::string TextOutput::take(bool all) {
  // The earliest stop string ends the text where it begins.
  size_t first = std::string::npos;
  for (const std::string& s : stop_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = emit(first);
    pending_.clear();
    return out;
  }
  if (all) return emit(pending_.size());
  // Hold back the longest tail that begins some stop string.
  size_t hold = 0;
  for (const std::string& s : stop_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  return emit(pending_.size() - hold);
}

}  // namespace depcache

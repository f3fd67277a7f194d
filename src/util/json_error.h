#pragma once
// nlohmann's messages start with "[json.exception.parse_error.101] "; the rest
// (with line and column) is what a user needs.
#include <exception>
#include <string>
#include <string_view>

namespace depcache {

inline std::string json_error_message(const std::exception& e) {
  std::string_view m = e.what();
  if (!m.empty() && m.front() == '[') {
    const size_t close = m.find("] ");
    if (close != std::string_view::npos) m.remove_prefix(close + 2);
  }
  return std::string(m);
}

}  // namespace depcache

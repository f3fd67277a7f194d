#pragma once
// Errors that reach the user. Each kind maps to one CLI exit code, so scripts
// can tell a bad file from a bad flag from a resource limit.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace depcache {

enum class ErrorKind {
  InvalidInput = 3,   // malformed or unsupported file, request or text
  NotFound = 4,       // a named file, tensor or key is missing
  LimitExceeded = 5,  // context length, memory budget
  Unavailable = 6,    // a server did not answer, or failed requests
  Internal = 1,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(kind, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace depcache

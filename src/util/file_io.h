#pragma once
// Crash-safe file replacement, shared by everything the project writes that a
// reader may load later (KG files, request streams, cached spans).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace depcache {

struct WriteFailure {
  enum class Stage { Open, Write, Rename } stage;
  int error = 0;        // errno
  std::string message;  // what failed, naming the file
};

// Writes `bytes` to path + ".partial", fsyncs it, renames it over `path` and
// fsyncs the directory: readers and crashes see the old file or the new one,
// never half of one. On failure the partial file is removed and the reason
// returned.
std::optional<WriteFailure> write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

// An open file descriptor, closed when it goes.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Opens a file for reading (not ok() when it cannot be opened).
Fd open_read(const std::filesystem::path& path);
// Reads exactly n bytes at `offset`; false on an error or an early end of file.
bool read_exact_at(const Fd& fd, uint8_t* p, size_t n, uint64_t offset);

}  // namespace depcache

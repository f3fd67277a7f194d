#include "util/file_io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace depcache {

std::optional<WriteFailure> write_file_atomic(const std::filesystem::path& path, std::string_view bytes) {
  std::filesystem::path partial = path;
  partial += ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return WriteFailure{WriteFailure::Stage::Open, err,
                        fmt::format("cannot write {}: {}", partial.string(), std::strerror(err))};
  }
  const char* p = bytes.data();
  size_t left = bytes.size();
  int err = 0;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      err = errno;
      break;
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  std::error_code ec;
  if (err != 0) {
    std::filesystem::remove(partial, ec);
    return WriteFailure{
        WriteFailure::Stage::Write, err,
        fmt::format("writing {} failed: {} (disk full?)", partial.string(), std::strerror(err))};
  }
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    return WriteFailure{
        WriteFailure::Stage::Rename, ec.value(),
        fmt::format("cannot rename {} to {}: {}", partial.string(), path.string(), ec.message())};
  }
  // The rename itself must reach the disk before the file is counted on.
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return std::nullopt;
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd open_read(const std::filesystem::path& path) { return Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)); }

bool read_exact_at(const Fd& fd, uint8_t* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t r = ::pread(fd.get(), p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

}  // namespace depcache

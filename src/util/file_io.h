#pragma once
// Crash-safe file replacement, shared by everything the project writes that a
// reader may load later (KG files, request streams, cached spans).
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

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

}  // namespace depcache

#include "kv/disk_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <vector>

#include "util/error.h"
#include "util/file_io.h"
#include "util/hash.h"

namespace depcache {
namespace {

constexpr const char* kSuffix = ".kvspan";
constexpr const char* kPartial = ".kvspan.partial";

// Reads exactly n bytes; false on an error or an early end of file.
bool read_exact(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

std::optional<std::vector<uint8_t>> read_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::optional<std::vector<uint8_t>> buf;
  if (::fstat(fd, &st) == 0) {
    buf.emplace(static_cast<size_t>(st.st_size));
    if (!read_exact(fd, buf->data(), buf->size())) buf.reset();
  }
  ::close(fd);
  return buf;
}

}  // namespace

DiskSpanStore::DiskSpanStore(std::filesystem::path dir, size_t byte_budget)
    : dir_(std::move(dir)), budget_(byte_budget) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec || !std::filesystem::is_directory(dir_))
    fail(ErrorKind::InvalidInput, "cache directory {} cannot be created: {}", dir_.string(), ec.message());
  struct Found {
    std::filesystem::file_time_type time;
    uint64_t key;
    size_t bytes;
  };
  std::vector<Found> found;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > std::strlen(kPartial) && name.ends_with(kPartial)) {
      std::filesystem::remove(entry.path(), ec);  // an interrupted write
      continue;
    }
    if (name.size() != 16 + std::strlen(kSuffix) || !name.ends_with(kSuffix)) continue;  // not ours
    const std::string hex = name.substr(0, 16);
    if (!std::all_of(hex.begin(), hex.end(), [](unsigned char c) { return std::isxdigit(c) != 0; })) continue;
    const uint64_t key = std::strtoull(hex.c_str(), nullptr, 16);
    found.push_back({entry.last_write_time(ec), key, static_cast<size_t>(entry.file_size(ec))});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.time < b.time; });
  for (const Found& f : found) {
    lru_.push_back(f.key);
    files_[f.key] = {f.bytes, std::prev(lru_.end())};
    bytes_ += f.bytes;
  }
  while (bytes_ > budget_ && !lru_.empty()) forget(lru_.front(), true);
}

std::filesystem::path DiskSpanStore::path_of(uint64_t key) const {
  return dir_ / fmt::format("{:016x}{}", key, kSuffix);
}

void DiskSpanStore::forget(uint64_t key, bool delete_file) {
  const auto it = files_.find(key);
  if (it == files_.end()) return;
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  files_.erase(it);
  if (delete_file) {
    std::error_code ec;
    std::filesystem::remove(path_of(key), ec);
  }
}

void DiskSpanStore::touch(uint64_t key) {
  Entry& e = files_.at(key);
  lru_.erase(e.lru);
  lru_.push_back(key);
  e.lru = std::prev(lru_.end());
}

void DiskSpanStore::remove(uint64_t key) { forget(key, true); }

bool DiskSpanStore::put(uint64_t key, uint64_t ns, std::span<const int32_t> tokens, int64_t prefix,
                        const KvSpan& span) {
  const std::vector<uint8_t> buf = encode_span_record(key, ns, tokens, prefix, span);
  const size_t size = buf.size();
  forget(key, true);
  if (size > budget_) return false;
  // Make room first, so the budget holds even while the new file is written.
  while (bytes_ + size > budget_ && !lru_.empty()) forget(lru_.front(), true);
  // Disk full or gone: the span is simply not on disk (a cache tier degrades).
  if (write_file_atomic(path_of(key),
                        std::string_view(reinterpret_cast<const char*>(buf.data()), buf.size())))
    return false;
  lru_.push_back(key);
  files_[key] = {size, std::prev(lru_.end())};
  bytes_ += size;
  return true;
}

std::optional<KvSpan> DiskSpanStore::get(uint64_t key, uint64_t ns, std::span<const int32_t> tokens,
                                         int64_t prefix) {
  if (!files_.count(key)) return std::nullopt;
  const auto drop = [&]() -> std::optional<KvSpan> {
    ++n_dropped_;
    forget(key, true);
    return std::nullopt;
  };
  const std::optional<std::vector<uint8_t>> file = read_file(path_of(key));
  if (!file) return drop();
  DecodedSpan d = decode_span_record(*file, key, ns, tokens, prefix);
  if (d.status == RecordStatus::Corrupt) return drop();
  if (d.status == RecordStatus::Other) {
    // Another key's file under this name is foreign; the right key with other
    // tokens is a hash collision: not this span, but a sound file.
    if (decode_span_record_header(*file)->key != key) return drop();
    return std::nullopt;
  }
  touch(key);
  return std::move(d.span);
}

std::vector<DiskSpanStore::StoredSpan> DiskSpanStore::scan() {
  std::vector<StoredSpan> out;
  std::vector<uint64_t> bad;
  for (const auto& [key, entry] : files_) {
    const int fd = ::open(path_of(key).c_str(), O_RDONLY | O_CLOEXEC);
    std::vector<uint8_t> head(kSpanRecordHeader);
    std::optional<SpanRecordHeader> h;
    if (fd >= 0 && read_exact(fd, head.data(), head.size())) h = decode_span_record_header(head);
    if (h && h->key == key && h->size == entry.bytes) {
      head.resize(kSpanRecordHeader + 4 * static_cast<size_t>(h->n_tokens));
      if (read_exact(fd, head.data() + kSpanRecordHeader, head.size() - kSpanRecordHeader))
        out.push_back({key, h->ns, span_record_tokens(head, h->n_tokens), h->prefix});
      else
        h.reset();
    }
    if (fd >= 0) ::close(fd);
    if (!h) bad.push_back(key);
  }
  for (uint64_t key : bad) {
    ++n_dropped_;
    forget(key, true);
  }
  return out;
}

size_t DiskSpanStore::remove_orphans(const std::unordered_set<uint64_t>& live) {
  std::vector<uint64_t> dead;
  for (const auto& [key, entry] : files_)
    if (!live.count(key)) dead.push_back(key);
  for (uint64_t key : dead) forget(key, true);
  return dead.size();
}

}  // namespace depcache

#include "kv/disk_store.h"

#include <fcntl.h>
#include <fmt/format.h>
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

constexpr char kMagic[8] = {'D', 'K', 'V', 'S', 'P', 'A', 'N', '1'};
constexpr size_t kHeader = 64;
constexpr size_t kChecksumFrom = 16;  // the checksum covers everything after itself
constexpr const char* kSuffix = ".kvspan";
constexpr const char* kPartial = ".kvspan.partial";

template <typename T>
void put_at(std::vector<uint8_t>& buf, size_t at, T v) {
  std::memcpy(buf.data() + at, &v, sizeof v);
}
template <typename T>
T get_at(const std::vector<uint8_t>& buf, size_t at) {
  T v;
  std::memcpy(&v, buf.data() + at, sizeof v);
  return v;
}

size_t data_bytes(uint64_t n_layer, uint64_t row_elems, DType type, uint64_t n_tokens) {
  return static_cast<size_t>(n_layer * 2 * n_tokens * row_elems * (type == DType::F16 ? 2 : 4));
}

std::optional<std::vector<uint8_t>> read_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::vector<uint8_t> buf;
  uint8_t chunk[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, chunk, sizeof chunk);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      if (r < 0) return std::nullopt;
      return buf;
    }
    buf.insert(buf.end(), chunk, chunk + r);
  }
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

bool DiskSpanStore::put(uint64_t key, std::span<const int32_t> tokens, const KvSpan& span) {
  if (static_cast<int64_t>(tokens.size()) != span.n_tokens())
    fail(ErrorKind::Internal, "disk store: {} tokens for a span of {}", tokens.size(), span.n_tokens());
  const size_t n = tokens.size();
  const size_t size = kHeader + 8 * n + span.data().size();
  if (size > budget_) return false;
  std::vector<uint8_t> buf(size, 0);
  std::memcpy(buf.data(), kMagic, sizeof kMagic);
  put_at<uint64_t>(buf, 16, key);
  put_at<uint64_t>(buf, 24, size);
  put_at<uint32_t>(buf, 32, static_cast<uint32_t>(span.n_layer()));
  put_at<uint32_t>(buf, 36, static_cast<uint32_t>(span.type()));
  put_at<uint64_t>(buf, 40, static_cast<uint64_t>(span.row_elems()));
  put_at<uint64_t>(buf, 48, n);
  std::memcpy(buf.data() + kHeader, tokens.data(), 4 * n);
  std::memcpy(buf.data() + kHeader + 4 * n, span.positions().data(), 4 * n);
  if (!span.data().empty()) std::memcpy(buf.data() + kHeader + 8 * n, span.data().data(), span.data().size());
  put_at<uint64_t>(buf, 8, fnv1a64_bytes(buf.data() + kChecksumFrom, size - kChecksumFrom));

  forget(key, true);
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

std::optional<KvSpan> DiskSpanStore::get(uint64_t key, std::span<const int32_t> tokens) {
  if (!files_.count(key)) return std::nullopt;
  const auto drop = [&]() -> std::optional<KvSpan> {
    ++n_dropped_;
    forget(key, true);
    return std::nullopt;
  };
  const std::optional<std::vector<uint8_t>> file = read_file(path_of(key));
  if (!file) return drop();
  const std::vector<uint8_t>& buf = *file;
  if (buf.size() < kHeader || std::memcmp(buf.data(), kMagic, sizeof kMagic) != 0) return drop();
  if (get_at<uint64_t>(buf, 24) != buf.size()) return drop();  // truncated or extended
  if (get_at<uint64_t>(buf, 8) != fnv1a64_bytes(buf.data() + kChecksumFrom, buf.size() - kChecksumFrom))
    return drop();
  if (get_at<uint64_t>(buf, 16) != key) return drop();  // another key's file under this name
  const uint32_t n_layer = get_at<uint32_t>(buf, 32), type_id = get_at<uint32_t>(buf, 36);
  const uint64_t row_elems = get_at<uint64_t>(buf, 40), n = get_at<uint64_t>(buf, 48);
  const auto type = static_cast<DType>(type_id);
  if ((type != DType::F32 && type != DType::F16) || n_layer > 4096 || row_elems > (1u << 20) ||
      n > (1u << 26))
    return drop();
  if (buf.size() != kHeader + 8 * n + data_bytes(n_layer, row_elems, type, n)) return drop();
  // Same key, other tokens: a hash collision or a stale file; not this span.
  if (n != tokens.size() || std::memcmp(buf.data() + kHeader, tokens.data(), 4 * n) != 0) return std::nullopt;
  KvSpan span(static_cast<int>(n_layer), static_cast<int64_t>(row_elems), type, static_cast<int64_t>(n));
  std::memcpy(span.positions().data(), buf.data() + kHeader + 4 * n, 4 * n);
  if (!span.data().empty()) std::memcpy(span.data().data(), buf.data() + kHeader + 8 * n, span.data().size());
  touch(key);
  return span;
}

size_t DiskSpanStore::remove_orphans(const std::unordered_set<uint64_t>& live) {
  std::vector<uint64_t> dead;
  for (const auto& [key, entry] : files_)
    if (!live.count(key)) dead.push_back(key);
  for (uint64_t key : dead) forget(key, true);
  return dead.size();
}

}  // namespace depcache

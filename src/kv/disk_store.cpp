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

// A record's head (header and all before layer 0) from an open file whose
// size is `file_bytes`; nullopt when it is not a record of that size.
std::optional<std::vector<uint8_t>> read_head(const Fd& fd, uint64_t file_bytes) {
  std::vector<uint8_t> head(kSpanRecordHeader);
  if (!fd.ok() || !read_exact_at(fd, head.data(), head.size(), 0)) return std::nullopt;
  const std::optional<SpanRecordHeader> h = decode_span_record_header(head);
  if (!h || h->size != file_bytes) return std::nullopt;  // foreign, cut or extended
  head.resize(h->head_bytes());
  if (!read_exact_at(fd, head.data() + kSpanRecordHeader, head.size() - kSpanRecordHeader, kSpanRecordHeader))
    return std::nullopt;
  return head;
}

}  // namespace

DiskSpanStore::DiskSpanStore(std::filesystem::path dir, size_t byte_budget, std::shared_ptr<const MacKey> key)
    : dir_(std::move(dir)), budget_(byte_budget), key_(std::move(key)) {
  seal_.key = key_.get();
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
    const uint64_t stored = std::strtoull(hex.c_str(), nullptr, 16);
    const auto bytes = static_cast<size_t>(entry.file_size(ec));
    // A sealed file is named for its content key by a keyed hash: the key
    // is read back from what it holds (and must give the name).
    uint64_t key = stored;
    if (key_) {
      const std::optional<std::vector<uint8_t>> head = read_head(open_read(entry.path()), bytes);
      const std::optional<SpanRecordContents> c =
          head ? open_span_record_contents(*head, key_.get()) : std::nullopt;
      key = c ? span_content_key(c->ns, c->tokens) : 0;
      if (!c || stored_name(key_.get(), key) != stored) {
        std::filesystem::remove(entry.path(), ec);
        ++n_dropped_;
        ++n_rejected_[reject_index(c ? RecordStatus::Other : RecordStatus::Mac)];
        continue;
      }
    }
    found.push_back({entry.last_write_time(ec), key, bytes});
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
  return dir_ / fmt::format("{:016x}{}", stored_name(key_.get(), key), kSuffix);
}

void DiskSpanStore::forget(uint64_t key, bool delete_file) {
  {
    std::lock_guard lk(write_mu_);
    if (const auto p = pending_.find(key); p != pending_.end()) {
      p->second->cancelled = true;  // skipped if queued, its file deleted if under way
      if (p->second != writing_) {
        pending_bytes_ -= p->second->span.bytes();
        p->second->span = KvSpan();
        std::erase(writes_, p->second);
      }
      pending_.erase(p);
      written_cv_.notify_all();
    }
    failed_.erase(key);
  }
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
                        KvSpan span) {
  const size_t size = file_bytes(static_cast<int64_t>(tokens.size()), span);
  forget(key, true);
  if (size > budget_) return false;
  // Make room first, so the budget holds even while the new file is written.
  while (bytes_ + size > budget_ && !lru_.empty()) forget(lru_.front(), true);
  bool behind = false;
  {
    std::unique_lock lk(write_mu_);
    behind = writer_.joinable();
    if (behind) {
      // Room for it among the spans not yet written (one alone always fits).
      const size_t held = span.bytes();
      written_cv_.wait(lk,
                       [&] { return pending_bytes_ == 0 || pending_bytes_ + held <= max_pending_bytes_; });
      auto w = std::make_shared<Write>();
      w->key = key;
      w->ns = ns;
      w->tokens.assign(tokens.begin(), tokens.end());
      w->prefix = prefix;
      w->span = std::move(span);
      pending_bytes_ += held;
      pending_[key] = w;
      writes_.push_back(std::move(w));
    }
  }
  if (behind)
    write_cv_.notify_one();
  else if (!write_record(key, ns, tokens, prefix, span))
    return false;  // disk full or gone: the span is simply not on disk (a cache tier degrades)
  lru_.push_back(key);
  files_[key] = {size, std::prev(lru_.end())};
  bytes_ += size;
  return true;
}

bool DiskSpanStore::write_record(uint64_t key, uint64_t ns, std::span<const int32_t> tokens, int64_t prefix,
                                 const KvSpan& span) const {
  const std::vector<uint8_t> buf = encode_span_record(key, ns, tokens, prefix, span, seal_.key);
  return !write_file_atomic(path_of(key),
                            std::string_view(reinterpret_cast<const char*>(buf.data()), buf.size()));
}

DiskSpanStore::~DiskSpanStore() {
  {
    std::unique_lock lk(write_mu_);
    written_cv_.wait(lk, [&] { return writes_.empty() && !writing_; });
    stop_ = true;
  }
  write_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void DiskSpanStore::write_behind(size_t max_pending_bytes) {
  std::lock_guard lk(write_mu_);
  max_pending_bytes_ = max_pending_bytes;
  if (!writer_.joinable()) writer_ = std::thread([this] { write_loop(); });
}

void DiskSpanStore::flush() {
  std::unique_lock lk(write_mu_);
  written_cv_.wait(lk, [&] { return writes_.empty() && !writing_; });
}

int64_t DiskSpanStore::n_write_failures() const {
  std::lock_guard lk(write_mu_);
  return n_write_failures_;
}

void DiskSpanStore::write_loop() {
  std::unique_lock lk(write_mu_);
  for (;;) {
    write_cv_.wait(lk, [&] { return stop_ || !writes_.empty(); });
    if (writes_.empty()) return;  // stopping, nothing left
    writing_ = std::move(writes_.front());
    writes_.pop_front();
    const std::shared_ptr<Write> w = writing_;
    bool ok = true;
    if (!w->cancelled) {
      lk.unlock();
      ok = write_record(w->key, w->ns, w->tokens, w->prefix, w->span);  // off the caller's thread
      lk.lock();
    }
    if (w->cancelled && ok) {
      // Forgotten while it was written: no file may outlive its entry. A
      // newer write of the same key is queued behind this one, so it is
      // not the newer file that goes.
      std::error_code ec;
      std::filesystem::remove(path_of(w->key), ec);
    } else if (!ok && !w->cancelled) {
      ++n_write_failures_;
      failed_.insert(w->key);
    }
    pending_bytes_ -= w->span.bytes();
    if (const auto it = pending_.find(w->key); it != pending_.end() && it->second == w) pending_.erase(it);
    writing_.reset();
    written_cv_.notify_all();
  }
}

bool DiskSpanStore::settle(uint64_t key) {
  bool failed = false;
  {
    std::unique_lock lk(write_mu_);
    written_cv_.wait(lk, [&] { return !pending_.count(key); });
    failed = failed_.count(key) > 0;
  }
  if (failed) forget(key, true);
  return !failed;
}

void DiskSpanStore::drop(uint64_t key, RecordStatus why) {
  ++n_dropped_;
  if (why != RecordStatus::Ok) ++n_rejected_[reject_index(why)];
  forget(key, true);
}

std::optional<DiskSpanStore::LayerReader> DiskSpanStore::open_layers(uint64_t key, uint64_t ns,
                                                                     std::span<const int32_t> tokens,
                                                                     int64_t prefix) {
  // A write behind of this key first; one that failed left nothing to read.
  if (!settle(key) || !files_.count(key)) return std::nullopt;
  const auto bad = [&](RecordStatus why = RecordStatus::Other) -> std::optional<LayerReader> {
    drop(key, why);
    return std::nullopt;
  };
  Fd fd = open_read(path_of(key));
  struct stat st {};
  if (!fd.ok() || ::fstat(fd.get(), &st) != 0) return bad();
  const std::optional<std::vector<uint8_t>> head = read_head(fd, static_cast<uint64_t>(st.st_size));
  if (!head) return bad();
  SpanRecordHead decoded = decode_span_record_head(*head, key, ns, tokens, prefix, seal_);
  if (decoded.status == RecordStatus::Other && decoded.header.key == stored_name(key_.get(), key)) {
    // The right key with other tokens is a hash collision: not this span,
    // but an authentic file.
    ++n_rejected_[reject_index(RecordStatus::Other)];
    return std::nullopt;
  }
  if (decoded.status != RecordStatus::Ok) return bad(decoded.status);
  touch(key);
  return LayerReader(std::move(fd), std::move(decoded), key_);
}

bool DiskSpanStore::LayerReader::read_layer(int il) {
  if (il < 0 || il >= n_layer()) return false;
  const size_t n = layer_bytes();
  return read_exact_at(fd_, head_.span.k(il), n, head_.header.head_bytes() + static_cast<uint64_t>(il) * n) &&
         span_record_layer_ok(head_, il);
}

std::optional<KvSpan> DiskSpanStore::get(uint64_t key, uint64_t ns, std::span<const int32_t> tokens,
                                         int64_t prefix) {
  std::optional<LayerReader> reader = open_layers(key, ns, tokens, prefix);
  if (!reader) return std::nullopt;
  for (int il = 0; il < reader->n_layer(); ++il)
    if (!reader->read_layer(il)) {
      drop(key, RecordStatus::Mac);
      return std::nullopt;
    }
  return std::move(reader->span());
}

std::vector<DiskSpanStore::StoredSpan> DiskSpanStore::scan() {
  std::vector<StoredSpan> out;
  std::vector<std::pair<uint64_t, RecordStatus>> bad;
  for (const auto& [key, entry] : files_) {
    // The head is checked (tag, shape) against what it says it holds, so a
    // planted file is refused here, before the index hangs a node on it.
    const std::optional<std::vector<uint8_t>> head = read_head(open_read(path_of(key)), entry.bytes);
    std::optional<SpanRecordContents> c = head ? open_span_record_contents(*head, key_.get()) : std::nullopt;
    if (!c) {
      bad.emplace_back(key, head ? RecordStatus::Mac : RecordStatus::Other);
      continue;
    }
    const SpanRecordHead checked = decode_span_record_head(*head, key, c->ns, c->tokens, c->prefix, seal_);
    if (checked.status != RecordStatus::Ok) {
      bad.emplace_back(key, checked.status);
      continue;
    }
    out.push_back({key, c->ns, std::move(c->tokens), c->prefix});
  }
  for (const auto& [key, why] : bad) drop(key, why);
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

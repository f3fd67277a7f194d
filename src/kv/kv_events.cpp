#include "kv/kv_events.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <nlohmann/json.hpp>

#include "kv/span_record.h"
#include "util/error.h"
#include "util/hash.h"

namespace depcache {

std::vector<uint64_t> chain_keys(uint64_t ns, std::span<const int32_t> tokens, int64_t from,
                                 int64_t block_tokens) {
  std::vector<uint64_t> keys;
  const auto n = static_cast<int64_t>(tokens.size());
  if (n <= from || block_tokens < 1) return keys;
  // One pass: XXH3's streaming state gives at each block's end the hash of
  // everything so far, as span_content_key computes it at once.
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset_withSeed(state, hash_bytes(&ns, sizeof ns));
  int64_t done = 0;
  const auto advance = [&](int64_t to) {
    XXH3_64bits_update(state, tokens.data() + done, static_cast<size_t>(to - done) * sizeof(int32_t));
    done = to;
  };
  for (int64_t end = (from / block_tokens + 1) * block_tokens; end < n; end += block_tokens) {
    advance(end);
    keys.push_back(XXH3_64bits_digest(state));
  }
  advance(n);
  keys.push_back(XXH3_64bits_digest(state));
  XXH3_freeState(state);
  return keys;
}

KvEventLog::KvEventLog(int64_t block_tokens, std::shared_ptr<const MacKey> key)
    : block_tokens_(block_tokens), key_(std::move(key)) {
  if (block_tokens < 1) fail(ErrorKind::InvalidInput, "KV event blocks must hold at least 1 token");
}

std::vector<uint64_t> KvEventLog::named_chain(uint64_t ns, std::span<const int32_t> path,
                                              int64_t from) const {
  std::vector<uint64_t> keys = chain_keys(ns, path, from, block_tokens_);
  for (uint64_t& k : keys) k = stored_name(key_.get(), k);
  return keys;
}

void KvEventLog::stored(uint64_t ns, std::span<const int32_t> path, int64_t from) {
  KvEvent e{KvEvent::Type::Stored, stored_name(key_.get(), ns), named_chain(ns, path, from), 0,
            static_cast<int64_t>(path.size())};
  if (e.keys.empty()) return;
  const int64_t before = (from / block_tokens_) * block_tokens_;  // the block before the first new key
  if (before > 0)
    e.parent = stored_name(key_.get(), span_content_key(ns, path.first(static_cast<size_t>(before))));
  std::lock_guard lk(mu_);
  for (const uint64_t k : e.keys) ++live_[k];
  pending_.push_back(std::move(e));
}

void KvEventLog::removed(uint64_t ns, std::span<const int32_t> path, int64_t from) {
  KvEvent e{KvEvent::Type::Removed, stored_name(key_.get(), ns), named_chain(ns, path, from)};
  std::lock_guard lk(mu_);
  // A key goes when no span holds it any more (a split's first half ends
  // at a key never announced: nothing to remove there).
  std::erase_if(e.keys, [&](uint64_t k) {
    const auto it = live_.find(k);
    if (it == live_.end()) return true;
    if (--it->second > 0) return true;
    live_.erase(it);
    return false;
  });
  if (!e.keys.empty()) pending_.push_back(std::move(e));
}

void KvEventLog::split(uint64_t ns, std::span<const int32_t> path) {
  const auto n = static_cast<int64_t>(path.size());
  if (n == 0 || n % block_tokens_ == 0) return;
  const uint64_t key = stored_name(key_.get(), span_content_key(ns, path));
  std::lock_guard lk(mu_);
  if (++live_[key] == 1)
    pending_.push_back({KvEvent::Type::Stored, stored_name(key_.get(), ns), {key}, 0, n});
}

KvEventBatch KvEventLog::take() {
  std::lock_guard lk(mu_);
  KvEventBatch b{++seq_, std::move(pending_)};
  pending_.clear();
  return b;
}

KvEventLog::Summary KvEventLog::summary() const {
  std::lock_guard lk(mu_);
  Summary s{seq_, {}};
  s.keys.reserve(live_.size());
  for (const auto& [k, n] : live_) s.keys.push_back(k);
  return s;
}

bool KvEventLog::has_pending() const {
  std::lock_guard lk(mu_);
  return !pending_.empty();
}

size_t KvEventLog::n_keys() const {
  std::lock_guard lk(mu_);
  return live_.size();
}

namespace {
std::string hex(uint64_t k) { return fmt::format("{:016x}", k); }
}  // namespace

std::string kv_events_json(const KvEventHeader& h, const KvEventBatch& b) {
  nlohmann::json events = nlohmann::json::array();
  for (const KvEvent& e : b.events) {
    nlohmann::json keys = nlohmann::json::array();
    for (const uint64_t k : e.keys) keys.push_back(hex(k));
    if (e.type == KvEvent::Type::Stored)
      events.push_back({{"type", "BlockStored"},
                        {"namespace", hex(e.ns)},
                        {"block_hashes", std::move(keys)},
                        {"parent_block_hash", e.parent ? nlohmann::json(hex(e.parent)) : nlohmann::json()},
                        {"token_count", e.token_count}});
    else
      events.push_back({{"type", "BlockRemoved"}, {"block_hashes", std::move(keys)}});
  }
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return nlohmann::json{{"replica", h.replica},
                        {"epoch", h.epoch},
                        {"seq", b.seq},
                        {"ts", ts},
                        {"block_size", h.block_tokens},
                        {"running", h.running},
                        {"waiting", h.waiting},
                        {"events", std::move(events)}}
      .dump();
}

namespace {

constexpr size_t kSealHex = 2 * sizeof(MacTag);
// Domain separation: no other tag made under the cache key (a record's)
// can stand for a batch's.
constexpr std::string_view kEventsDomain = "depcache kv-events 1\n";

std::span<const uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

std::string seal_kv_events(const MacKey* key, const std::string& json) {
  if (!key) return json;
  const MacTag t = key->tag({bytes_of(kEventsDomain), bytes_of(json)});
  std::string out;
  out.reserve(kSealHex + json.size());
  for (const uint8_t b : t) out += fmt::format("{:02x}", b);
  return out + json;
}

std::optional<std::string_view> open_kv_events(const MacKey* key, std::string_view message,
                                               std::string* why) {
  // Sealed: 64 hex digits before the JSON; anything else is taken as the
  // JSON itself (and refused by its parser if it is not).
  const bool sealed =
      message.size() > kSealHex && std::all_of(message.begin(), message.begin() + kSealHex,
                                               [](unsigned char c) { return std::isxdigit(c) != 0; });
  if (!key) {
    if (sealed)
      *why =
          "a sealed batch, and this router has no key to check it (give it the replicas' --cache-key-file)";
    return sealed ? std::nullopt : std::optional(message);
  }
  if (!sealed) {
    *why = "an unsealed batch (forged, or from a replica without the deployment's --cache-key-file)";
    return std::nullopt;
  }
  MacTag expected{};
  bool hex_ok = message.size() > kSealHex;
  for (size_t i = 0; hex_ok && i < expected.size(); ++i) {
    const auto [end, ec] =
        std::from_chars(message.data() + 2 * i, message.data() + 2 * i + 2, expected[i], 16);
    hex_ok = ec == std::errc() && end == message.data() + 2 * i + 2;
  }
  const std::string_view json = hex_ok ? message.substr(kSealHex) : std::string_view();
  if (!hex_ok || !key->check(expected, {bytes_of(kEventsDomain), bytes_of(json)})) {
    *why = "a batch whose seal does not match (forged, altered, or sealed under another key)";
    return std::nullopt;
  }
  return json;
}

}  // namespace depcache

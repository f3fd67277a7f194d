#include "server/replica_router.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <nlohmann/json.hpp>

#include "kv/kv_events.h"
#include "kv/span_record.h"
#include "util/error.h"
#include "util/hash.h"

namespace depcache {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

bool valid_name(std::string_view s) {
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '.' || c == '-';
  });
}

// A key as the events write it: 16 lowercase hex digits.
std::optional<uint64_t> parse_key(const json& j) {
  if (!j.is_string()) return std::nullopt;
  const std::string& s = j.get_ref<const std::string&>();
  uint64_t k = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), k, 16);
  if (s.size() != 16 || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return k;
}

std::optional<int64_t> count_of(const json& j, const char* field) {
  const auto it = j.find(field);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  const int64_t v = it->get<int64_t>();
  if (v < 0) return std::nullopt;
  return v;
}

// At most this many keys in one message or summary (a replica's whole index
// of 8 GiB at 16-token blocks is far below it).
constexpr size_t kMaxKeys = size_t{1} << 24;
// Bounds of a report's figures: far above any real replica's, low enough
// that no sum or product the router makes of them overflows.
constexpr int64_t kMaxLoad = int64_t{1} << 20;
constexpr int64_t kMaxSeq = int64_t{1} << 53;

// A load figure: absent is 0; present, a whole number in [0, kMaxLoad].
std::optional<int64_t> load_of(const json& j, const char* field) {
  const auto it = j.find(field);
  if (it == j.end()) return 0;
  if (!it->is_number_integer()) return std::nullopt;
  const int64_t v = it->get<int64_t>();
  if (v < 0 || v > kMaxLoad) return std::nullopt;
  return v;
}

// One event of a batch: keys the replica stored, or removed.
struct KeyChange {
  bool stored;
  std::vector<uint64_t> keys;
};

// A batch's events, read whole into `changes`; the reason they are refused,
// or empty.
std::string read_changes(const json& events, std::vector<KeyChange>& changes) {
  size_t n_keys = 0;
  for (const json& e : events) {
    if (!e.is_object()) return "an event is not an object";
    const auto type = e.find("type");
    const auto hashes = e.find("block_hashes");
    if (type == e.end() || !type->is_string() || hashes == e.end() || !hashes->is_array())
      return "an event needs type and block_hashes";
    const std::string& t = type->get_ref<const std::string&>();
    if (t != "BlockStored" && t != "BlockRemoved") return fmt::format("unknown event type {}", type->dump());
    n_keys += hashes->size();
    if (n_keys > kMaxKeys) return "too many keys in one batch";
    KeyChange c{t == "BlockStored", {}};
    for (const json& h : *hashes) {
      const auto k = parse_key(h);
      if (!k) return "a block hash is not 16 hex digits";
      c.keys.push_back(*k);
    }
    changes.push_back(std::move(c));
  }
  return {};
}

}  // namespace

ReplicaAddress parse_replica(const std::string& s) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos)
    fail(ErrorKind::InvalidInput, "a replica is NAME=http://host:port, not '{}'", s);
  ReplicaAddress r{s.substr(0, eq), s.substr(eq + 1)};
  if (!valid_name(r.name))
    fail(ErrorKind::InvalidInput, "replica name '{}' must be 1-64 of A-Z a-z 0-9 _ . -", r.name);
  if (r.url.rfind("http://", 0) != 0 || r.url.size() <= 7)
    fail(ErrorKind::InvalidInput, "replica '{}' needs an http:// address, not '{}'", r.name, r.url);
  while (r.url.back() == '/') r.url.pop_back();
  return r;
}

ReplicaRouter::ReplicaRouter(std::vector<ReplicaAddress> replicas, RouterOptions o)
    : addresses_(std::move(replicas)), o_(o), replicas_(addresses_.size()) {
  if (addresses_.empty()) fail(ErrorKind::InvalidInput, "a router needs at least one replica");
  for (size_t i = 0; i < addresses_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (addresses_[i].name == addresses_[j].name)
        fail(ErrorKind::InvalidInput, "replica '{}' is named twice", addresses_[i].name);
}

int ReplicaRouter::find(std::string_view name) const {
  for (size_t i = 0; i < addresses_.size(); ++i)
    if (addresses_[i].name == name) return static_cast<int>(i);
  return -1;
}

EventOutcome ReplicaRouter::apply_events(std::string_view message, std::string* why) {
  const auto outcome = [&](EventOutcome o, std::string w = {}) {
    *why = std::move(w);
    std::lock_guard lk(mu_);
    ++outcomes_[static_cast<size_t>(o)];
    return o;
  };
  const auto refuse = [&](std::string w) { return outcome(EventOutcome::Refused, std::move(w)); };
  std::string seal_why;
  const std::optional<std::string_view> body = open_kv_events(o_.events_key.get(), message, &seal_why);
  if (!body) return refuse(std::move(seal_why));
  const json j = json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return refuse("not a JSON object");
  const auto name = j.find("replica");
  const auto epoch = j.find("epoch");
  const auto events = j.find("events");
  const auto seq = count_of(j, "seq");
  if (name == j.end() || !name->is_string() || epoch == j.end() || !epoch->is_string() || !seq ||
      events == j.end() || !events->is_array())
    return refuse("a batch needs replica, epoch, seq and events");
  const int r = find(name->get_ref<const std::string&>());
  if (r < 0) return refuse(fmt::format("no replica '{}' is configured here", name->dump()));
  if (!valid_name(epoch->get_ref<const std::string&>()) || *seq > kMaxSeq)
    return refuse("the epoch or seq is out of bounds");
  if (count_of(j, "block_size") != o_.block_tokens)
    return refuse(fmt::format("replica '{}' keys blocks of another size than --kv-events-block {}",
                              addresses_[r].name, o_.block_tokens));
  const std::optional<int64_t> running = load_of(j, "running"), waiting = load_of(j, "waiting");
  if (!running || !waiting)
    return refuse(fmt::format("running and waiting must be whole numbers from 0 to {}", kMaxLoad));
  // Checked whole before anything is applied.
  std::vector<KeyChange> changes;
  if (std::string bad = read_changes(*events, changes); !bad.empty()) return refuse(std::move(bad));
  const std::string& ep = epoch->get_ref<const std::string&>();
  std::string w;
  EventOutcome o;
  {
    std::lock_guard lk(mu_);
    Replica& rep = replicas_[r];
    o = batch_order(rep, r, ep, *seq, &w);
    if (o == EventOutcome::Applied) {
      rep.seq = *seq;
      rep.seen = Clock::now();
      rep.running = *running;
      rep.waiting = *waiting;
      rep.routed = 0;
      for (const KeyChange& c : changes)
        for (const uint64_t k : c.keys) {
          if (c.stored)
            rep.keys.insert(k);
          else
            rep.keys.erase(k);
        }
    }
  }
  return outcome(o, std::move(w));
}

// Only a batch that follows what is held says anything of the replica now (a
// replay is a true batch of the past: its load and liveness are old, its keys
// may be gone).
EventOutcome ReplicaRouter::batch_order(Replica& rep, int r, const std::string& epoch, int64_t seq,
                                        std::string* why) {
  if (!rep.synced) {
    *why = "the replica is being read from its summary";
    return EventOutcome::Resync;
  }
  if (epoch != rep.epoch) {
    // A restart, or a batch of a past epoch replayed: the replica's own
    // summary tells which. It stays routed to meanwhile, so replays
    // cannot take it out of service.
    rep.epoch_doubt = true;
    *why = fmt::format("epoch {} is not the one held ({})", epoch, rep.epoch);
    return EventOutcome::Resync;
  }
  if (seq <= rep.seq) {
    *why = fmt::format("batch {} of replica '{}' is not after {} (a replay, or overtaken by a summary)", seq,
                       addresses_[r].name, rep.seq);
    return EventOutcome::Stale;
  }
  if (seq != rep.seq + 1) {
    rep.synced = false;  // a batch was lost: the keys held may be wrong
    *why = fmt::format("batch {} after {}: one was lost", seq, rep.seq);
    return EventOutcome::Resync;
  }
  return EventOutcome::Applied;
}

std::array<int64_t, kEventOutcomes> ReplicaRouter::event_counts() const {
  std::lock_guard lk(mu_);
  return outcomes_;
}

const char* event_outcome_name(EventOutcome o) {
  static const char* const names[kEventOutcomes] = {"applied", "stale", "resync", "refused"};
  return names[static_cast<size_t>(o)];
}

bool ReplicaRouter::apply_summary(const std::string& name, std::string_view body, std::string* why) {
  const auto refuse = [&](std::string w) {
    *why = std::move(w);
    return false;
  };
  const int r = find(name);
  if (r < 0) return refuse(fmt::format("no replica '{}' is configured here", name));
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return refuse("the summary is not a JSON object");
  const auto epoch = j.find("epoch");
  const auto hashes = j.find("block_hashes");
  const auto seq = count_of(j, "seq");
  const auto who = j.find("replica");
  if (epoch == j.end() || !epoch->is_string() || hashes == j.end() || !hashes->is_array() || !seq ||
      who == j.end() || !who->is_string())
    return refuse("a summary needs replica, epoch, seq and block_hashes");
  if (who->get_ref<const std::string&>() != name)
    return refuse(fmt::format("the server at {} calls itself {}, not '{}' (its --replica-name)",
                              addresses_[r].url, who->dump(), name));
  if (count_of(j, "block_size") != o_.block_tokens)
    return refuse(fmt::format("replica '{}' keys blocks of another size than --kv-events-block {}", name,
                              o_.block_tokens));
  if (hashes->size() > kMaxKeys) return refuse("too many keys in the summary");
  const std::optional<int64_t> running = load_of(j, "running"), waiting = load_of(j, "waiting");
  if (!running || !waiting || !valid_name(epoch->get_ref<const std::string&>()) || *seq > kMaxSeq)
    return refuse("the summary's epoch, seq, running or waiting is out of bounds");
  std::unordered_set<uint64_t> keys;
  keys.reserve(hashes->size());
  for (const json& h : *hashes) {
    const auto k = parse_key(h);
    if (!k) return refuse("a block hash is not 16 hex digits");
    keys.insert(*k);
  }
  std::lock_guard lk(mu_);
  Replica& rep = replicas_[r];
  rep.keys = std::move(keys);
  rep.epoch = epoch->get<std::string>();
  rep.seq = *seq;
  rep.synced = true;
  rep.epoch_doubt = false;
  rep.seen = rep.synced_at = Clock::now();
  rep.running = *running;
  rep.waiting = *waiting;
  rep.routed = 0;
  return true;
}

void ReplicaRouter::mark_unsynced(const std::string& name) {
  std::lock_guard lk(mu_);
  if (const int r = find(name); r >= 0) replicas_[r].synced = false;
}

std::vector<ReplicaAddress> ReplicaRouter::needing_sync() const {
  std::lock_guard lk(mu_);
  std::vector<ReplicaAddress> out;
  for (size_t i = 0; i < replicas_.size(); ++i)
    if (!replicas_[i].synced || replicas_[i].epoch_doubt ||
        Clock::now() - replicas_[i].seen > o_.stale_after ||
        Clock::now() - replicas_[i].synced_at > o_.resync_every)
      out.push_back(addresses_[i]);
  return out;
}

std::vector<ReplicaRouter::Chain> ReplicaRouter::chains_of(const std::vector<Lookup>& lookups) const {
  std::vector<Chain> out;
  for (const Lookup& l : lookups) {
    Chain c{chain_keys(l.ns, l.tokens, 0, o_.block_tokens), static_cast<int64_t>(l.tokens.size())};
    for (uint64_t& k : c.keys) k = stored_name(o_.events_key.get(), k);  // as the replicas name them
    out.push_back(std::move(c));
  }
  return out;
}

int64_t ReplicaRouter::held_tokens(const std::unordered_set<uint64_t>& keys,
                                   const std::vector<Chain>& chains) const {
  int64_t held = 0;
  for (const Chain& c : chains) {
    int64_t got = 0;
    for (size_t i = 0; i < c.keys.size(); ++i) {
      if (!keys.count(c.keys[i])) break;
      got = i + 1 < c.keys.size() ? static_cast<int64_t>(i + 1) * o_.block_tokens : c.tokens;
    }
    held += got;
  }
  return held;
}

ReplicaRouter::Decision ReplicaRouter::route(const std::vector<Lookup>& lookups, std::string_view tie_key) {
  Decision d;
  const std::vector<Chain> chains = chains_of(lookups);
  for (const Chain& c : chains) d.total += c.tokens;
  std::lock_guard lk(mu_);
  ++n_routed_;
  routed_tokens_ += static_cast<double>(d.total);
  const double per_request =
      o_.load_tokens > 0 ? o_.load_tokens : routed_tokens_ / static_cast<double>(n_routed_);
  const auto now = Clock::now();
  const uint64_t tie_seed = hash_string(tie_key);
  std::vector<double> load(replicas_.size(), -1);  // -1: not usable
  int64_t best_held = 0;
  for (size_t i = 0; i < replicas_.size(); ++i) {
    const Replica& r = replicas_[i];
    const bool usable = r.synced && now - r.seen <= o_.stale_after;
    d.matched.push_back(usable ? held_tokens(r.keys, chains) : 0);
    if (usable) load[i] = static_cast<double>(r.running + r.waiting + r.routed);
    best_held = std::max(best_held, d.matched.back());
  }
  const bool has_home =
      static_cast<double>(best_held) >= o_.min_overlap * static_cast<double>(d.total) && best_held > 0;
  double best = std::numeric_limits<double>::infinity();
  uint64_t best_rank = 0;
  int chosen = -1;
  for (size_t i = 0; i < replicas_.size(); ++i) {
    if (load[i] < 0) continue;
    // With a home: the tokens left to compute plus the queue's work;
    // without: the queue alone.
    const double cost =
        (has_home ? static_cast<double>(d.total - d.matched[i]) : 0.0) + per_request * load[i];
    const uint64_t rank = hash_string(addresses_[i].name, tie_seed);
    if (cost < best - 1e-9 || (cost < best + 1e-9 && rank > best_rank)) {
      best = cost;
      best_rank = rank;
      chosen = static_cast<int>(i);
    }
  }
  if (chosen >= 0) {
    d.replica = addresses_[chosen].name;
    Replica& r = replicas_[chosen];
    ++r.routed;
    // What it is about to compute counts as held there now, not once its
    // events arrive: the next request with the same context follows it
    // (its events then confirm the keys, or remove what it evicts).
    for (const Chain& c : chains) r.keys.insert(c.keys.begin(), c.keys.end());
  }
  return d;
}

std::string ReplicaRouter::state_json() const {
  std::lock_guard lk(mu_);
  json out = json::array();
  const auto now = Clock::now();
  for (size_t i = 0; i < replicas_.size(); ++i) {
    const Replica& r = replicas_[i];
    out.push_back(
        {{"name", addresses_[i].name},
         {"url", addresses_[i].url},
         {"synced", r.synced},
         {"epoch", r.epoch},
         {"seq", r.seq},
         {"blocks", r.keys.size()},
         {"running", r.running},
         {"waiting", r.waiting},
         {"routed_since_report", r.routed},
         {"seen_ms_ago", r.seen == Clock::time_point{}
                             ? -1
                             : std::chrono::duration_cast<std::chrono::milliseconds>(now - r.seen).count()}});
  }
  return out.dump();
}

}  // namespace depcache

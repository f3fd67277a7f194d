#pragma once
// What a cache-aware router knows of the replicas behind it, and how it
// picks one for a request (depcache route; docs/replicas.md). Each replica's
// content keys are kept from its KV events (kv/kv_events.h) and its summary;
// a request's lookups — the namespaces and token sequences its strategy will
// look up: prefix chains, chunks wherever they sit, KG subtrees — are keyed
// the same way, so the router counts the tokens each replica would find.
// It picks the replica where the request's estimated work, the tokens left to
// compute plus its queue, is least. Events come from a channel anyone with
// access to the Redis can write to: a batch is believed only after its seal
// (with the deployment's key), its fields, and its place in the replica's
// numbering are checked — nothing of it, not even the load it reports or
// that the replica is alive, is taken before. A replayed batch is dropped; a
// gap in the numbering sends the router back to the replica's summary.
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "exec/plan.h"
#include "util/mac.h"

namespace depcache {

struct ReplicaAddress {
  std::string name;  // as its events and the proxy name it: [A-Za-z0-9_.-]+
  std::string url;   // http://host:port
};
// "NAME=http://host:port"; throws InvalidInput naming what is wrong.
ReplicaAddress parse_replica(const std::string& s);

struct RouterOptions {
  int64_t block_tokens = 16;  // the replicas' --kv-events-block
  // Work a queued or running request counts for, in tokens, per request of
  // the replica's load (its running and waiting requests plus what this
  // router sent it since its last report); 0: the mean prompt routed so far.
  double load_tokens = 0;
  // A request whose best replica holds less than this share of its tokens
  // has no home yet: it goes to the least loaded replica (among equals, by
  // rendezvous hashing of its route key), so new contexts spread instead of
  // all following the replica that holds the common template.
  double min_overlap = 0.5;
  std::chrono::milliseconds stale_after{3000};  // no events for this long: not routed to
  // Summaries are read again this often, so keys counted as held at
  // routing that the replica never stored (a request that failed) go.
  std::chrono::milliseconds resync_every{30000};
  // The deployment's key (--cache-key-file): batches must carry its seal.
  // Null: unsealed batches (a router and replicas without a key).
  std::shared_ptr<const MacKey> events_key;
};

// What became of event batches, for the router's /metrics.
enum class EventOutcome {
  Applied,  // in order: its keys and load taken
  Stale,    // numbered at or before what is held: a replay, or overtaken by a summary; dropped
  Resync,   // a gap, another epoch (a restart?), or the replica not yet read: its summary is read
  Refused,  // not a batch of a configured replica: malformed, unsealed or forged, out of bounds
};
inline constexpr int kEventOutcomes = 4;
const char* event_outcome_name(EventOutcome o);  // "applied", "stale", "resync", "refused"

class ReplicaRouter {
 public:
  ReplicaRouter(std::vector<ReplicaAddress> replicas, RouterOptions o);

  // One event batch as published (hostile until checked); *why says why
  // when it is not applied.
  EventOutcome apply_events(std::string_view message, std::string* why);
  // Batches so far, by outcome.
  std::array<int64_t, kEventOutcomes> event_counts() const;
  // A replica's GET /v1/cache/summary; false with *why when refused.
  bool apply_summary(const std::string& name, std::string_view body, std::string* why);
  void mark_unsynced(const std::string& name);
  // Replicas whose key set must be read from their summary.
  std::vector<ReplicaAddress> needing_sync() const;

  struct Decision {
    std::string replica;           // empty: no replica known well enough (the proxy's own balancing decides)
    std::vector<int64_t> matched;  // tokens each replica holds of the request, in replica order
    int64_t total = 0;             // tokens the lookups cover
  };
  // The replica whose estimated work for the request is least (among equals,
  // the one `tie_key` ranks first by rendezvous hashing, so new contexts
  // spread and a context's ties always fall the same way); the request's
  // keys count as held there from now on.
  Decision route(const std::vector<Lookup>& lookups, std::string_view tie_key = {});

  const std::vector<ReplicaAddress>& replicas() const { return addresses_; }
  std::string state_json() const;  // for GET /replicas

 private:
  struct Replica {
    std::string epoch;
    int64_t seq = 0;
    bool synced = false;
    bool epoch_doubt = false;  // a batch of another epoch came: the summary says which is current
    std::unordered_set<uint64_t> keys;
    int64_t running = 0, waiting = 0, routed = 0;  // routed: since its last report
    std::chrono::steady_clock::time_point seen{}, synced_at{};
  };
  int find(std::string_view name) const;
  // Whether a batch of replica r (epoch, seq) follows what is held of it:
  // Applied, or the outcome and *why. Marks the replica for its summary where
  // the batch says it is out of step. Under mu_.
  EventOutcome batch_order(Replica& rep, int r, const std::string& epoch, int64_t seq, std::string* why);
  struct Chain {
    std::vector<uint64_t> keys;  // chain_keys of a lookup
    int64_t tokens = 0;
  };
  std::vector<Chain> chains_of(const std::vector<Lookup>& lookups) const;
  // Tokens a key set holds: per lookup, its longest stretch from the start
  // whose block keys (and end key, if whole) are all there.
  int64_t held_tokens(const std::unordered_set<uint64_t>& keys, const std::vector<Chain>& chains) const;

  std::vector<ReplicaAddress> addresses_;
  RouterOptions o_;
  mutable std::mutex mu_;
  std::vector<Replica> replicas_;
  std::array<int64_t, kEventOutcomes> outcomes_{};
  double routed_tokens_ = 0;
  int64_t n_routed_ = 0;
};

}  // namespace depcache

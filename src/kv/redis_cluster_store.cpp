#include "kv/redis_cluster_store.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <boost/crc.hpp>
#include <charconv>
#include <cstdio>

#include "kv/redis_connection.h"
#include "util/error.h"

namespace depcache {

struct RedisClusterStore::Node {
  RedisAddress address;
  std::unique_ptr<RedisConnection> conn;
  int64_t retry_at_ms = 0;
  bool warned = false;  // its outage was reported
};

namespace {

// While a node fails, the slot map is read again this often (a failover shows
// up there once a replica is promoted).
constexpr int64_t kDegradedRefreshMs = 100;

std::string_view text(const redisReply& r) { return {r.str, r.len}; }

std::optional<int> parse_port(std::string_view s) {
  int p = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), p);
  if (ec != std::errc() || end != s.data() + s.size() || p <= 0 || p > 65535) return std::nullopt;
  return p;
}

// "MOVED 3999 127.0.0.1:6381" / "ASK ..." into slot and address; an empty
// host means the host of the node that answered.
std::optional<std::pair<int, RedisAddress>> parse_redirect(std::string_view e, const RedisAddress& from) {
  const size_t sp1 = e.find(' '), sp2 = e.find(' ', sp1 == std::string_view::npos ? sp1 : sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos) return std::nullopt;
  const std::string_view slot_s = e.substr(sp1 + 1, sp2 - sp1 - 1), where = e.substr(sp2 + 1);
  int slot = -1;
  const auto [end, ec] = std::from_chars(slot_s.data(), slot_s.data() + slot_s.size(), slot);
  if (ec != std::errc() || end != slot_s.data() + slot_s.size() || slot < 0 || slot >= kRedisClusterSlots)
    return std::nullopt;
  const size_t colon = where.rfind(':');
  if (colon == std::string_view::npos || colon > 255) return std::nullopt;
  const std::optional<int> port = parse_port(where.substr(colon + 1));
  if (!port) return std::nullopt;
  RedisAddress a{std::string(where.substr(0, colon)), *port};
  if (a.host.empty()) a.host = from.host;
  return std::pair{slot, a};
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

std::vector<RedisAddress> parse_redis_addresses(const std::string& list) {
  std::vector<RedisAddress> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    const RedisOptions o = parse_redis_address(list.substr(start, comma - start));
    out.push_back({o.host, o.port});
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int redis_cluster_slot(std::string_view key) {
  // A {hash tag} with something in it: only that part is hashed, so keys
  // that share it share a slot.
  if (const size_t open = key.find('{'); open != std::string_view::npos)
    if (const size_t close = key.find('}', open + 1); close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  boost::crc_optimal<16, 0x1021, 0, 0, false, false> crc;  // CRC16-CCITT (XMODEM), as the spec names it
  crc.process_bytes(key.data(), key.size());
  return crc.checksum() & (kRedisClusterSlots - 1);
}

std::optional<std::vector<RedisSlotRange>> parse_cluster_slots(const redisReply& reply,
                                                               const RedisAddress& asked, std::string* why) {
  const auto bad = [&](std::string what) {
    if (why) *why = std::move(what);
    return std::nullopt;
  };
  if (reply.type != REDIS_REPLY_ARRAY) return bad("CLUSTER SLOTS did not answer with a list of ranges");
  std::vector<RedisSlotRange> ranges;
  std::vector<bool> taken(kRedisClusterSlots, false);
  for (size_t i = 0; i < reply.elements; ++i) {
    const redisReply* r = reply.element[i];
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->element[0]->type != REDIS_REPLY_INTEGER ||
        r->element[1]->type != REDIS_REPLY_INTEGER || r->element[2]->type != REDIS_REPLY_ARRAY)
      return bad(fmt::format("CLUSTER SLOTS range {} is not [first, last, [host, port, ...], ...]", i));
    const long long first = r->element[0]->integer, last = r->element[1]->integer;
    if (first < 0 || last < first || last >= kRedisClusterSlots)
      return bad(fmt::format("CLUSTER SLOTS range {} covers slots {}..{}", i, first, last));
    const redisReply* m = r->element[2];
    if (m->elements < 2 || m->element[0]->type != REDIS_REPLY_STRING ||
        m->element[1]->type != REDIS_REPLY_INTEGER || m->element[1]->integer <= 0 ||
        m->element[1]->integer > 65535 || m->element[0]->len > 255)
      return bad(fmt::format("CLUSTER SLOTS range {} names no master as host and port", i));
    for (long long s = first; s <= last; ++s) {
      if (taken[s]) return bad(fmt::format("CLUSTER SLOTS gives slot {} twice", s));
      taken[s] = true;
    }
    const std::string_view host = text(*m->element[0]);
    if (host == "?") continue;  // the node knows no endpoint for it: those slots stay unknown
    ranges.push_back(
        {static_cast<int>(first),
         static_cast<int>(last),
         {host.empty() ? asked.host : std::string(host), static_cast<int>(m->element[1]->integer)}});
  }
  return ranges;
}

RedisClusterStore::RedisClusterStore(std::vector<RedisAddress> seeds, RedisOptions o)
    : seeds_(std::move(seeds)), o_(std::move(o)) {
  owner_.fill(-1);
  if (seeds_.empty()) fail(ErrorKind::InvalidInput, "a Redis Cluster needs at least one node's address");
  std::lock_guard lk(mu_);
  std::string config_error;
  // A node that refuses our credentials, or is no cluster node, refuses
  // every command: a configuration error, said once, now.
  for (const RedisAddress& a : seeds_) {
    Node& n = *nodes_[node_id(a)];
    if (!n.conn->open(steady_now_ms() + o_.timeout_ms)) {
      if (n.conn->auth_refused())
        fail(ErrorKind::InvalidInput, "{} (check --redis-password-file and --redis-user)", n.conn->error());
      continue;
    }
    const RedisReply r = n.conn->command({"CLUSTER", "SLOTS"}, steady_now_ms() + o_.timeout_ms);
    if (r && r->type == REDIS_REPLY_ERROR) {
      const std::string_view e = text(*r);
      if (starts_with(e, "NOAUTH") || starts_with(e, "WRONGPASS"))
        fail(ErrorKind::InvalidInput, "Redis at {}:{} refuses commands: {}{}", n.address.host, n.address.port,
             e, o_.password.empty() ? " (give its password with --redis-password-file)" : "");
      fail(ErrorKind::InvalidInput, "Redis at {}:{} is not a cluster node ({}): give it with --redis instead",
           n.address.host, n.address.port, e);
    }
    break;
  }
  if (!refresh_locked(steady_now_ms() + o_.timeout_ms) && !warned_) {
    fmt::print(stderr,
               "warning: no node of the Redis Cluster gave its slot map ({}); the remote KV tier is skipped "
               "until one does (requests are computed locally)\n",
               last_error_);
    warned_ = true;
  }
  started_ = true;
}

RedisClusterStore::~RedisClusterStore() = default;

int16_t RedisClusterStore::node_id(const RedisAddress& a) {
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i]->address == a) return static_cast<int16_t>(i);
  auto n = std::make_unique<Node>();
  n->address = a;
  n->conn = std::make_unique<RedisConnection>(a.host, a.port, o_);
  nodes_.push_back(std::move(n));
  return static_cast<int16_t>(nodes_.size() - 1);
}

bool RedisClusterStore::reachable(Node& n, int64_t deadline) {
  if (n.conn->is_open()) return true;
  if (steady_now_ms() < n.retry_at_ms) return false;
  if (!n.conn->open(deadline)) {
    node_failed(n, n.conn->error());
    return false;
  }
  if (n.warned)
    fmt::print(stderr, "warning: Redis Cluster node {}:{} is reachable again\n", n.address.host,
               n.address.port);
  n.warned = false;
  return true;
}

void RedisClusterStore::node_failed(Node& n, const std::string& why) {
  ++stats_.failures;
  last_error_ = why;
  n.conn->close();  // a context that saw an error cannot be reused
  const int64_t now = steady_now_ms();
  n.retry_at_ms = now + o_.retry_after_ms;
  // Its slots may be served by a promoted replica soon: read the map again.
  stale_ = true;
  refresh_at_ms_ = std::min(refresh_at_ms_, now + kDegradedRefreshMs);
  if (!n.warned && started_)
    fmt::print(stderr,
               "warning: {}; the keys of Redis Cluster node {}:{} are skipped until it or a replica taking "
               "over answers (requests are computed locally)\n",
               why, n.address.host, n.address.port);
  n.warned = true;
}

bool RedisClusterStore::refresh_locked(int64_t deadline) {
  // Ask the masters of the current map first, then the seeds, then the rest.
  std::vector<RedisAddress> order;
  const auto add = [&](const RedisAddress& a) {
    if (std::find(order.begin(), order.end(), a) == order.end()) order.push_back(a);
  };
  for (const int16_t o : owner_)
    if (o >= 0) add(nodes_[o]->address);
  for (const RedisAddress& a : seeds_) add(a);
  for (size_t i = 0; i < nodes_.size(); ++i) add(nodes_[i]->address);
  refresh_at_ms_ = steady_now_ms() + kDegradedRefreshMs;
  for (const RedisAddress& a : order) {
    Node& n = *nodes_[node_id(a)];
    if (!reachable(n, deadline)) continue;
    const RedisReply r = n.conn->command({"CLUSTER", "SLOTS"}, deadline);
    if (!r) {
      node_failed(
          n, fmt::format("Redis Cluster CLUSTER SLOTS at {}:{} failed: {}", a.host, a.port, n.conn->error()));
      continue;
    }
    std::string why;
    const auto ranges = r->type == REDIS_REPLY_ERROR ? std::nullopt : parse_cluster_slots(*r, a, &why);
    if (!ranges) {
      last_error_ = fmt::format("Redis Cluster node {}:{}: {}", a.host, a.port,
                                r->type == REDIS_REPLY_ERROR ? std::string(text(*r)) : why);
      continue;
    }
    owner_.fill(-1);
    int covered = 0;
    for (const RedisSlotRange& s : *ranges) {
      const int16_t id = node_id(s.master);
      for (int slot = s.first; slot <= s.last; ++slot) owner_[slot] = id;
      covered += s.last - s.first + 1;
    }
    const bool whole = covered == kRedisClusterSlots;
    ++stats_.refreshes;
    // A map with holes (slots being reassigned) is read again soon.
    stale_ = !whole;
    if (whole && warned_) {
      fmt::print(stderr, "warning: the Redis Cluster serves every slot again\n");
      warned_ = false;
    }
    return true;
  }
  refresh_at_ms_ = steady_now_ms() + o_.retry_after_ms;
  return false;
}

void RedisClusterStore::refresh_if_due() {
  if (!stale_) return;
  const int64_t now = steady_now_ms();
  if (now < refresh_at_ms_) return;
  refresh_locked(now + o_.timeout_ms);
}

bool RedisClusterStore::refresh() {
  std::lock_guard lk(mu_);
  return refresh_locked(steady_now_ms() + o_.timeout_ms);
}

// A key's command on its way: the node it goes to next.
struct RedisClusterStore::Op {
  size_t key;
  int node;
  bool asking;  // the node is importing the slot: ASKING first
};

// One node's pipeline in a round of run().
struct RedisClusterStore::Batch {
  int node;
  std::vector<const Op*> mine;
  size_t n_commands;
};

std::vector<RedisClusterStore::Op> RedisClusterStore::ops_by_owner(const std::vector<RedisCommand>& commands,
                                                                   size_t n_keys) {
  std::vector<Op> ops;
  for (size_t i = 0; i < n_keys; ++i) {
    const int o = owner_[redis_cluster_slot(commands[i][1])];
    if (o < 0) {
      ++stats_.unserved;
      stale_ = true;
    } else {
      ops.push_back({i, o, false});
    }
  }
  return ops;
}

void RedisClusterStore::pipeline_failed(Node& n, const char* what, size_t n_keys) {
  node_failed(n, fmt::format("Redis Cluster {} at {}:{} failed: {}", what, n.address.host, n.address.port,
                             n.conn->error()));
  stats_.unserved += static_cast<int64_t>(n_keys);
}

std::vector<RedisClusterStore::Batch> RedisClusterStore::send_round(const std::vector<Op>& pending,
                                                                    const std::vector<RedisCommand>& commands,
                                                                    const char* what, bool last_round,
                                                                    int64_t deadline) {
  std::vector<int> order;  // nodes in first-use order
  for (const Op& p : pending)
    if (std::find(order.begin(), order.end(), p.node) == order.end()) order.push_back(p.node);
  std::vector<Batch> sent;
  for (const int id : order) {
    Node& n = *nodes_[id];
    std::vector<const Op*> mine;
    std::vector<RedisCommand> cmds;
    for (const Op& p : pending) {
      if (p.node != id) continue;
      mine.push_back(&p);
      if (p.asking) cmds.push_back({"ASKING"});
      cmds.push_back(commands[p.key]);
    }
    if (last_round || !reachable(n, deadline)) {
      stats_.unserved += static_cast<int64_t>(mine.size());
      continue;
    }
    if (!n.conn->send(cmds, deadline)) {
      pipeline_failed(n, what, mine.size());
      continue;
    }
    sent.push_back({id, std::move(mine), cmds.size()});
  }
  return sent;
}

bool RedisClusterStore::follow_redirect(std::string_view e, const Node& n, size_t key,
                                        std::vector<Op>& next) {
  const bool moved = starts_with(e, "MOVED "), ask = starts_with(e, "ASK ");
  if (!moved && !ask) return false;
  const auto redirect = parse_redirect(e, n.address);
  if (!redirect) return false;
  const int16_t to_id = node_id(redirect->second);
  if (moved) {
    ++stats_.moved;
    owner_[redirect->first] = to_id;
    stale_ = true;  // more slots moved, likely: read the whole map soon
    refresh_at_ms_ = 0;
  } else {
    ++stats_.asked;
  }
  next.push_back({key, to_id, ask});
  return true;
}

void RedisClusterStore::read_batch(const Batch& batch, const char* what, int64_t deadline,
                                   size_t max_reply_bytes, std::vector<RedisReply>& out,
                                   std::vector<Op>& next) {
  Node& n = *nodes_[batch.node];
  std::vector<RedisReply> replies = n.conn->replies(batch.n_commands, deadline, max_reply_bytes);
  if (replies.empty()) {
    pipeline_failed(n, what, batch.mine.size());
    return;
  }
  size_t r = 0;
  for (const Op* p : batch.mine) {
    if (p->asking) ++r;  // ASKING's +OK
    RedisReply& reply = replies[r++];
    if (reply->type != REDIS_REPLY_ERROR) {
      out[p->key] = std::move(reply);
      continue;
    }
    const std::string_view e = text(*reply);
    if (follow_redirect(e, n, p->key, next)) continue;
    last_error_ = fmt::format("Redis Cluster {} at {}:{}: {}", what, n.address.host, n.address.port, e);
    ++stats_.failures;
    if (starts_with(e, "CLUSTERDOWN") || starts_with(e, "TRYAGAIN")) stale_ = true;
  }
}

std::vector<RedisReply> RedisClusterStore::run(std::span<const uint64_t> keys,
                                               const std::vector<RedisCommand>& commands, const char* what,
                                               size_t max_reply_bytes) {
  std::vector<RedisReply> out(keys.size());
  refresh_if_due();
  const int64_t deadline = steady_now_ms() + o_.timeout_ms;
  std::vector<Op> pending = ops_by_owner(commands, keys.size());
  // Redirects are followed twice at most: MOVED to the new master, which may
  // still answer ASK while the slot migrates.
  for (int round = 0; round < 3 && !pending.empty(); ++round) {
    // Every master's pipeline is sent before any is read, so the masters
    // work on theirs at once and a fetch waits for the slowest, not the sum.
    const std::vector<Batch> sent = send_round(pending, commands, what, round == 2, deadline);
    std::vector<Op> next;
    for (const Batch& batch : sent) read_batch(batch, what, deadline, max_reply_bytes, out, next);
    pending = std::move(next);
  }
  return out;
}

std::optional<std::vector<uint8_t>> RedisClusterStore::get(uint64_t key) {
  return std::move(get_many(std::span(&key, 1)).front());
}

std::vector<std::optional<std::vector<uint8_t>>> RedisClusterStore::get_many(std::span<const uint64_t> keys,
                                                                             size_t max_value_bytes) {
  std::vector<std::optional<std::vector<uint8_t>>> out(keys.size());
  if (keys.empty()) return out;
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (const uint64_t k : keys) names.push_back(redis_key(o_.prefix, k));
  std::vector<RedisCommand> cmds;
  for (const std::string& n : names) cmds.push_back({"GET", n});
  std::lock_guard lk(mu_);
  const std::vector<RedisReply> replies = run(keys, cmds, "GET", max_value_bytes);
  for (size_t i = 0; i < keys.size(); ++i) {
    const redisReply* r = replies[i].get();
    if (r && r->type == REDIS_REPLY_STRING)
      out[i] = std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(r->str),
                                    reinterpret_cast<const uint8_t*>(r->str) + r->len);
  }
  return out;
}

void RedisClusterStore::put(uint64_t key, std::span<const uint8_t> record) {
  const std::string k = redis_key(o_.prefix, key);
  const std::string_view value(reinterpret_cast<const char*>(record.data()), record.size());
  const std::string ttl = std::to_string(o_.ttl_seconds);
  // NX: a block another process published first is the same KV; keep it.
  const std::vector<RedisCommand> cmds{o_.ttl_seconds > 0 ? RedisCommand{"SET", k, value, "NX", "EX", ttl}
                                                          : RedisCommand{"SET", k, value, "NX"}};
  std::lock_guard lk(mu_);
  run(std::span(&key, 1), cmds, "SET");
}

void RedisClusterStore::remove(uint64_t key) {
  const std::string k = redis_key(o_.prefix, key);
  const std::vector<RedisCommand> cmds{{"DEL", k}};
  std::lock_guard lk(mu_);
  run(std::span(&key, 1), cmds, "DEL");
}

RedisClusterStore::Stats RedisClusterStore::stats() {
  std::lock_guard lk(mu_);
  return stats_;
}

std::string RedisClusterStore::last_error() {
  std::lock_guard lk(mu_);
  return last_error_;
}

std::optional<RedisAddress> RedisClusterStore::owner(uint64_t key) {
  std::lock_guard lk(mu_);
  const int o = owner_[redis_cluster_slot(redis_key(o_.prefix, key))];
  if (o < 0) return std::nullopt;
  return nodes_[o]->address;
}

}  // namespace depcache

#include "server/kv_event_publisher.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <cstdio>
#include <random>

#include "kv/redis_connection.h"

namespace depcache {

std::string new_epoch() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

KvEventPublisher::KvEventPublisher(std::shared_ptr<KvEventLog> log, KvEventPublisherOptions o,
                                   std::function<ReplicaLoad()> load)
    : log_(std::move(log)), o_(std::move(o)), load_(std::move(load)) {
  for (const RedisAddress& a : o_.nodes)
    conns_.push_back(std::make_unique<RedisConnection>(a.host, a.port, o_.redis));
  thread_ = std::thread([this] { run(); });
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t KvEventPublisher::published() const {
  std::lock_guard lk(mu_);
  return published_;
}

int64_t KvEventPublisher::lost() const {
  std::lock_guard lk(mu_);
  return lost_;
}

bool KvEventPublisher::send(const std::string& message) {
  std::string why;
  for (size_t tried = 0; tried < conns_.size(); ++tried) {
    RedisConnection& c = *conns_[(next_ + tried) % conns_.size()];
    const int64_t deadline = steady_now_ms() + o_.redis.timeout_ms;
    if (!c.open(deadline)) {
      why = c.error();
      continue;
    }
    const RedisReply r = c.command({"PUBLISH", o_.channel, message}, deadline);
    if (r && r->type == REDIS_REPLY_INTEGER) {
      next_ = (next_ + tried) % conns_.size();
      if (warned_) fmt::print(stderr, "kv events: published again\n");
      warned_ = false;
      return true;
    }
    why = r ? std::string(r->str, r->len) : c.error();
    c.close();
  }
  if (!warned_)
    fmt::print(stderr, "warning: kv events not published ({}); routers will read this replica's summary\n",
               why);
  warned_ = true;
  return false;
}

void KvEventPublisher::run() {
  auto last = std::chrono::steady_clock::now();
  ReplicaLoad last_load{-1, -1, -1};
  for (bool stopping = false; !stopping;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, o_.interval, [&] { return stop_; });
      stopping = stop_;
    }
    const auto now = std::chrono::steady_clock::now();
    // News: events, a change of load or a request ended (a router counts
    // what it sent here until the next report), or a heartbeat due.
    const ReplicaLoad load = load_();
    if (!log_->has_pending() && load == last_load && now - last < o_.heartbeat && !stopping) continue;
    last = now;
    last_load = load;
    KvEventHeader h = o_.header;
    h.running = load.running;
    h.waiting = load.waiting;
    const bool ok = send(seal_kv_events(o_.key.get(), kv_events_json(h, log_->take())));
    std::lock_guard lk(mu_);
    ++(ok ? published_ : lost_);
  }
}

}  // namespace depcache

#include "strategy/scheduler.h"

#include <algorithm>
#include <unordered_map>

#include "util/error.h"
#include "util/hash.h"

namespace depcache {
namespace {

int64_t matched_tokens(const RadixIndex& index, const WaitingRequest& r) {
  int64_t n = 0;
  for (const Lookup& l : *r.lookups) n += cached_length(index, l);
  return n;
}

// The first tokens of a run identify a group of requests sharing it.
uint64_t group_key(const Lookup& l) {
  return hash_bytes(l.tokens.data(), std::min<size_t>(l.tokens.size(), 8) * sizeof(int32_t), l.ns);
}

}  // namespace

std::vector<std::string> scheduler_names() { return {"fifo", "lpm", "lsp", "ragcache"}; }

void check_scheduler(std::string_view name) {
  const auto known = scheduler_names();
  if (std::find(known.begin(), known.end(), name) == known.end())
    fail(ErrorKind::InvalidInput, "unknown scheduler '{}' (expected fifo, lpm, lsp or ragcache)", name);
}

size_t pick_next(const SchedulerOptions& o, std::span<const WaitingRequest> queue, const RadixIndex& index) {
  if (queue.empty()) fail(ErrorKind::Internal, "scheduler: an empty queue");
  if (o.order == "fifo") return 0;
  for (size_t q = 0; q < queue.size(); ++q)
    if (*queue[q].passed_over >= o.starvation_bound) return q;  // waited long enough
  size_t pick = 0;
  if (o.order == "lpm") {
    int64_t best = -1;
    for (size_t q = 0; q < queue.size(); ++q)
      if (const int64_t m = matched_tokens(index, queue[q]); m > best) best = m, pick = q;
  } else if (o.order == "ragcache") {
    double best = -1;
    for (size_t q = 0; q < queue.size(); ++q) {
      const int64_t cached = std::min(matched_tokens(index, queue[q]), queue[q].prompt_tokens - 1);
      const double ratio = static_cast<double>(cached) /
                           static_cast<double>(std::max<int64_t>(queue[q].prompt_tokens - cached, 1));
      if (ratio > best) best = ratio, pick = q;
    }
  } else if (o.order == "lsp") {
    // A request counts once per group however many of its runs fall in it:
    // its own runs sharing a start (one entity's paths) are not sharing.
    std::vector<std::unordered_map<uint64_t, int64_t>> groups(queue.size());  // group -> its tokens there
    std::unordered_map<uint64_t, int64_t> holders;  // group -> waiting requests holding it
    for (size_t q = 0; q < queue.size(); ++q) {
      for (const Lookup& l : *queue[q].lookups)
        groups[q][group_key(l)] += static_cast<int64_t>(l.tokens.size());
      for (const auto& g : groups[q]) ++holders[g.first];
    }
    int64_t best = -1;
    for (size_t q = 0; q < queue.size(); ++q) {
      int64_t score = 0;
      for (const auto& [group, tokens] : groups[q]) score += (holders[group] - 1) * tokens;
      if (score > best) best = score, pick = q;
    }
  } else {
    check_scheduler(o.order);
  }
  return pick;
}

}  // namespace depcache

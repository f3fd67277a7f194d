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

namespace {

// The scheduler's picks from `queue`, the first `n` of them, each taken out
// of the queue with the others' passed-over counts (`passed`, by queue
// index) advanced: the oldest request passed over starvation_bound times,
// else the highest claim, the earliest on ties. Claims that depend on the
// index alone (lpm, ragcache) are read once; lsp's depend on who still
// waits, and are kept as requests leave.
std::vector<size_t> picks(const SchedulerOptions& o, std::span<const WaitingRequest> queue,
                          const RadixIndex& index, size_t n, std::vector<int>& passed) {
  std::vector<size_t> out;
  std::vector<size_t> left(queue.size());
  for (size_t q = 0; q < queue.size(); ++q) left[q] = q;
  std::vector<double> claim(queue.size(), 0.0);
  // lsp: a request counts once per group however many of its runs fall in
  // it: its own runs sharing a start (one entity's paths) are not sharing.
  std::vector<std::unordered_map<uint64_t, int64_t>> groups;  // group -> its tokens there
  std::unordered_map<uint64_t, int64_t> holders;              // group -> waiting requests holding it
  if (o.order == "lpm" || o.order == "ragcache") {
    for (size_t q = 0; q < queue.size(); ++q) {
      const int64_t matched = matched_tokens(index, queue[q]);
      if (o.order == "lpm") {
        claim[q] = static_cast<double>(matched);
      } else {
        const int64_t cached = std::min(matched, queue[q].prompt_tokens - 1);
        claim[q] = static_cast<double>(cached) /
                   static_cast<double>(std::max<int64_t>(queue[q].prompt_tokens - cached, 1));
      }
    }
  } else if (o.order == "lsp") {
    groups.resize(queue.size());
    for (size_t q = 0; q < queue.size(); ++q) {
      for (const Lookup& l : *queue[q].lookups)
        groups[q][group_key(l)] += static_cast<int64_t>(l.tokens.size());
      for (const auto& g : groups[q]) ++holders[g.first];
    }
  } else if (o.order != "fifo") {
    check_scheduler(o.order);
  }
  while (out.size() < n && !left.empty()) {
    size_t k = 0;  // index into left
    if (o.order != "fifo") {
      const auto starved =
          std::find_if(left.begin(), left.end(), [&](size_t q) { return passed[q] >= o.starvation_bound; });
      if (starved != left.end()) {
        k = static_cast<size_t>(starved - left.begin());
      } else {
        if (o.order == "lsp")
          for (size_t q : left) {
            int64_t score = 0;
            for (const auto& [group, tokens] : groups[q]) score += (holders[group] - 1) * tokens;
            claim[q] = static_cast<double>(score);
          }
        for (size_t i = 1; i < left.size(); ++i)
          if (claim[left[i]] > claim[left[k]]) k = i;
      }
    }
    const size_t q = left[k];
    out.push_back(q);
    left.erase(left.begin() + static_cast<std::ptrdiff_t>(k));
    for (size_t other : left) ++passed[other];
    if (o.order == "lsp")
      for (const auto& g : groups[q]) --holders[g.first];
  }
  return out;
}

std::vector<int> passed_counts(std::span<const WaitingRequest> queue) {
  std::vector<int> passed;
  for (const WaitingRequest& r : queue) passed.push_back(*r.passed_over);
  return passed;
}

}  // namespace

size_t pick_next(const SchedulerOptions& o, std::span<const WaitingRequest> queue, const RadixIndex& index) {
  if (queue.empty()) fail(ErrorKind::Internal, "scheduler: an empty queue");
  std::vector<int> passed = passed_counts(queue);
  return picks(o, queue, index, 1, passed).front();
}

std::vector<size_t> expected_order(const SchedulerOptions& o, std::span<const WaitingRequest> queue,
                                   const RadixIndex& index) {
  std::vector<int> passed = passed_counts(queue);
  return picks(o, queue, index, queue.size(), passed);
}

}  // namespace depcache

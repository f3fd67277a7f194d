#include "strategy/admission.h"

#include <algorithm>

#include "strategy/lookahead.h"

namespace depcache {

Admission::Admission(AdmissionOptions options)
    : options_(std::move(options)), window_(std::max<size_t>(options_.window, 1)) {
  check_scheduler(options_.scheduler.order);
}

size_t Admission::pick(std::span<const WaitingRequest> candidates, const RadixIndex& index) const {
  return pick_next(options_.scheduler, candidates.first(std::min(candidates.size(), window_)), index);
}

void Admission::admitted(std::span<const WaitingRequest> candidates, size_t chosen) {
  for (size_t i = 0; i < candidates.size(); ++i)
    if (i != chosen) ++*candidates[i].passed_over;
}

void Admission::refresh_lookahead(RadixIndex& index, std::span<const WaitingRequest> waiting) const {
  if (!options_.lookahead) return;
  waiting = waiting.first(std::min(waiting.size(), window_));
  std::vector<const std::vector<Lookup>*> queue;
  for (size_t i : expected_order(options_.scheduler, waiting, index)) queue.push_back(waiting[i].lookups);
  index.set_lookahead(lookahead_weights(index, queue));
}

}  // namespace depcache

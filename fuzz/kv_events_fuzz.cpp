// KV event batches and cache summaries as anyone who can write to the events
// channel, or answer in a replica's place, could send them: the router must
// refuse each bad one with a reason, never throw, and its view of the
// replicas must stay a well-formed answer to GET /replicas whatever it took.
// Input: messages separated by NUL bytes; a message's first byte picks what
// it is (events to a router without a key, events to a router with one, as
// sent or sealed with its key, or the summary of replica r1 or r2), the rest
// is its body. A router with a key must take nothing it did not see sealed
// with that key.
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_support.h"
#include "kv/kv_events.h"
#include "server/replica_router.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace depcache;
  static const auto key = std::make_shared<const MacKey>(std::vector<uint8_t>(32, 0x5a));
  RouterOptions keyed_options;
  keyed_options.events_key = key;
  const std::vector<ReplicaAddress> replicas = {{"r1", "http://127.0.0.1:1"}, {"r2", "http://127.0.0.1:2"}};
  ReplicaRouter router(replicas, RouterOptions{}), keyed(replicas, keyed_options);
  fuzz::Bytes in(data, size);
  for (int n = 0; n < 16 && !in.empty(); ++n) {
    const uint8_t kind = in.u8();
    const std::string_view body = in.until(0);
    std::string why;
    bool ok = false;
    // The routers the message went to: only their state can have changed.
    bool to_plain = false, to_keyed = false;
    try {
      switch (kind % 5) {
        case 0:
          to_plain = true;
          ok = router.apply_events(body, &why) == EventOutcome::Applied;
          break;
        case 1: {
          to_keyed = true;
          const EventOutcome o = keyed.apply_events(body, &why);
          ok = o == EventOutcome::Applied;
          if (o != EventOutcome::Refused)
            fuzz::violated("a keyed router took a batch not sealed with its key");
          break;
        }
        case 2:
          to_keyed = true;
          ok =
              keyed.apply_events(seal_kv_events(key.get(), std::string(body)), &why) == EventOutcome::Applied;
          break;
        default:
          to_plain = to_keyed = true;
          ok = router.apply_summary(kind % 5 == 3 ? "r1" : "r2", body, &why);
          if (keyed.apply_summary(kind % 5 == 3 ? "r1" : "r2", body, &why) != ok)
            fuzz::violated("a summary was taken by one router and not the other");
      }
    } catch (...) {
      fuzz::violated("a message made the router throw");
    }
    if (!ok && why.empty()) fuzz::violated("a message not applied without a reason");
    for (const ReplicaRouter* r : {&router, &keyed}) {
      if (!(r == &router ? to_plain : to_keyed)) continue;
      const nlohmann::json state = nlohmann::json::parse(r->state_json(), nullptr, false);
      if (!state.is_array() || state.size() != 2)
        fuzz::violated("GET /replicas is not an array of both replicas");
      for (const nlohmann::json& s : state)
        if (!s["blocks"].is_number_unsigned() || !s["synced"].is_boolean() || !s["epoch"].is_string() ||
            s["running"].get<int64_t>() > (int64_t{1} << 20) ||
            s["waiting"].get<int64_t>() > (int64_t{1} << 20))
          fuzz::violated("a replica's state lost its shape or its bounds");
    }
  }
  return 0;
}

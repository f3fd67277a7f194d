// KV event batches and cache summaries as anyone who can write to the events
// channel, or answer in a replica's place, could send them: the router must
// refuse each bad one with a reason, never throw, and its view of the
// replicas must stay a well-formed answer to GET /replicas whatever it took.
// Input: messages separated by NUL bytes; a message's first byte picks what
// it is (events, or the summary of replica r1 or r2), the rest is its body.
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_support.h"
#include "server/replica_router.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace depcache;
  ReplicaRouter router({{"r1", "http://127.0.0.1:1"}, {"r2", "http://127.0.0.1:2"}}, RouterOptions{});
  fuzz::Bytes in(data, size);
  for (int n = 0; n < 16 && !in.empty(); ++n) {
    const uint8_t kind = in.u8();
    const std::string_view body = in.until(0);
    std::string why;
    bool ok = false;
    try {
      if (kind % 3 == 0)
        ok = router.apply_events(body, &why);
      else
        ok = router.apply_summary(kind % 3 == 1 ? "r1" : "r2", body, &why);
    } catch (...) {
      fuzz::violated("a message made the router throw");
    }
    if (!ok && why.empty()) fuzz::violated("a refused message without a reason");
    const nlohmann::json state = nlohmann::json::parse(router.state_json(), nullptr, false);
    if (!state.is_array() || state.size() != 2)
      fuzz::violated("GET /replicas is not an array of both replicas");
    for (const nlohmann::json& r : state)
      if (!r["blocks"].is_number_unsigned() || !r["synced"].is_boolean() || !r["epoch"].is_string())
        fuzz::violated("a replica's state lost its shape");
  }
  return 0;
}

// Replies to CLUSTER SLOTS, as a hostile or broken node could send them: the
// bytes are read off the wire by hiredis's own reader, guarded as every
// connection's is (an array's announced count is bounded before hiredis
// allocates for it, and a reply's strings together are bounded), and every
// reply is either refused with a reason or becomes a slot map whose ranges
// are in bounds, do not overlap and name a real port.
#include <hiredis/hiredis.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "kv/redis_cluster_store.h"
#include "kv/redis_connection.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace depcache;
  redisReader* reader = redisReaderCreate();
  RespGuard guard;
  guard_resp_reader(reader, &guard);
  guard.max_bytes = 4096;
  const int64_t& refused = guard.refused_array;
  redisReaderFeed(reader, reinterpret_cast<const char*>(data), size);
  const RedisAddress asked{"10.1.2.3", 7000};
  for (int n = 0; n < 8; ++n) {
    void* out = nullptr;
    if (redisReaderGetReply(reader, &out) != REDIS_OK || !out) {
      if (refused > 0 && refused <= kMaxRespArrayElements)
        fuzz::violated("an array refused within the bound");
      break;
    }
    const RedisReply reply(static_cast<redisReply*>(out));
    if (guard.bytes > guard.max_bytes) fuzz::violated("a reply past its byte bound was made");
    guard.next_reply();
    std::string why;
    const auto ranges = parse_cluster_slots(*reply, asked, &why);
    if (!ranges) {
      if (why.empty()) fuzz::violated("a refused map without a reason");
      continue;
    }
    std::vector<bool> taken(kRedisClusterSlots, false);
    for (const RedisSlotRange& r : *ranges) {
      if (r.first < 0 || r.last < r.first || r.last >= kRedisClusterSlots)
        fuzz::violated("a range out of bounds");
      if (r.master.port <= 0 || r.master.port > 65535 || r.master.host.empty())
        fuzz::violated("a master without host and port");
      for (int s = r.first; s <= r.last; ++s) {
        if (taken[s]) fuzz::violated("a slot given twice");
        taken[s] = true;
      }
    }
  }
  redisReaderFree(reader);
  return 0;
}

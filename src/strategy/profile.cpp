#include "strategy/profile.h"

namespace depcache {

SystemProfile system_profile(std::string_view strategy) {
  SystemProfile p;
  if (strategy == "depcache") {
    p.policy = "lacr";
  } else if (strategy == "ragcache") {
    p.policy = "pgdsf";
    p.scheduler = "ragcache";
    // RAGCache keeps the knowledge tree in GPU memory and a larger host
    // memory below it; here the hot tier and a host tier four times its size.
    p.host_tier_ratio = 4;
    p.swap_out_once = true;
  } else if (strategy == "cachecraft") {
    p.policy = "cachecraft";
  }
  return p;
}

}  // namespace depcache

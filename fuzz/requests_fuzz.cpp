// Request files (JSONL, one request per line): any bytes either load or are
// refused with an InvalidInput error naming the line; what loads is a sound
// request (a question or a text, at most one kind of context) and survives
// writing back as JSON and reading again unchanged.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "retrieval/rag_request.h"
#include "util/error.h"

namespace {

using depcache::RagRequest;
using depcache::fuzz::violated;

bool same(const RagRequest& a, const RagRequest& b) {
  return a.id == b.id && a.arrival_s == b.arrival_s && a.question == b.question && a.answers == b.answers &&
         a.text == b.text && a.documents == b.documents && a.entities == b.entities;
}

void check(const RagRequest& r) {
  if (r.id.empty()) violated("a request without an id");
  if (r.question.empty() && r.text.empty()) violated("a request with neither question nor text");
  if (!r.text.empty() + !r.documents.empty() + !r.entities.empty() > 1) violated("several kinds of context");
  if (!std::isfinite(r.arrival_s) || r.arrival_s < 0) violated("a bad arrival time");
  for (const auto& e : r.entities)
    if (e.name.empty() || e.label.empty()) violated("an entity without a name or label");
  // Written as write_requests writes it, then read again.
  const std::string line =
      depcache::request_to_json(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  const RagRequest back = depcache::request_from_json(nlohmann::json::parse(line), "again");
  if (!same(back, r)) violated("a request changed when written and read again");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::vector<RagRequest> requests;
  try {
    requests = depcache::read_requests(in, "fuzz.jsonl");
  } catch (const depcache::Error& e) {
    if (e.kind() != depcache::ErrorKind::InvalidInput)
      violated("a request file refused other than InvalidInput");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "read_requests threw: %s\n", e.what());
    violated("read_requests threw something other than depcache::Error");
  }
  try {
    for (const RagRequest& r : requests) check(r);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "writing and reading a request again threw: %s\n", e.what());
    violated("a loaded request does not survive writing and reading again");
  }
  return 0;
}

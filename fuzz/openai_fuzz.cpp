// Any body given to the completions or chat endpoint is either a request the
// engine can run or an ApiError (4xx) whose OpenAI error object serialises:
// the parser throws nothing else, and the error body never fails to dump
// (it may quote the client's bytes, which need not be UTF-8).
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string_view>

#include "fuzz_support.h"
#include "server/openai.h"

namespace {

using depcache::fuzz::violated;

void check_request(const depcache::CompletionRequest& r) {
  const depcache::SamplingParams& s = r.sampling;
  if (s.max_tokens < 1 || s.max_tokens > (1 << 20)) violated("max_tokens out of range");
  if (!(s.sampler.temperature >= 0 && s.sampler.temperature <= 2)) violated("temperature out of range");
  if (!(s.sampler.top_p > 0 && s.sampler.top_p <= 1)) violated("top_p out of range");
  if (s.stop.size() > 4) violated("more than 4 stop strings");
  if (r.kind == depcache::ApiKind::Completion) {
    if (r.prompt.empty()) violated("empty prompt accepted");
  } else {
    // The user's message last, or the assistant's, which the reply continues
    // (prefill); with the RAG extension the user's (the question).
    if (r.messages.empty() || r.messages.back().role == "system")
      violated("chat ending with a system message");
    if (r.rag && r.messages.back().role != "user") violated("RAG chat not ending with the user's question");
    for (const auto& m : r.messages)
      if (m.role != "system" && m.role != "user" && m.role != "assistant") violated("unknown role accepted");
  }
  if (r.rag && r.rag->retrieve) {
    const depcache::RetrieveSpec& spec = *r.rag->retrieve;
    if (spec.hops < 1 || spec.hops > 4 || spec.top_k > 1000 || spec.max_entities < 1 ||
        spec.max_entities > 100)
      violated("retrieve spec out of range");
  }
}

template <typename Parse>
void run(Parse parse, std::string_view body) {
  try {
    check_request(parse(body, 42));
  } catch (const depcache::ApiError& e) {
    if (e.status < 400 || e.status > 499) violated("ApiError with a status outside 4xx");
    try {
      const std::string text = depcache::error_body(e).dump();
      if (text.empty()) violated("empty error body");
    } catch (const std::exception& x) {
      std::fprintf(stderr, "error_body(e).dump() threw: %s\n", x.what());
      violated("the error body does not serialise");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "the parser threw something other than ApiError: %s\n", e.what());
    violated("a non-ApiError exception from the request parser");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  run(depcache::parse_completion_request, body);
  run(depcache::parse_chat_request, body);
  return 0;
}

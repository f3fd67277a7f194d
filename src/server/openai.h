#pragma once
// The OpenAI completions and chat APIs as depcache serves them: a request body parsed
// into what the engine runs, and the JSON of responses, stream chunks and
// errors. Unknown fields are ignored (clients send many); known fields of the
// wrong type or out of range are errors naming the field.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "prompt/chat_template.h"
#include "retrieval/rag_request.h"

namespace depcache {

// An error answered to the client: HTTP status and OpenAI's error object.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type = "invalid_request_error",
           std::string param = {}, std::string code = {})
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type, param, code;
};
// The 400 of a request parameter that is missing or wrong.
inline ApiError bad_request(const std::string& param, const std::string& message) {
  return ApiError(400, message, "invalid_request_error", param);
}
nlohmann::json error_body(const ApiError& e);

// The "rag" object of a request: what depcache adds to the OpenAI API.
struct RetrieveSpec {
  std::string from;          // "corpus" or "kg"; empty: whichever the server loaded
  size_t top_k = 0;          // chunks, or paths per entity (0: 5 chunks, 30 paths)
  size_t max_entities = 10;  // entities linked from the question
  int hops = 2;              // longest relation path
};
struct RagExtension {
  std::string strategy;  // empty: the server's default
  // Context given with the request (documents, entities or text); the
  // question is filled in by the server from the prompt or the last user
  // message.
  RagRequest context;
  std::optional<RetrieveSpec> retrieve;  // context looked up by the server instead
};

enum class ApiKind { Completion, Chat };

struct CompletionRequest {
  ApiKind kind = ApiKind::Completion;
  std::string model;                  // empty: the served one
  std::string prompt;                 // completions
  std::vector<ChatMessage> messages;  // chat
  bool stream = false;
  bool include_usage = true;  // usage in the last stream chunk
  SamplingParams sampling;    // max_tokens 16, temperature 1, top_p 1, seed (random if absent), stop
  std::optional<RagExtension> rag;
};
// /v1/completions and /v1/chat/completions bodies. Throws ApiError (400)
// naming the field at fault.
CompletionRequest parse_completion_request(std::string_view body, uint64_t random_seed);
CompletionRequest parse_chat_request(std::string_view body, uint64_t random_seed);

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, computed_tokens = 0, reused_tokens = 0;
  int64_t reused_from[RadixIndex::kTiers] = {};  // reused tokens by the tier they were found in
};
// OpenAI's usage (prompt_tokens_details.cached_tokens = reused) plus
// computed_tokens, reused_tokens and reused_from {hot, host, disk, remote}.
nlohmann::json usage_json(const Usage& u);
// "stop" for an end-of-generation token or a stop string, "length" for max_tokens.
const char* finish_reason_name(FinishReason r);
// A whole response (chunk false) or one server-sent event of a streamed one
// (chunk true): a piece of text, and at the end the reason (and usage). A
// chat stream's first event is the assistant's role (empty text, no reason).
nlohmann::json completion_json(ApiKind kind, bool chunk, const std::string& id, int64_t created,
                               const std::string& model, const std::string& text,
                               std::optional<FinishReason> reason, const std::optional<Usage>& usage);

}  // namespace depcache

#pragma once
// The OpenAI completions API as depcache serves it: a request body parsed
// into what the engine runs, and the JSON of responses, stream chunks and
// errors. Unknown fields are ignored (clients send many); known fields of the
// wrong type or out of range are errors naming the field.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "engine/engine.h"

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
nlohmann::json error_body(const ApiError& e);

struct CompletionRequest {
  std::string model;  // empty: the served one
  std::string prompt;
  bool stream = false;
  bool include_usage = true;  // usage in the last stream chunk
  SamplingParams sampling;    // max_tokens 16, temperature 1, top_p 1, seed (random if absent), stop
};
// Throws ApiError (400) naming the field at fault.
CompletionRequest parse_completion_request(std::string_view body, uint64_t random_seed);

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, computed_tokens = 0, reused_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);
// "stop" for an end-of-generation token or a stop string, "length" for max_tokens.
const char* finish_reason_name(FinishReason r);
// A completion, or one server-sent event of a streamed one (the same
// object): a piece of text, and at the end the reason (and usage).
nlohmann::json completion_json(const std::string& id, int64_t created, const std::string& model,
                               const std::string& text, std::optional<FinishReason> reason,
                               const std::optional<Usage>& usage);

}  // namespace depcache

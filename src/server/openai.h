#pragma once
// The OpenAI completions and chat APIs as depcache serves them: a request body parsed
// into what the engine runs, and the JSON of responses, stream chunks and
// errors. Every field is honoured or refused: fields of the wrong type or out
// of range, OpenAI fields that would change the answer in ways not served
// (tools, JSON mode, echo, ...) and unknown fields are errors naming the
// field; metadata that changes nothing (user, metadata) is accepted.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "prompt/chat_template.h"
#include "retrieval/rag_request.h"
#include "server/request_prompt.h"

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
// OpenAI's error object; the message is made valid UTF-8 (it may quote the
// client's bytes).
nlohmann::json error_body(const ApiError& e);
// A response body as text: strings that are not valid UTF-8 (echoes of what a
// client sent) are written with U+FFFD instead of failing.
std::string json_text(const nlohmann::json& j);
// Request bodies nested deeper than this are refused (400).
inline constexpr int kMaxJsonDepth = 64;

// The "rag" object of a request: what depcache adds to the OpenAI API.
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
  // max_tokens 16, temperature 1, top_p 1, seed (random if absent), stop,
  // penalties, logit_bias, logprobs (-1: none)
  SamplingParams sampling;
  // vLLM's field of the same name: KV is reused only between requests that
  // give the same salt (and come under the same API key namespace).
  std::string cache_salt;
  // Set by the server from the API key's namespace and cache_salt
  // (PromptParts::cache_scope).
  uint64_t cache_scope = 0;
  std::optional<RagExtension> rag;
};
// /v1/completions and /v1/chat/completions bodies. Throws ApiError (400)
// naming the field at fault.
CompletionRequest parse_completion_request(std::string_view body, uint64_t random_seed);
CompletionRequest parse_chat_request(std::string_view body, uint64_t random_seed);
// What the request says about its prompt (views into `r`).
PromptRequest prompt_request(const CompletionRequest& r);
// The cache scope of an API key's namespace and a request's cache_salt (0:
// the shared scope, both empty).
uint64_t cache_scope_of(const std::string& key_namespace, const std::string& cache_salt);
// What needs the served vocabulary: logit_bias ids (400 naming the id).
void check_vocab(const CompletionRequest& r, int32_t n_vocab);

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, computed_tokens = 0, reused_tokens = 0;
  int64_t reused_from[RadixIndex::kTiers] = {};  // reused tokens by the tier they were found in
};
// OpenAI's usage (prompt_tokens_details.cached_tokens = reused) plus
// computed_tokens, reused_tokens and reused_from {hot, host, disk, remote}.
nlohmann::json usage_json(const Usage& u);
// "stop" for an end-of-generation token or a stop string, "length" for max_tokens.
const char* finish_reason_name(FinishReason r);
// choices[].logprobs of some generated tokens: the completions API's
// {tokens, token_logprobs, top_logprobs (the top ones and the picked token,
// by token text), text_offset}, or chat's {content: [{token, logprob, bytes,
// top_logprobs: [{token, logprob, bytes}]}], refusal}.
nlohmann::json logprobs_json(ApiKind kind, const Tokenizer& tok, std::span<const OutputLogprob> logprobs);
// A whole response (chunk false) or one server-sent event of a streamed one
// (chunk true): a piece of text (with its tokens' logprobs, or null), and at
// the end the reason (and usage). A chat stream's first event is the
// assistant's role (empty text, no reason).
nlohmann::json completion_json(ApiKind kind, bool chunk, const std::string& id, int64_t created,
                               const std::string& model, const std::string& text,
                               std::optional<FinishReason> reason, const std::optional<Usage>& usage,
                               const nlohmann::json& logprobs = nullptr);

}  // namespace depcache

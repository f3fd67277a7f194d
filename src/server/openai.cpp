#include "server/openai.h"

namespace depcache {
namespace {

using nlohmann::json;

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError(400, message, "invalid_request_error", param);
}

double number(const json& body, const char* key, double lo, double hi, double fallback) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number()) throw bad(key, fmt::format("'{}' must be a number", key));
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi))
    throw bad(key, fmt::format("'{}' must be between {} and {}, not {}", key, lo, hi, v));
  return v;
}

}  // namespace

json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.what()},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

CompletionRequest parse_completion_request(std::string_view body, uint64_t random_seed) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, fmt::format("the body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw ApiError(400, "the body must be a JSON object");
  CompletionRequest r;
  if (const auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) throw bad("model", "'model' must be a string");
    r.model = it->get<std::string>();
  }
  const auto prompt = j.find("prompt");
  if (prompt == j.end()) throw bad("prompt", "'prompt' is required");
  if (prompt->is_string()) {
    r.prompt = prompt->get<std::string>();
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    r.prompt = (*prompt)[0].get<std::string>();
  } else {
    throw bad("prompt", "'prompt' must be a string (or an array of one string)");
  }
  if (r.prompt.empty()) throw bad("prompt", "'prompt' is empty");
  if (const auto it = j.find("stream"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) throw bad("stream", "'stream' must be true or false");
    r.stream = it->get<bool>();
  }
  if (const auto it = j.find("stream_options"); it != j.end() && it->is_object())
    if (const auto u = it->find("include_usage"); u != it->end() && u->is_boolean())
      r.include_usage = u->get<bool>();
  SamplingParams& s = r.sampling;
  s.max_tokens = 16;
  if (const auto it = j.find("max_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 20))
      throw bad("max_tokens", "'max_tokens' must be an integer of at least 1");
    s.max_tokens = static_cast<int>(it->get<int64_t>());
  }
  s.sampler.temperature = static_cast<float>(number(j, "temperature", 0, 2, 1));
  s.sampler.top_p = static_cast<float>(number(j, "top_p", 0, 1, 1));
  if (s.sampler.top_p <= 0) throw bad("top_p", "'top_p' must be above 0");
  s.sampler.top_k = 0;  // not an OpenAI parameter: off
  s.sampler.min_p = 0;
  s.sampler.seed = random_seed;
  if (const auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) throw bad("seed", "'seed' must be an integer");
    s.sampler.seed = static_cast<uint64_t>(it->get<int64_t>());
  }
  if (const auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      s.stop = {it->get<std::string>()};
    } else if (it->is_array() && it->size() <= 4 &&
               std::all_of(it->begin(), it->end(), [](const json& x) { return x.is_string(); })) {
      for (const json& x : *it) s.stop.push_back(x.get<std::string>());
    } else {
      throw bad("stop", "'stop' must be a string or an array of at most 4 strings");
    }
  }
  return r;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"computed_tokens", u.computed_tokens},
          {"reused_tokens", u.reused_tokens}};
}

const char* finish_reason_name(FinishReason r) { return r == FinishReason::Length ? "length" : "stop"; }

json completion_json(const std::string& id, int64_t created, const std::string& model,
                     const std::string& text, std::optional<FinishReason> reason,
                     const std::optional<Usage>& usage) {
  json j = {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", model},
            {"choices",
             json::array({{{"text", text},
                           {"index", 0},
                           {"logprobs", nullptr},
                           {"finish_reason", reason ? json(finish_reason_name(*reason)) : json(nullptr)}}})}};
  if (usage) j["usage"] = usage_json(*usage);
  return j;
}

}  // namespace depcache

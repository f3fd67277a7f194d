#include "server/openai.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "strategy/strategy.h"
#include "strategy/subgcache.h"
#include "util/error.h"

namespace depcache {
namespace {

using nlohmann::json;

double number(const json& body, const char* key, double lo, double hi, double fallback) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number()) throw bad_request(key, fmt::format("'{}' must be a number", key));
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi))
    throw bad_request(key, fmt::format("'{}' must be between {} and {}, not {}", key, lo, hi, v));
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

namespace {

json parse_object(std::string_view body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, fmt::format("the body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw ApiError(400, "the body must be a JSON object");
  return j;
}

size_t count(const json& obj, const char* key, const std::string& param, size_t lo, size_t hi,
             size_t fallback) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < static_cast<int64_t>(lo) ||
      it->get<int64_t>() > static_cast<int64_t>(hi))
    throw bad_request(param, fmt::format("'{}' must be an integer from {} to {}", param, lo, hi));
  return static_cast<size_t>(it->get<int64_t>());
}

RagExtension parse_rag(const json& j, const std::string& question) {
  if (!j.is_object()) throw bad_request("rag", "'rag' must be an object");
  RagExtension rag;
  if (const auto it = j.find("strategy"); it != j.end() && !it->is_null()) {
    const std::vector<std::string> known = request_strategy_names();
    if (!it->is_string() || std::find(known.begin(), known.end(), it->get<std::string>()) == known.end())
      throw bad_request("rag.strategy",
                        fmt::format("'rag.strategy' must be one of {}", fmt::join(known, ", ")));
    rag.strategy = it->get<std::string>();
  }
  json context = j;
  context["question"] = question;
  try {
    rag.context = request_from_json(context, "rag");
  } catch (const Error& e) {
    throw bad_request("rag", e.what());
  }
  if (const auto it = j.find("retrieve"); it != j.end() && !it->is_null() && *it != false) {
    if (!rag.context.documents.empty() || !rag.context.entities.empty() || !rag.context.text.empty())
      throw bad_request("rag.retrieve",
                        "give 'rag.retrieve' or context (documents, entities, text), not both");
    RetrieveSpec spec;
    if (it->is_object()) {
      if (const auto from = it->find("from"); from != it->end() && !from->is_null()) {
        if (!from->is_string() || (*from != "corpus" && *from != "kg"))
          throw bad_request("rag.retrieve.from", "'rag.retrieve.from' must be \"corpus\" or \"kg\"");
        spec.from = from->get<std::string>();
      }
      spec.top_k = count(*it, "top_k", "rag.retrieve.top_k", 1, 1000, 0);
      spec.max_entities = count(*it, "entities", "rag.retrieve.entities", 1, 100, spec.max_entities);
      spec.hops = static_cast<int>(count(*it, "hops", "rag.retrieve.hops", 1, 4, 2));
    } else if (*it != true) {
      throw bad_request("rag.retrieve", "'rag.retrieve' must be true or an object");
    }
    rag.retrieve = spec;
  }
  return rag;
}

// What both endpoints share: model, streaming, sampling, the RAG extension.
void parse_common(const json& j, const std::string& question, CompletionRequest& r, uint64_t random_seed) {
  if (const auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) throw bad_request("model", "'model' must be a string");
    r.model = it->get<std::string>();
  }
  if (const auto it = j.find("n"); it != j.end() && !it->is_null() && *it != 1)
    throw bad_request("n", "only one choice per request is served ('n' must be 1)");
  if (const auto it = j.find("stream"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) throw bad_request("stream", "'stream' must be true or false");
    r.stream = it->get<bool>();
  }
  if (const auto it = j.find("stream_options"); it != j.end() && it->is_object())
    if (const auto u = it->find("include_usage"); u != it->end() && u->is_boolean())
      r.include_usage = u->get<bool>();
  SamplingParams& s = r.sampling;
  s.max_tokens = 16;
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    s.max_tokens = static_cast<int>(count(j, key, key, 1, 1 << 20, static_cast<size_t>(s.max_tokens)));
  s.sampler.temperature = static_cast<float>(number(j, "temperature", 0, 2, 1));
  s.sampler.top_p = static_cast<float>(number(j, "top_p", 0, 1, 1));
  if (s.sampler.top_p <= 0) throw bad_request("top_p", "'top_p' must be above 0");
  s.sampler.top_k = 0;  // not an OpenAI parameter: off
  s.sampler.min_p = 0;
  s.sampler.seed = random_seed;
  if (const auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) throw bad_request("seed", "'seed' must be an integer");
    s.sampler.seed = static_cast<uint64_t>(it->get<int64_t>());
  }
  // Not an OpenAI parameter; vLLM and llama.cpp's server take it too: generate
  // max_tokens whatever the model emits (benchmarks, comparisons with `run`).
  if (const auto it = j.find("ignore_eos"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) throw bad_request("ignore_eos", "'ignore_eos' must be true or false");
    s.stop_at_eog = !it->get<bool>();
  }
  if (const auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      s.stop = {it->get<std::string>()};
    } else if (it->is_array() && it->size() <= 4 &&
               std::all_of(it->begin(), it->end(), [](const json& x) { return x.is_string(); })) {
      for (const json& x : *it) s.stop.push_back(x.get<std::string>());
    } else {
      throw bad_request("stop", "'stop' must be a string or an array of at most 4 strings");
    }
  }
  if (const auto it = j.find("rag"); it != j.end() && !it->is_null()) r.rag = parse_rag(*it, question);
}

// A message's content: a string, or an array of text parts.
std::string message_content(const json& c, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return {};
  std::string out;
  if (c.is_array()) {
    for (const json& part : c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string())
        throw bad_request(param,
                          fmt::format("'{}' parts must be {{\"type\": \"text\", \"text\": ...}}", param));
      out += part["text"].get<std::string>();
    }
    return out;
  }
  throw bad_request(param, fmt::format("'{}' must be a string or an array of text parts", param));
}

}  // namespace

CompletionRequest parse_completion_request(std::string_view body, uint64_t random_seed) {
  const json j = parse_object(body);
  CompletionRequest r;
  const auto prompt = j.find("prompt");
  if (prompt == j.end()) throw bad_request("prompt", "'prompt' is required");
  if (prompt->is_string()) {
    r.prompt = prompt->get<std::string>();
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    r.prompt = (*prompt)[0].get<std::string>();
  } else {
    throw bad_request("prompt", "'prompt' must be a string (or an array of one string)");
  }
  if (r.prompt.empty()) throw bad_request("prompt", "'prompt' is empty");
  parse_common(j, r.prompt, r, random_seed);
  return r;
}

CompletionRequest parse_chat_request(std::string_view body, uint64_t random_seed) {
  const json j = parse_object(body);
  CompletionRequest r;
  r.kind = ApiKind::Chat;
  const auto messages = j.find("messages");
  if (messages == j.end() || !messages->is_array() || messages->empty())
    throw bad_request("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw bad_request(fmt::format("messages[{}]", i),
                        fmt::format("messages[{}] must be an object with a 'role'", i));
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for it
    if (role != "system" && role != "user" && role != "assistant")
      throw bad_request(
          fmt::format("messages[{}].role", i),
          fmt::format("messages[{}].role '{}' is not served (system, user or assistant)", i, role));
    r.messages.push_back({role, message_content(m.contains("content") ? m["content"] : json(), i)});
  }
  if (r.messages.back().role != "user") throw bad_request("messages", "the last message must be the user's");
  parse_common(j, r.messages.back().content, r, random_seed);
  return r;
}

json usage_json(const Usage& u) {
  json from;
  for (int t = 0; t < RadixIndex::kTiers; ++t) from[tier_name(static_cast<Tier>(t))] = u.reused_from[t];
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.reused_tokens}}},
          {"computed_tokens", u.computed_tokens},
          {"reused_tokens", u.reused_tokens},
          {"reused_from", std::move(from)}};
}

const char* finish_reason_name(FinishReason r) { return r == FinishReason::Length ? "length" : "stop"; }

json completion_json(ApiKind kind, bool chunk, const std::string& id, int64_t created,
                     const std::string& model, const std::string& text, std::optional<FinishReason> reason,
                     const std::optional<Usage>& usage) {
  json choice = {{"index", 0},
                 {"logprobs", nullptr},
                 {"finish_reason", reason ? json(finish_reason_name(*reason)) : json(nullptr)}};
  const char* object = "text_completion";
  if (kind == ApiKind::Completion) {
    choice["text"] = text;
  } else if (!chunk) {
    object = "chat.completion";
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    object = "chat.completion.chunk";
    if (!text.empty())
      choice["delta"] = {{"content", text}};
    else if (!reason)
      choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    else
      choice["delta"] = json::object();
  }
  json j = {{"id", id},
            {"object", object},
            {"created", created},
            {"model", model},
            {"choices", json::array({choice})}};
  if (usage) j["usage"] = usage_json(*usage);
  return j;
}

}  // namespace depcache

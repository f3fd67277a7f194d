#include "server/openai.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "model/tokenizer.h"
#include "strategy/strategy.h"
#include "strategy/subgcache.h"
#include "util/error.h"
#include "util/hash.h"

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
  // The message may quote the client's bytes (a path, a parser's view of the
  // body): made valid UTF-8 here, so that serialising it cannot fail.
  std::string bytes = e.what(), message;
  drain_utf8(bytes, message, true);
  return {{"error",
           {{"message", std::move(message)},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace {

json parse_object(std::string_view body) {
  json j;
  try {
    // Values nested deeper than any request needs are refused while parsing:
    // copying or destroying a very deep value recurses once per level.
    const json::parser_callback_t depth_limit = [](int depth, json::parse_event_t event, json&) {
      if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
          depth >= kMaxJsonDepth)
        throw ApiError(400,
                       fmt::format("the body nests objects and arrays more than {} deep", kMaxJsonDepth));
      return true;
    };
    j = json::parse(body, depth_limit);
  } catch (const json::exception& e) {
    // Parse errors, and numbers out of range (1e400).
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

// The parameters each endpoint honours (or checks and accepts as metadata
// that changes nothing); any other is refused, so that a client never gets an
// answer that silently ignored what it asked for.
bool known_parameter(ApiKind kind, const std::string& key) {
  static const std::set<std::string, std::less<>> common = {"model",
                                                            "n",
                                                            "stream",
                                                            "stream_options",
                                                            "max_tokens",
                                                            "max_completion_tokens",
                                                            "temperature",
                                                            "top_p",
                                                            "top_k",
                                                            "min_p",
                                                            "seed",
                                                            "stop",
                                                            "presence_penalty",
                                                            "frequency_penalty",
                                                            "logit_bias",
                                                            "logprobs",
                                                            "ignore_eos",
                                                            "rag",
                                                            "cache_salt",
                                                            "user",
                                                            "metadata",
                                                            "store",
                                                            "service_tier",
                                                            "prompt_cache_key",
                                                            "safety_identifier"};
  static const std::set<std::string, std::less<>> completion = {"prompt", "best_of", "echo", "suffix"};
  static const std::set<std::string, std::less<>> chat = {
      "messages",      "top_logprobs",        "tools",           "tool_choice", "functions",
      "function_call", "parallel_tool_calls", "response_format", "modalities",  "audio"};
  return common.count(key) || (kind == ApiKind::Completion ? completion : chat).count(key);
}

// OpenAI parameters that would change the answer in ways not served: refused
// unless absent or set to what changes nothing.
void refuse_unserved(const json& j, ApiKind kind) {
  const auto given = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && !it->is_null() ? &*it : nullptr;
  };
  const auto refuse = [](const char* key, const std::string& why) {
    throw bad_request(key, fmt::format("'{}' is not supported by this server: {}", key, why));
  };
  if (kind == ApiKind::Completion) {
    if (const json* v = given("best_of"); v && *v != 1)
      refuse("best_of", "one completion is generated per request ('best_of' must be 1)");
    if (const json* v = given("echo"); v && *v != false) refuse("echo", "the prompt is not echoed");
    if (const json* v = given("suffix"); v && *v != "") refuse("suffix", "there is no insertion mode");
    if (given("top_logprobs"))
      refuse("top_logprobs", "on /v1/completions ask for the top N with 'logprobs': N");
    return;
  }
  for (const char* key : {"tools", "functions"})
    if (const json* v = given(key); v && !(v->is_array() && v->empty()))
      refuse(key, "tool and function calling are not served");
  for (const char* key : {"tool_choice", "function_call"})
    if (const json* v = given(key); v && *v != "none")
      refuse(key, "tool and function calling are not served");
  if (const json* v = given("parallel_tool_calls"); v && !v->is_boolean())
    throw bad_request("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
  if (const json* v = given("response_format"); v && *v != json{{"type", "text"}})
    refuse("response_format", "only {\"type\": \"text\"} is served (no JSON mode or JSON schema)");
  if (const json* v = given("modalities"); v && *v != json::array({"text"}))
    refuse("modalities", "only [\"text\"] is served");
  if (given("audio")) refuse("audio", "only text is served");
}

// logit_bias: {"token id": bias in [-100, 100]}; the ids are checked against
// the vocabulary by check_vocab().
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& v) {
  if (!v.is_object())
    throw bad_request("logit_bias", "'logit_bias' must be an object of token ids (strings) to numbers");
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, bias] : v.items()) {
    const bool digits = !key.empty() && key.size() <= 9 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits)
      throw bad_request("logit_bias",
                        fmt::format("logit_bias: '{}' is not a token id (a non-negative integer)", key));
    if (!bias.is_number() || !(bias.get<double>() >= -100 && bias.get<double>() <= 100))
      throw bad_request("logit_bias",
                        fmt::format("logit_bias of token {} must be a number from -100 to 100", key));
    out.emplace_back(std::stoi(key), bias.get<float>());
  }
  return out;
}

// model, n, stream and stream_options.
void parse_delivery(const json& j, CompletionRequest& r) {
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
  if (const auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_request("stream_options", "'stream_options' must be an object");
    for (const auto& [key, value] : it->items()) {
      const std::string param = "stream_options." + key;
      // include_obfuscation pads chunks against side channels; unpadded ones read the same.
      if (key != "include_usage" && key != "include_obfuscation")
        throw bad_request(param, fmt::format("unknown parameter '{}'", param));
      if (!value.is_boolean() && !value.is_null())
        throw bad_request(param, fmt::format("'{}' must be true or false", param));
    }
    if (const auto u = it->find("include_usage"); u != it->end() && u->is_boolean())
      r.include_usage = u->get<bool>();
  }
}

// Metadata that changes nothing: accepted once it has the documented type.
void check_metadata(const json& j) {
  for (const char* key : {"user", "service_tier", "prompt_cache_key", "safety_identifier"})
    if (const auto it = j.find(key); it != j.end() && !it->is_null() && !it->is_string())
      throw bad_request(key, fmt::format("'{}' must be a string", key));
  if (const auto it = j.find("metadata"); it != j.end() && !it->is_null() && !it->is_object())
    throw bad_request("metadata", "'metadata' must be an object");
  if (const auto it = j.find("store"); it != j.end() && !it->is_null() && *it != false)
    throw bad_request("store", "'store' is not supported by this server: completions are not stored");
}

// The number of most likely tokens listed per token, or -1 for no logprobs.
int parse_logprobs(const json& j, ApiKind kind) {
  const int max_top = SamplingParams::kMaxTopLogprobs;
  if (kind == ApiKind::Completion) {
    // The legacy API's logprobs: N, the number of most likely tokens listed.
    const auto it = j.find("logprobs");
    return it == j.end() || it->is_null()
               ? -1
               : static_cast<int>(count(j, "logprobs", "logprobs", 0, static_cast<size_t>(max_top), 0));
  }
  bool wanted = false;
  if (const auto it = j.find("logprobs"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) throw bad_request("logprobs", "'logprobs' must be true or false");
    wanted = it->get<bool>();
  }
  const auto top = j.find("top_logprobs");
  const bool top_given = top != j.end() && !top->is_null();
  if (top_given && !wanted) throw bad_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  return wanted
             ? static_cast<int>(count(j, "top_logprobs", "top_logprobs", 0, static_cast<size_t>(max_top), 0))
             : -1;
}

void parse_sampling(const json& j, ApiKind kind, SamplingParams& s, uint64_t random_seed) {
  s.max_tokens = 16;
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    s.max_tokens = static_cast<int>(count(j, key, key, 1, 1 << 20, static_cast<size_t>(s.max_tokens)));
  s.sampler.temperature = static_cast<float>(number(j, "temperature", 0, 2, 1));
  s.sampler.top_p = static_cast<float>(number(j, "top_p", 0, 1, 1));
  if (s.sampler.top_p <= 0) throw bad_request("top_p", "'top_p' must be above 0");
  // Not OpenAI parameters; vLLM's server takes them too: off unless given.
  s.sampler.top_k = static_cast<int>(count(j, "top_k", "top_k", 0, 1 << 20, 0));
  s.sampler.min_p = static_cast<float>(number(j, "min_p", 0, 1, 0));
  s.sampler.presence_penalty = static_cast<float>(number(j, "presence_penalty", -2, 2, 0));
  s.sampler.frequency_penalty = static_cast<float>(number(j, "frequency_penalty", -2, 2, 0));
  if (const auto it = j.find("logit_bias"); it != j.end() && !it->is_null())
    s.sampler.logit_bias = parse_logit_bias(*it);
  s.sampler.seed = random_seed;
  if (const auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) throw bad_request("seed", "'seed' must be an integer");
    s.sampler.seed = static_cast<uint64_t>(it->get<int64_t>());
  }
  s.logprobs = parse_logprobs(j, kind);
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
}

// What both endpoints share: model, streaming, sampling, the RAG extension.
void parse_common(const json& j, const std::string& question, CompletionRequest& r, uint64_t random_seed) {
  for (const auto& [key, value] : j.items())
    if (!known_parameter(r.kind, key))
      throw bad_request(
          key, fmt::format("unknown parameter '{}' (this server refuses what it would not honour)", key));
  refuse_unserved(j, r.kind);
  parse_delivery(j, r);
  check_metadata(j);
  parse_sampling(j, r.kind, r.sampling, random_seed);
  if (const auto it = j.find("cache_salt"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || it->get_ref<const std::string&>().empty() ||
        it->get_ref<const std::string&>().size() > 1024)
      throw bad_request("cache_salt", "'cache_salt' must be a non-empty string of at most 1024 bytes");
    r.cache_salt = it->get<std::string>();
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
  // The assistant's message last: the reply continues it (prefill).
  if (r.messages.back().role == "system")
    throw bad_request("messages", "the last message must be the user's, or the assistant's to continue it");
  parse_common(j, r.messages.back().content, r, random_seed);
  if (r.rag && r.messages.back().role != "user")
    throw bad_request("messages",
                      "with the 'rag' extension the last message must be the user's (the question)");
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

uint64_t cache_scope_of(const std::string& ns, const std::string& cache_salt) {
  if (ns.empty() && cache_salt.empty()) return 0;  // the shared scope
  // Length-prefixed, so no namespace and salt pair reads as another.
  const std::string both = fmt::format("{}:{}{}:{}", ns.size(), ns, cache_salt.size(), cache_salt);
  return std::max<uint64_t>(hash_string(both, 0x74656e616e74ULL), 1);
}

PromptRequest prompt_request(const CompletionRequest& r) {
  PromptRequest p;
  p.chat = r.kind == ApiKind::Chat;
  p.prompt = r.prompt;
  p.messages = r.messages;
  if (r.rag) {
    p.context = &r.rag->context;
    if (r.rag->retrieve) p.retrieve = &*r.rag->retrieve;
  }
  p.cache_scope = r.cache_scope;
  return p;
}

void check_vocab(const CompletionRequest& r, int32_t n_vocab) {
  for (const auto& [id, bias] : r.sampling.sampler.logit_bias)
    if (id >= n_vocab)
      throw bad_request(
          "logit_bias",
          fmt::format("logit_bias: token id {} is not in the vocabulary (ids 0 to {})", id, n_vocab - 1));
  try {
    r.sampling.sampler.validate(n_vocab);
  } catch (const Error& e) {
    throw bad_request("logit_bias", e.what());
  }
}

json logprobs_json(ApiKind kind, const Tokenizer& tok, std::span<const OutputLogprob> logprobs) {
  // A token's text as clients see it: special tokens rendered, bytes that
  // are not UTF-8 by themselves (a piece of a character) as U+FFFD; `bytes`
  // keeps them exactly.
  const auto piece = [&](int32_t id) {
    // A model may have more outputs than its tokenizer has tokens (padding).
    return id < tok.n_vocab() ? tok.token_to_piece(id, /*render_special=*/true) : std::string();
  };
  const auto text = [&](int32_t id) {
    std::string bytes = piece(id), out;
    drain_utf8(bytes, out, /*final=*/true);
    return out;
  };
  const auto bytes = [&](int32_t id) {
    json b = json::array();
    for (const unsigned char c : piece(id)) b.push_back(c);
    return b;
  };
  if (kind == ApiKind::Chat) {
    json content = json::array();
    for (const OutputLogprob& lp : logprobs) {
      json top = json::array();
      for (const TokenProb& t : lp.logprob.top)
        top.push_back({{"token", text(t.token)}, {"logprob", t.logprob}, {"bytes", bytes(t.token)}});
      content.push_back({{"token", text(lp.logprob.token)},
                         {"logprob", lp.logprob.logprob},
                         {"bytes", bytes(lp.logprob.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  for (const OutputLogprob& lp : logprobs) {
    tokens.push_back(text(lp.logprob.token));
    token_logprobs.push_back(lp.logprob.logprob);
    text_offset.push_back(lp.text_offset);
    // As OpenAI's: the N most likely and the picked token, up to N + 1.
    json top = json::object();
    for (const TokenProb& t : lp.logprob.top) top.emplace(text(t.token), t.logprob);
    top.emplace(text(lp.logprob.token), lp.logprob.logprob);
    top_logprobs.push_back(std::move(top));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(text_offset)}};
}

json completion_json(ApiKind kind, bool chunk, const std::string& id, int64_t created,
                     const std::string& model, const std::string& text, std::optional<FinishReason> reason,
                     const std::optional<Usage>& usage, const json& logprobs) {
  json choice = {{"index", 0},
                 {"logprobs", logprobs},
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
    else if (!reason && logprobs.is_null())
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

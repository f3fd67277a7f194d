#include "prompt/chat_template.h"

#include <array>
#include <ctime>
#include <optional>

#include "jinja/jinja.h"
#include "util/error.h"

namespace depcache {
namespace {

constexpr std::array<std::pair<ChatFamily, std::string_view>, 13> kNames = {
    {{ChatFamily::ChatML, "chatml"},
     {ChatFamily::Qwen2, "qwen2"},
     {ChatFamily::Qwen25, "qwen2.5"},
     {ChatFamily::Qwen3, "qwen3"},
     {ChatFamily::Qwen35, "qwen3.5"},
     {ChatFamily::Llama2, "llama2"},
     {ChatFamily::Llama3, "llama3"},
     {ChatFamily::Llama31, "llama3.1"},
     {ChatFamily::Mistral, "mistral"},
     {ChatFamily::MistralNemo, "mistral-nemo"},
     {ChatFamily::Zephyr, "zephyr"},
     {ChatFamily::Phi3, "phi3"},
     {ChatFamily::Gemma, "gemma"}}};

// Roles are known and the conversation not empty; it ends with the user's
// message (answered) or the assistant's (continued).
void check_messages(std::span<const ChatMessage> messages) {
  if (messages.empty()) fail(ErrorKind::InvalidInput, "the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant")
      fail(ErrorKind::InvalidInput, "message {} has role '{}' (system, user or assistant expected)", i, role);
  }
  if (messages.back().role == "system")
    fail(ErrorKind::InvalidInput,
         "the last message must be the user's or the assistant's (it is the system's)");
}

}  // namespace

std::vector<std::string> chat_family_names() {
  std::vector<std::string> out;
  for (const auto& [f, name] : kNames) out.emplace_back(name);
  return out;
}

std::string_view chat_family_name(ChatFamily f) {
  for (const auto& [family, name] : kNames)
    if (family == f) return name;
  return "?";
}

std::optional<ChatFamily> chat_family_from_name(std::string_view name) {
  for (const auto& [family, n] : kNames)
    if (n == name) return family;
  return std::nullopt;
}

namespace {

// Each family's Jinja template.
constexpr std::pair<ChatFamily, std::string_view> kTemplates[] = {
    {ChatFamily::ChatML,
     "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' "
     "}}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {ChatFamily::Qwen2,
     "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful "
     "assistant.<|im_end|>\\n' }}{% endif %}"
     "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' "
     "}}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {ChatFamily::Qwen25,
     "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are Qwen, created by "
     "Alibaba "
     "Cloud. You are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
     "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' "
     "}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {ChatFamily::Qwen3,
     "{%- for m in messages %}{%- set c = m['content'] %}{%- if m['role'] == 'assistant' and "
     "'</think>' in c %}{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
     "{{- '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{%- endfor %}"
     "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
     "{#- reasoning_content: an earlier reply's reasoning is left out #}"},
    {ChatFamily::Qwen35,
     "{%- for m in messages %}{%- set c = m['content'] %}{%- if m['role'] == 'assistant' and "
     "'</think>' in c %}{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
     "{{- '<|im_start|>' + m['role'] + '\\n' + c | trim + '<|im_end|>\\n' }}{%- endfor %}"
     "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{{- '<think>\\n' }}{%- endif "
     "%}"},
    {ChatFamily::Llama3,
     "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
     "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% "
     "endif %}"},
    {ChatFamily::Llama2,
     "{% set sys = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
     "{% for m in messages if m['role'] != 'system' %}{% if m['role'] == 'user' %}"
     "{% set text = '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n' + m['content'] if loop.first and sys "
     "else m['content'] %}{{ bos_token + '[INST] ' + text | trim + ' [/INST]' }}"
     "{% else %}{{ ' ' + m['content'] | trim + ' ' + eos_token }}{% endif %}{% endfor %}"},
    {ChatFamily::Mistral,
     "{{ bos_token }}{% set sys = messages[0]['content'] if messages[0]['role'] == 'system' else '' "
     "%}"
     "{% for m in messages if m['role'] != 'system' %}{% if m['role'] == 'user' %}"
     "{% set text = sys + '\\n\\n' + m['content'] if loop.first and sys else m['content'] %}"
     "{{ '[INST] ' + text | trim + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}{% endif %}"
     "{% endfor %}"},
    {ChatFamily::Zephyr,
     "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + eos_token + '\\n' }}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"},
    {ChatFamily::Llama31,
     "{{ bos_token }}{% if not date_string is defined %}{% set date_string = '26 Jul 2024' %}{% "
     "endif %}"
     "{% set sys = messages[0]['content'] | trim if messages[0]['role'] == 'system' else '' %}"
     "{{ '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\n"
     "Today Date: ' + date_string + '\\n\\n' + sys + '<|eot_id|>' }}"
     "{% for m in messages if m['role'] != 'system' %}{{ '<|start_header_id|>' + m['role'] + "
     "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% "
     "endif %}"},
    {ChatFamily::MistralNemo,
     "{{ bos_token }}{% set system_message = messages[0]['content'] if messages[0]['role'] == "
     "'system' "
     "else none %}{% set turns = messages[1:] if system_message is not none else messages %}"
     "{% for m in turns %}{% if m['role'] == 'user' %}{{ '[INST]' + (system_message + '\\n\\n' if "
     "loop.last and system_message is not none else '') + m['content'] + '[/INST]' }}"
     "{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}"},
    {ChatFamily::Phi3,
     "{% for m in messages %}{% if m['role'] != 'system' or m['content'] %}{{ '<|' + m['role'] + "
     "'|>\\n' + m['content'] + '<|end|>\\n' }}{% endif %}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"},
    {ChatFamily::Gemma,
     "{{ bos_token }}{% set pre = messages[0]['content'] + '\\n\\n' if messages[0]['role'] == "
     "'system' else '' %}{% for m in messages if m['role'] != 'system' %}{{ '<start_of_turn>' + "
     "('model' if m['role'] == 'assistant' else m['role']) + '\\n' + (pre if loop.first else '') + "
     "m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"},
};

}  // namespace

std::string chat_template_jinja(ChatFamily f) {
  for (const auto& [family, jinja] : kTemplates)
    if (family == f) return std::string(jinja);
  return {};
}

namespace {

// The moment templates write: the day `today` names ("26 Jul 2024") at
// midnight, or now (UTC).
std::tm chat_time(std::string_view today) {
  std::tm t{};
  if (today.empty()) {
    const std::time_t now = std::time(nullptr);
    gmtime_r(&now, &t);
    return t;
  }
  const std::string s(today);
  const char* end = strptime(s.c_str(), "%d %b %Y", &t);
  if (!end || *end) fail(ErrorKind::InvalidInput, "'{}' is not a date like '26 Jul 2024'", s);
  return t;
}

std::string chat_date(std::string_view today) {
  if (!today.empty()) return std::string(today);
  const std::tm t = chat_time(today);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &t);
  return buf;
}

}  // namespace

namespace {

// Each family's template, read once per process: a family is its template.
const std::shared_ptr<const jinja::Template>& family_template(ChatFamily f) {
  static const auto templates = [] {
    std::array<std::shared_ptr<const jinja::Template>, kNames.size()> out;
    for (size_t i = 0; i < kNames.size(); ++i)
      out[i] = std::make_shared<const jinja::Template>(chat_template_jinja(kNames[i].first));
    return out;
  }();
  for (size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i].first == f) return templates[i];
  fail(ErrorKind::InvalidInput, "no chat family {}", static_cast<int>(f));
}

}  // namespace

ChatFormat::ChatFormat(ChatFamily f) : family_(f), template_(family_template(f)) {}

ChatFormat ChatFormat::from_jinja(std::string_view jinja) {
  ChatFormat out;
  out.template_ = std::make_shared<const jinja::Template>(jinja);
  return out;
}

std::string ChatFormat::name() const {
  return family_ ? std::string(chat_family_name(*family_)) : "the model's template";
}

namespace {

// Transformers' continue_final_message: the conversation rendered without a
// generation prompt, cut right after the final message's text, so that the
// reply continues it. The text is found as Transformers finds it (its last
// occurrence, as written or with its trailing spaces trimmed away).
jinja::Str cut_after_final_message(const jinja::Str& rendered, std::string_view final_text) {
  const auto strip = [](std::string_view s) {
    const char* ws = " \t\n\r\v\f";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) return std::string_view();
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
  };
  const std::string_view stripped = strip(final_text);
  const size_t at = rendered.s.rfind(stripped);
  if (stripped.empty() || at == std::string::npos)
    fail(ErrorKind::InvalidInput,
         "the assistant's message to continue does not appear in what the chat template renders");
  const std::string_view lstripped = final_text.substr(final_text.find(stripped));
  const bool kept = rendered.s.compare(at, lstripped.size(), lstripped) == 0;
  return rendered.sub(0, at + (kept ? lstripped.size() : stripped.size()));
}

}  // namespace

RenderedChat ChatFormat::render(std::span<const ChatMessage> messages, std::string_view bos,
                                std::string_view eos, std::string_view today) const {
  check_messages(messages);
  const bool prefill = messages.back().role == "assistant";
  jinja::List msgs;
  for (const ChatMessage& m : messages) {
    jinja::Dict d;
    d.set("role", jinja::Value::string(m.role));
    d.set("content", jinja::Value::marked(m.content));
    msgs.push_back(jinja::Value::dict(std::move(d)));
  }
  jinja::Dict globals;
  globals.set("messages", jinja::Value::list(std::move(msgs)));
  globals.set("add_generation_prompt", jinja::Value::boolean(!prefill));
  globals.set("bos_token", jinja::Value::string(std::string(bos)));
  globals.set("eos_token", jinja::Value::string(std::string(eos)));
  globals.set("date_string", jinja::Value::string(chat_date(today)));
  jinja::Str out = template_->render(globals, chat_time(today));
  if (prefill) out = cut_after_final_message(out, messages.back().content);
  // The tokenizer adds BOS; a template that writes it first loses it here.
  if (!bos.empty() && out.s.starts_with(bos)) out = out.sub(bos.size(), out.s.size());
  return {std::move(out.s), std::move(out.marks)};
}

}  // namespace depcache

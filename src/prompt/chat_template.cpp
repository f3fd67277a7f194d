#include "prompt/chat_template.h"

#include <fmt/format.h>

#include <array>

#include "util/error.h"

namespace depcache {
namespace {

constexpr std::array<std::pair<ChatFamily, std::string_view>, 6> kNames = {{{ChatFamily::ChatML, "chatml"},
                                                                            {ChatFamily::Qwen2, "qwen2"},
                                                                            {ChatFamily::Llama2, "llama2"},
                                                                            {ChatFamily::Llama3, "llama3"},
                                                                            {ChatFamily::Mistral, "mistral"},
                                                                            {ChatFamily::Zephyr, "zephyr"}}};

constexpr std::string_view kQwen2DefaultSystem = "You are a helpful assistant.";

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

void check_messages(std::span<const ChatMessage> messages) {
  if (messages.empty()) fail(ErrorKind::InvalidInput, "the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant")
      fail(ErrorKind::InvalidInput, "message {} has role '{}' (system, user or assistant expected)", i, role);
  }
  if (messages.back().role != "user")
    fail(ErrorKind::InvalidInput, "the last message must be the user's (it is the {}'s)",
         messages.back().role);
}

// ChatML and Qwen2: every message in its own im_start/im_end block.
std::string render_chatml(std::span<const ChatMessage> messages, bool default_system) {
  std::string out;
  if (default_system && messages.front().role != "system")
    out += fmt::format("<|im_start|>system\n{}<|im_end|>\n", kQwen2DefaultSystem);
  for (const ChatMessage& m : messages)
    out += fmt::format("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
  return out + "<|im_start|>assistant\n";
}

std::string render_llama3(std::span<const ChatMessage> messages) {
  std::string out;
  for (const ChatMessage& m : messages)
    out += fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>", m.role, trim(m.content));
  return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

// Llama 2 and Mistral: [INST] turns, the system text folded into the first
// user turn. Llama 2 wraps it in <<SYS>> and opens every later turn with BOS.
std::string render_inst(std::span<const ChatMessage> messages, bool llama2, std::string_view bos,
                        std::string_view eos) {
  std::string system, out;
  bool first_user = true;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      system += system.empty() ? m.content : "\n" + m.content;
    } else if (m.role == "user") {
      std::string content = m.content;
      if (first_user && !system.empty())
        content = llama2 ? fmt::format("<<SYS>>\n{}\n<</SYS>>\n\n{}", system, content)
                         : fmt::format("{}\n\n{}", system, content);
      if (!first_user && llama2) out += bos;
      out += fmt::format("[INST] {} [/INST]", trim(content));
      first_user = false;
    } else {
      out += llama2 ? fmt::format(" {} {}", trim(m.content), eos) : fmt::format("{}{}", m.content, eos);
    }
  }
  return out;
}

std::string render_zephyr(std::span<const ChatMessage> messages, std::string_view eos) {
  std::string out;
  for (const ChatMessage& m : messages) out += fmt::format("<|{}|>\n{}{}\n", m.role, m.content, eos);
  return out + "<|assistant|>\n";
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

std::optional<ChatFamily> detect_chat_family(std::string_view jinja) {
  const auto has = [&](std::string_view s) { return jinja.find(s) != std::string_view::npos; };
  if (has("<|im_start|>")) return has(kQwen2DefaultSystem) ? ChatFamily::Qwen2 : ChatFamily::ChatML;
  if (has("<|start_header_id|>")) return ChatFamily::Llama3;
  if (has("<|assistant|>")) return ChatFamily::Zephyr;
  if (has("<<SYS>>")) return ChatFamily::Llama2;
  if (has("[INST]")) return ChatFamily::Mistral;
  return std::nullopt;
}

std::string chat_template_jinja(ChatFamily f) {
  switch (f) {
    case ChatFamily::ChatML:
      return "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' "
             "}}"
             "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    case ChatFamily::Qwen2:
      return "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful "
             "assistant.<|im_end|>\\n' }}{% endif %}"
             "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' "
             "}}"
             "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    case ChatFamily::Llama3:
      return "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
             "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% "
             "endif %}";
    case ChatFamily::Llama2:
      return "{% set sys = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
             "{% for m in messages if m['role'] != 'system' %}{% if m['role'] == 'user' %}"
             "{% set text = '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n' + m['content'] if loop.first and sys "
             "else m['content'] %}{{ bos_token + '[INST] ' + text | trim + ' [/INST]' }}"
             "{% else %}{{ ' ' + m['content'] | trim + ' ' + eos_token }}{% endif %}{% endfor %}";
    case ChatFamily::Mistral:
      return "{{ bos_token }}{% set sys = messages[0]['content'] if messages[0]['role'] == 'system' else '' "
             "%}"
             "{% for m in messages if m['role'] != 'system' %}{% if m['role'] == 'user' %}"
             "{% set text = sys + '\\n\\n' + m['content'] if loop.first and sys else m['content'] %}"
             "{{ '[INST] ' + text | trim + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}{% endif %}"
             "{% endfor %}";
    case ChatFamily::Zephyr:
      return "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + eos_token + '\\n' }}"
             "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";
  }
  return {};
}

std::string render_chat(ChatFamily f, std::span<const ChatMessage> messages, std::string_view bos,
                        std::string_view eos) {
  check_messages(messages);
  switch (f) {
    case ChatFamily::ChatML:
      return render_chatml(messages, false);
    case ChatFamily::Qwen2:
      return render_chatml(messages, true);
    case ChatFamily::Llama3:
      return render_llama3(messages);
    case ChatFamily::Llama2:
      return render_inst(messages, true, bos, eos);
    case ChatFamily::Mistral:
      return render_inst(messages, false, bos, eos);
    case ChatFamily::Zephyr:
      return render_zephyr(messages, eos);
  }
  return {};
}

}  // namespace depcache

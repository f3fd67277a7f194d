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

// A rendering under way: markup (the format's own text and control
// markers) and message text, kept apart so the message text can be
// tokenized as text. Pieces are gathered per turn so that a turn can be
// trimmed as a whole, as the templates trim it.
class Pieces {
 public:
  Pieces& mark(std::string_view s) { return add(s, false); }
  Pieces& text(std::string_view s) { return add(s, true); }
  // Strips " \t\r\n" from both ends of the whole, across pieces (the
  // templates' `trim` of the concatenated turn).
  Pieces& trim() {
    while (!pieces_.empty()) {
      std::string& s = pieces_.front().first;
      s.erase(0, std::min(s.size(), s.find_first_not_of(kSpace)));
      if (!s.empty()) break;
      pieces_.erase(pieces_.begin());
    }
    while (!pieces_.empty()) {
      std::string& s = pieces_.back().first;
      const size_t last = s.find_last_not_of(kSpace);
      s.erase(last == std::string::npos ? 0 : last + 1);
      if (!s.empty()) break;
      pieces_.pop_back();
    }
    return *this;
  }
  Pieces& append(const Pieces& other) {
    pieces_.insert(pieces_.end(), other.pieces_.begin(), other.pieces_.end());
    return *this;
  }
  RenderedChat render() const {
    RenderedChat out;
    for (const auto& [s, is_text] : pieces_) {
      if (is_text && !s.empty()) out.text_ranges.push_back({out.text.size(), out.text.size() + s.size()});
      out.text += s;
    }
    return out;
  }

 private:
  static constexpr const char* kSpace = " \t\r\n";
  Pieces& add(std::string_view s, bool is_text) {
    if (!s.empty()) pieces_.emplace_back(std::string(s), is_text);
    return *this;
  }
  std::vector<std::pair<std::string, bool>> pieces_;
};

// ChatML and Qwen2: every message in its own im_start/im_end block.
Pieces render_chatml(std::span<const ChatMessage> messages, bool default_system) {
  Pieces out;
  if (default_system && messages.front().role != "system")
    out.mark(fmt::format("<|im_start|>system\n{}<|im_end|>\n", kQwen2DefaultSystem));
  for (const ChatMessage& m : messages)
    out.mark(fmt::format("<|im_start|>{}\n", m.role)).text(m.content).mark("<|im_end|>\n");
  return out.mark("<|im_start|>assistant\n");
}

Pieces render_llama3(std::span<const ChatMessage> messages) {
  Pieces out;
  for (const ChatMessage& m : messages)
    out.mark(fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n", m.role))
        .append(Pieces().text(m.content).trim())
        .mark("<|eot_id|>");
  return out.mark("<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// Llama 2 and Mistral: [INST] turns, the system text folded into the first
// user turn. Llama 2 wraps it in <<SYS>> and opens every later turn with BOS.
Pieces render_inst(std::span<const ChatMessage> messages, bool llama2, std::string_view bos,
                   std::string_view eos) {
  Pieces system, out;
  bool first_user = true;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      if (system.render().text.empty())
        system.text(m.content);
      else
        system.mark("\n").text(m.content);
    } else if (m.role == "user") {
      Pieces turn;
      if (first_user && !system.render().text.empty()) {
        if (llama2)
          turn.mark("<<SYS>>\n").append(system).mark("\n<</SYS>>\n\n");
        else
          turn.append(system).mark("\n\n");
      }
      turn.text(m.content);
      if (!first_user && llama2) out.mark(bos);
      out.mark("[INST] ").append(turn.trim()).mark(" [/INST]");
      first_user = false;
    } else if (llama2) {
      out.mark(" ").append(Pieces().text(m.content).trim()).mark(" ").mark(eos);
    } else {
      out.text(m.content).mark(eos);
    }
  }
  return out;
}

Pieces render_zephyr(std::span<const ChatMessage> messages, std::string_view eos) {
  Pieces out;
  for (const ChatMessage& m : messages)
    out.mark(fmt::format("<|{}|>\n", m.role)).text(m.content).mark(eos).mark("\n");
  return out.mark("<|assistant|>\n");
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

RenderedChat render_chat_text(ChatFamily f, std::span<const ChatMessage> messages, std::string_view bos,
                              std::string_view eos) {
  check_messages(messages);
  switch (f) {
    case ChatFamily::ChatML:
      return render_chatml(messages, false).render();
    case ChatFamily::Qwen2:
      return render_chatml(messages, true).render();
    case ChatFamily::Llama3:
      return render_llama3(messages).render();
    case ChatFamily::Llama2:
      return render_inst(messages, true, bos, eos).render();
    case ChatFamily::Mistral:
      return render_inst(messages, false, bos, eos).render();
    case ChatFamily::Zephyr:
      return render_zephyr(messages, eos).render();
  }
  return {};
}

std::string render_chat(ChatFamily f, std::span<const ChatMessage> messages, std::string_view bos,
                        std::string_view eos) {
  return render_chat_text(f, messages, bos, eos).text;
}

}  // namespace depcache

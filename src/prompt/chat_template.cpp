#include "prompt/chat_template.h"

#include <fmt/format.h>

#include <array>
#include <ctime>
#include <optional>

#include "prompt/jinja.h"
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

// Llama 3.1-3.3's system header: the model's knowledge cutoff and the date.
constexpr std::string_view kLlama31Cutoff = "Cutting Knowledge Date: December 2023\n";

constexpr std::string_view kQwen2DefaultSystem = "You are a helpful assistant.";
constexpr std::string_view kQwen25DefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// Roles are known and the conversation not empty; it ends with the user's
// message, or the assistant's when `prefill` allows it.
void check_messages(std::span<const ChatMessage> messages, bool prefill = false) {
  if (messages.empty()) fail(ErrorKind::InvalidInput, "the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant")
      fail(ErrorKind::InvalidInput, "message {} has role '{}' (system, user or assistant expected)", i, role);
  }
  if (messages.back().role != "user" && !(prefill && messages.back().role == "assistant"))
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

// ChatML and the Qwen formats: every message in its own im_start/im_end
// block. Qwen2/2.5 add a default system message when there is none; Qwen3
// keeps only what follows a reasoning block in an earlier assistant
// message; Qwen3.5 also trims every message and opens a reasoning block for
// the reply.
struct ChatmlStyle {
  std::string_view default_system;
  bool strip_reasoning = false;
  bool qwen35 = false;
};
Pieces render_chatml(std::span<const ChatMessage> messages, ChatmlStyle style) {
  Pieces out;
  if (!style.default_system.empty() && messages.front().role != "system")
    out.mark(fmt::format("<|im_start|>system\n{}<|im_end|>\n", style.default_system));
  for (const ChatMessage& m : messages) {
    Pieces content;
    std::string_view text = m.content;
    const size_t end = text.rfind("</think>");
    if (style.strip_reasoning && m.role == "assistant" && end != std::string_view::npos) {
      text.remove_prefix(end + 8);
      text.remove_prefix(std::min(text.size(), text.find_first_not_of('\n')));
    }
    content.text(text);
    if (style.qwen35) content.trim();
    out.mark(fmt::format("<|im_start|>{}\n", m.role)).append(content).mark("<|im_end|>\n");
  }
  return out.mark(style.qwen35 ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n");
}

// Llama 3.1 and later: a system header always, with the cutoff and the date
// before the (trimmed) system text.
Pieces render_llama3(std::span<const ChatMessage> messages, bool dated, std::string_view today) {
  Pieces out;
  if (dated) {
    std::string_view system;
    if (messages.front().role == "system") {
      system = messages.front().content;
      messages = messages.subspan(1);
    }
    out.mark("<|start_header_id|>system<|end_header_id|>\n\n")
        .mark(kLlama31Cutoff)
        .mark(fmt::format("Today Date: {}\n\n", today))
        .append(Pieces().text(system).trim())
        .mark("<|eot_id|>");
  }
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

// Mistral Nemo (Tekken): [INST]...[/INST] with no spaces, the system text
// before the last user message.
Pieces render_mistral_nemo(std::span<const ChatMessage> messages, std::string_view eos) {
  std::optional<std::string_view> system;
  if (messages.front().role == "system") {
    system = messages.front().content;
    messages = messages.subspan(1);
  }
  Pieces out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      out.mark("[INST]");
      if (i + 1 == messages.size() && system) out.text(*system).mark("\n\n");
      out.text(m.content).mark("[/INST]");
    } else {
      out.text(m.content).mark(eos);
    }
  }
  return out;
}

// Phi-3: <|role|> blocks closed by <|end|>; an empty system message is left out.
Pieces render_phi3(std::span<const ChatMessage> messages) {
  Pieces out;
  for (const ChatMessage& m : messages)
    if (m.role != "system" || !m.content.empty())
      out.mark(fmt::format("<|{}|>\n", m.role)).text(m.content).mark("<|end|>\n");
  return out.mark("<|assistant|>\n");
}

// Gemma 2/3: user and model turns, contents trimmed; a system message is
// put before the first turn's text (Gemma 3; Gemma 2's template refuses one).
Pieces render_gemma(std::span<const ChatMessage> messages) {
  std::string_view system;
  const bool has_system = messages.front().role == "system";
  if (has_system) {
    system = messages.front().content;
    messages = messages.subspan(1);
  }
  Pieces out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    out.mark(fmt::format("<start_of_turn>{}\n", m.role == "assistant" ? "model" : m.role));
    if (i == 0 && has_system) out.text(system).mark("\n\n");
    out.append(Pieces().text(m.content).trim()).mark("<end_of_turn>\n");
  }
  return out.mark("<start_of_turn>model\n");
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
    case ChatFamily::Qwen25:
      return "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are Qwen, created by "
             "Alibaba "
             "Cloud. You are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
             "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' "
             "}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    case ChatFamily::Qwen3:
      return "{%- for m in messages %}{%- set c = m['content'] %}{%- if m['role'] == 'assistant' and "
             "'</think>' in c %}{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
             "{{- '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{%- endfor %}"
             "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
             "{#- reasoning_content: an earlier reply's reasoning is left out #}";
    case ChatFamily::Qwen35:
      return "{%- for m in messages %}{%- set c = m['content'] %}{%- if m['role'] == 'assistant' and "
             "'</think>' in c %}{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
             "{{- '<|im_start|>' + m['role'] + '\\n' + c | trim + '<|im_end|>\\n' }}{%- endfor %}"
             "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{{- '<think>\\n' }}{%- endif "
             "%}";
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
    case ChatFamily::Llama31:
      return "{{ bos_token }}{% if not date_string is defined %}{% set date_string = '26 Jul 2024' %}{% "
             "endif %}"
             "{% set sys = messages[0]['content'] | trim if messages[0]['role'] == 'system' else '' %}"
             "{{ '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\n"
             "Today Date: ' + date_string + '\\n\\n' + sys + '<|eot_id|>' }}"
             "{% for m in messages if m['role'] != 'system' %}{{ '<|start_header_id|>' + m['role'] + "
             "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% "
             "endif %}";
    case ChatFamily::MistralNemo:
      return "{{ bos_token }}{% set system_message = messages[0]['content'] if messages[0]['role'] == "
             "'system' "
             "else none %}{% set turns = messages[1:] if system_message is not none else messages %}"
             "{% for m in turns %}{% if m['role'] == 'user' %}{{ '[INST]' + (system_message + '\\n\\n' if "
             "loop.last and system_message is not none else '') + m['content'] + '[/INST]' }}"
             "{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}";
    case ChatFamily::Phi3:
      return "{% for m in messages %}{% if m['role'] != 'system' or m['content'] %}{{ '<|' + m['role'] + "
             "'|>\\n' + m['content'] + '<|end|>\\n' }}{% endif %}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";
    case ChatFamily::Gemma:
      return "{{ bos_token }}{% set pre = messages[0]['content'] + '\\n\\n' if messages[0]['role'] == "
             "'system' else '' %}{% for m in messages if m['role'] != 'system' %}{{ '<start_of_turn>' + "
             "('model' if m['role'] == 'assistant' else m['role']) + '\\n' + (pre if loop.first else '') + "
             "m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";
  }
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

RenderedChat render_chat_text(ChatFamily f, std::span<const ChatMessage> messages, std::string_view bos,
                              std::string_view eos, std::string_view today) {
  check_messages(messages);
  const std::string date = chat_date(today);
  switch (f) {
    case ChatFamily::ChatML:
      return render_chatml(messages, {}).render();
    case ChatFamily::Qwen2:
      return render_chatml(messages, {kQwen2DefaultSystem}).render();
    case ChatFamily::Qwen25:
      return render_chatml(messages, {kQwen25DefaultSystem}).render();
    case ChatFamily::Qwen3:
      return render_chatml(messages, {{}, true}).render();
    case ChatFamily::Qwen35:
      return render_chatml(messages, {{}, true, true}).render();
    case ChatFamily::Llama3:
      return render_llama3(messages, false, date).render();
    case ChatFamily::Llama31:
      return render_llama3(messages, true, date).render();
    case ChatFamily::MistralNemo:
      return render_mistral_nemo(messages, eos).render();
    case ChatFamily::Phi3:
      return render_phi3(messages).render();
    case ChatFamily::Gemma:
      return render_gemma(messages).render();
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
                        std::string_view eos, std::string_view today) {
  return render_chat_text(f, messages, bos, eos, today).text;
}

// A family continues an assistant's message (prefill) through the template
// it writes into models, which renders as its code does; read once here.
ChatFormat::ChatFormat(ChatFamily f)
    : family_(f), template_(std::make_shared<const jinja::Template>(chat_template_jinja(f))) {}

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
  const bool prefill = !messages.empty() && messages.back().role == "assistant";
  if (family_ && !prefill) return render_chat_text(*family_, messages, bos, eos, today);
  check_messages(messages, /*prefill=*/true);
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

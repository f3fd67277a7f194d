#pragma once
// Chat prompts in the formats models were trained on. A GGUF file carries its
// format as a Jinja template (tokenizer.chat_template), which the server runs
// with the interpreter of prompt/jinja.h; the common families are also
// formatted by code here, for models without a template (serve
// --chat-template NAME) and for the templates `model new` writes.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace depcache {

namespace jinja {
class Template;
}

enum class ChatFamily {
  ChatML,
  Qwen2,
  Qwen25,
  Qwen3,
  Qwen35,
  Llama2,
  Llama3,
  Llama31,
  Mistral,
  MistralNemo,
  Zephyr,
  Phi3,
  Gemma
};

struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string content;
};

// chatml, qwen2, qwen2.5, qwen3, qwen3.5, llama2, llama3, llama3.1, mistral, mistral-nemo, zephyr, phi3,
// gemma.
std::vector<std::string> chat_family_names();
std::string_view chat_family_name(ChatFamily f);
std::optional<ChatFamily> chat_family_from_name(std::string_view name);

// A Jinja template of the family (what models made here carry, so that
// other engines format their chats the same way).
std::string chat_template_jinja(ChatFamily f);

// The conversation as the family formats it, ending with the cue for the
// assistant's reply. Without the leading BOS: the tokenizer adds it when it
// encodes (later turns of Llama 2 and Mistral repeat it, as `bos`). Control
// markers appear as text, to be encoded with special tokens parsed. Throws
// InvalidInput for an empty conversation, an unknown role, or a conversation
// that does not end with a user message.
// `today`: the date the Llama 3.1 family writes in its system header ("26 Jul
// 2024" form); empty: the current UTC date.
std::string render_chat(ChatFamily f, std::span<const ChatMessage> messages, std::string_view bos = "<s>",
                        std::string_view eos = "</s>", std::string_view today = {});

// The same text, with where the messages' own text sits in it: a client's
// text is tokenized as text (a special token's spelling in it stays plain
// text), the format's markers as control tokens.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> text_ranges;  // [begin, end) byte ranges, ascending
};
RenderedChat render_chat_text(ChatFamily f, std::span<const ChatMessage> messages,
                              std::string_view bos = "<s>", std::string_view eos = "</s>",
                              std::string_view today = {});

// How a server formats chats: the model's own Jinja template, run by the
// interpreter (prompt/jinja.h) as Python's Jinja2 would run it, or a family's
// code (--chat-template NAME, and models without a template).
class ChatFormat {
 public:
  explicit ChatFormat(ChatFamily f);
  // Reads the template; throws InvalidInput naming the line and the construct
  // the interpreter does not implement.
  static ChatFormat from_jinja(std::string_view jinja);

  // The family's name, or "the model's template".
  std::string name() const;
  // As render_chat_text: without the leading BOS, the client's text marked,
  // the conversation checked the same way; an error the template raises
  // (raise_exception) is InvalidInput with its words. A conversation that
  // ends with the assistant's message is continued (Transformers'
  // continue_final_message): rendered without the generation prompt and
  // cut after that message's text.
  RenderedChat render(std::span<const ChatMessage> messages, std::string_view bos = "<s>",
                      std::string_view eos = "</s>", std::string_view today = {}) const;

 private:
  ChatFormat() = default;
  std::optional<ChatFamily> family_;
  std::shared_ptr<const jinja::Template> template_;  // the model's, or the family's own (for prefill)
};

}  // namespace depcache

#pragma once
// Chat prompts in the formats models were trained on. A GGUF file carries its
// format as a Jinja template (tokenizer.chat_template), run by the
// interpreter of jinja/jinja.h as Python's Jinja2 runs it. The common
// families are Jinja templates here too, run the same way: for models
// without a template (serve --chat-template NAME) and written into the
// models `model new` makes.
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

// A rendered chat prompt, with where the messages' own text sits in it: a
// client's text is tokenized as text (a special token's spelling in it stays
// plain text), the format's markers as control tokens.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> text_ranges;  // [begin, end) byte ranges, ascending
};

// How a server formats chats: the model's own Jinja template or a family's.
class ChatFormat {
 public:
  explicit ChatFormat(ChatFamily f);
  // Reads the template; throws InvalidInput naming the line and the construct
  // the interpreter does not implement.
  static ChatFormat from_jinja(std::string_view jinja);

  // The family's name, or "the model's template".
  std::string name() const;
  // The conversation as the template formats it, ending with the cue for
  // the assistant's reply. Without the leading BOS: the tokenizer adds it
  // when it encodes (later turns of Llama 2 and Mistral repeat it, as
  // `bos`); the client's text marked. A conversation that ends with the
  // assistant's message is continued (Transformers'
  // continue_final_message): rendered without the generation prompt and cut
  // after that message's text. InvalidInput for an empty conversation, an
  // unknown role, a conversation ending with a system message, or an error
  // the template raises (raise_exception, with its words).
  // `today`: the date templates write (Llama 3.1's system header, "26 Jul
  // 2024" form); empty: the current UTC date.
  RenderedChat render(std::span<const ChatMessage> messages, std::string_view bos = "<s>",
                      std::string_view eos = "</s>", std::string_view today = {}) const;

 private:
  ChatFormat() = default;
  std::optional<ChatFamily> family_;
  std::shared_ptr<const jinja::Template> template_;  // the model's, or the family's
};

}  // namespace depcache

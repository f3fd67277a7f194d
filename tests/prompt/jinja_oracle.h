#pragma once
// Debian's python3-jinja2 as the chat tests' independent oracle
// (tests/prompt/render_jinja.py).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "prompt/chat_template.h"

namespace depcache::test {

// Per conversation: what jinja2 renders with the generation prompt, the
// leading BOS removed (the tokenizer adds it), or nullopt where the
// template refuses it (raise_exception, or any error while rendering).
using Jinja2Renders = std::vector<std::optional<std::string>>;

struct Jinja2Job {
  std::vector<std::vector<ChatMessage>> conversations;
  std::string bos = "<BOS>", eos = "<EOS>", today = "05 Mar 2026";
};

// One entry per template: nullopt when jinja2 cannot read the template.
std::vector<std::optional<Jinja2Renders>> jinja2_render(const std::vector<std::string>& templates,
                                                        const Jinja2Job& job);

bool jinja2_available();

// The conversations the chat tests render: user only; system and user;
// multi-turn; whitespace around contents; an earlier reply's reasoning block.
const std::vector<std::vector<ChatMessage>>& chat_conversations();

#define REQUIRE_JINJA2()                     \
  if (!::depcache::test::jinja2_available()) \
  DEPCACHE_SKIP("Debian's python3-jinja2 not installed (scripts/setup.sh installs it)")

}  // namespace depcache::test

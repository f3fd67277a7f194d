// A chat template and a conversation decoded from the input: the template is
// read (or refused with InvalidInput) and rendered under tight limits (or
// refused with InvalidInput or LimitExceeded): never a crash, a hang or
// unbounded memory, and the client's text is marked as ascending, disjoint
// ranges inside the output.
//
// Input: the template's source up to 0x00, then messages separated by 0x00;
// a message's first byte picks its role (system, user, assistant), the
// remaining bytes are its content.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "jinja/jinja.h"
#include "prompt/chat_template.h"
#include "util/error.h"

using depcache::fuzz::violated;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  depcache::fuzz::Bytes in(data, size);
  const std::string source(in.until(0));
  depcache::jinja::List messages;
  while (!in.empty()) {
    const std::string_view raw = in.until(0);
    const uint8_t role = raw.empty() ? 1 : static_cast<uint8_t>(raw[0]) % 3;
    depcache::jinja::Dict m;
    m.set("role", depcache::jinja::Value::string(role == 0 ? "system" : role == 1 ? "user" : "assistant"));
    m.set("content", depcache::jinja::Value::marked(std::string(raw.empty() ? raw : raw.substr(1))));
    messages.push_back(depcache::jinja::Value::dict(std::move(m)));
  }
  std::optional<depcache::jinja::Template> t;
  try {
    t.emplace(source);
  } catch (const depcache::Error& e) {
    if (e.kind() != depcache::ErrorKind::InvalidInput)
      violated("reading a template failed other than InvalidInput");
    return 0;
  }
  depcache::jinja::Dict globals;
  globals.set("messages", depcache::jinja::Value::list(std::move(messages)));
  globals.set("add_generation_prompt", depcache::jinja::Value::boolean(true));
  globals.set("bos_token", depcache::jinja::Value::string("<s>"));
  globals.set("eos_token", depcache::jinja::Value::string("</s>"));
  depcache::jinja::RenderLimits limits;
  // Small enough that an input running into a limit costs milliseconds under
  // ASan (at 1 MiB and 100,000 steps the corpus ran at under 100 inputs/s):
  // the limits are checked the same way at any size.
  limits.max_output = 64 << 10;
  limits.max_steps = 10'000;
  limits.max_call_depth = 32;
  std::tm now{};
  now.tm_year = 126;
  now.tm_mday = 5;
  try {
    const depcache::jinja::Str out = t->render(globals, now, limits);
    size_t end = 0;
    for (const auto& [b, e] : out.marks) {
      if (b < end || e <= b || e > out.s.size()) violated("marks out of order or outside the output");
      end = e;
    }
  } catch (const depcache::Error& e) {
    if (e.kind() != depcache::ErrorKind::InvalidInput && e.kind() != depcache::ErrorKind::LimitExceeded)
      violated("rendering failed other than InvalidInput or LimitExceeded");
  }
  return 0;
}

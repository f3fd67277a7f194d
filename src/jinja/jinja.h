#pragma once
// A Jinja2 interpreter for chat templates: the subset of Jinja2 that the
// templates in GGUF files use, rendered as Python's Jinja2 renders them in
// the sandboxed environment chat templates are written for (trim_blocks,
// lstrip_blocks, loop controls, tojson as json.dumps, raise_exception,
// strftime_now). A template is read once; rendering is bounded in steps,
// nesting, output, the memory its values take and time, since a template
// comes from a file and runs on every chat request.
#include <chrono>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>

#include "jinja/value.h"

namespace depcache::jinja {

struct Node;

struct RenderLimits {
  size_t max_output = size_t{64} << 20;  // bytes
  size_t max_steps = 10'000'000;         // statements, loop turns and calls
  int max_call_depth = 64;               // macro calls within macro calls
  // Bytes of every string, list and mapping the render makes, summed over
  // the render whatever is freed meanwhile: a bound on the memory it can
  // hold at once (values share their contents, so copies cost nothing).
  size_t max_value_bytes = size_t{256} << 20;
  std::chrono::milliseconds max_time{2000};  // CPU time of the rendering thread
};

class Template {
 public:
  // Throws InvalidInput naming the line and the construct it cannot read.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // The output with the variables `globals` (messages, add_generation_prompt,
  // bos_token...) and the builtins; `now` is what strftime_now formats.
  // Throws InvalidInput for a template error, with the template's own words
  // when it calls raise_exception.
  Str render(const Dict& globals, const std::tm& now, const RenderLimits& limits = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace depcache::jinja

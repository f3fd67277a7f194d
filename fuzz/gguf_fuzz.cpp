// Any byte string either parses into a GGUF file whose tensors lie inside the
// input, or is rejected with depcache::Error; and a file that parses either
// loads as a model (its metadata and tensors checked strictly) or is refused
// with depcache::Error. Anything else is a bug.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "model/gguf.h"
#include "model/model.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const depcache::GgufFile f = depcache::GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz");
    for (const auto& t : f.tensors())
      if (t.data < data || t.data + t.n_bytes > data + size) std::abort();
    for (const auto& [key, value] : f.metadata())
      if (value.is_number()) (void)value.as_float(key);
    (void)depcache::Model::from_file(f);
  } catch (const depcache::Error&) {
  }
  return 0;
}

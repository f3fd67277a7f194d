#include <cmath>
#include <limits>

#include "model/gguf.h"
#include "util/error.h"

namespace depcache {

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8:
      return "u8";
    case GgufType::I8:
      return "i8";
    case GgufType::U16:
      return "u16";
    case GgufType::I16:
      return "i16";
    case GgufType::U32:
      return "u32";
    case GgufType::I32:
      return "i32";
    case GgufType::F32:
      return "f32";
    case GgufType::Bool:
      return "bool";
    case GgufType::String:
      return "string";
    case GgufType::Array:
      return "array";
    case GgufType::U64:
      return "u64";
    case GgufType::I64:
      return "i64";
    case GgufType::F64:
      return "f64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  return std::holds_alternative<uint64_t>(data) || std::holds_alternative<int64_t>(data);
}

int64_t GgufValue::as_int(std::string_view what) const {
  if (const auto* u = std::get_if<uint64_t>(&data)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(ErrorKind::InvalidInput, "metadata '{}': value {} is out of range", what, *u);
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&data)) return *i;
  fail(ErrorKind::InvalidInput, "metadata '{}' has type {}, expected an integer", what, gguf_type_name(type));
}

double GgufValue::as_float(std::string_view what) const {
  if (const auto* d = std::get_if<double>(&data)) return *d;
  if (is_integer()) return static_cast<double>(as_int(what));
  fail(ErrorKind::InvalidInput, "metadata '{}' has type {}, expected a number", what, gguf_type_name(type));
}

bool GgufValue::as_bool(std::string_view what) const {
  if (const auto* b = std::get_if<bool>(&data)) return *b;
  fail(ErrorKind::InvalidInput, "metadata '{}' has type {}, expected bool", what, gguf_type_name(type));
}

const std::string& GgufValue::as_string(std::string_view what) const {
  if (const auto* s = std::get_if<std::string>(&data)) return *s;
  fail(ErrorKind::InvalidInput, "metadata '{}' has type {}, expected string", what, gguf_type_name(type));
}

const std::vector<GgufValue>& GgufValue::as_array(std::string_view what) const {
  if (const auto* a = std::get_if<std::vector<GgufValue>>(&data)) return *a;
  fail(ErrorKind::InvalidInput, "metadata '{}' has type {}, expected array", what, gguf_type_name(type));
}

}  // namespace depcache

#include "compute/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "util/error.h"

namespace depcache {
namespace {

struct Entry {
  uint32_t raw;
  DTypeInfo info;
};

// Block byte sizes follow the GGUF/ggml block structs.
constexpr std::array kTable = {
    Entry{0, {"F32", 1, 4, true}},       Entry{1, {"F16", 1, 2, true}},
    Entry{2, {"Q4_0", 32, 18, true}},    Entry{3, {"Q4_1", 32, 20, false}},
    Entry{6, {"Q5_0", 32, 22, false}},   Entry{7, {"Q5_1", 32, 24, false}},
    Entry{8, {"Q8_0", 32, 34, true}},    Entry{9, {"Q8_1", 32, 36, false}},
    Entry{10, {"Q2_K", 256, 84, false}}, Entry{11, {"Q3_K", 256, 110, false}},
    Entry{12, {"Q4_K", 256, 144, true}}, Entry{13, {"Q5_K", 256, 176, false}},
    Entry{14, {"Q6_K", 256, 210, true}}, Entry{15, {"Q8_K", 256, 292, false}},
    Entry{24, {"I8", 1, 1, false}},      Entry{25, {"I16", 1, 2, false}},
    Entry{26, {"I32", 1, 4, false}},     Entry{27, {"I64", 1, 8, false}},
    Entry{28, {"F64", 1, 8, false}},     Entry{30, {"BF16", 1, 2, true}},
};

}  // namespace

std::optional<DTypeInfo> dtype_info(uint32_t raw) {
  for (const auto& e : kTable)
    if (e.raw == raw) return e.info;
  return std::nullopt;
}

const DTypeInfo& dtype_info(DType t) {
  for (const auto& e : kTable)
    if (e.raw == static_cast<uint32_t>(t)) return e.info;
  fail(ErrorKind::Internal, "unknown dtype {}", static_cast<uint32_t>(t));
}

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  for (const auto& e : kTable)
    if (e.info.name == upper) return static_cast<DType>(e.raw);
  return std::nullopt;
}

size_t row_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  if (n < 0 || n % info.block_size != 0)
    fail(ErrorKind::InvalidInput, "row of {} elements is not a multiple of the {} block size {}", n,
         info.name, info.block_size);
  return static_cast<size_t>(n / info.block_size) * info.block_bytes;
}

}  // namespace depcache

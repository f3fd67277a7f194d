#pragma once
// Tensor element types, numbered as in the GGUF format, with their block layout.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace depcache {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

struct DTypeInfo {
  std::string_view name;
  int64_t block_size;  // elements per block
  size_t block_bytes;  // bytes per block
  bool compute;        // the engine has kernels for it
};

// Info for a known type; nullopt for a number the format does not define.
std::optional<DTypeInfo> dtype_info(uint32_t raw);
const DTypeInfo& dtype_info(DType t);
std::optional<DType> dtype_from_name(std::string_view name);  // "f16", "Q8_0", ... (case-insensitive)

// Bytes of a row of n elements; n must be a multiple of the block size.
size_t row_bytes(DType t, int64_t n);

// Elements per super-block of the k-quants.
inline constexpr int64_t kQK = 256;
// Elements per block of the simple quants (Q4_0, Q8_0, ...).
inline constexpr int64_t kQ32 = 32;

}  // namespace depcache

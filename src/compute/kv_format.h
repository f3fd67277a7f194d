#pragma once
// How KV rows are stored: F32, F16, or Q8_0 (GGUF's blocks of 32 int8 values
// with one fp16 scale). One codec for every place rows live — a request's KV
// assembly, the engine's pool, spans in every tier and their records — so a
// row means the same bytes everywhere.
//
// Q8_0 rows: a row of n elements is n / 32 blocks; the model's KV row
// (n_head_kv * head_dim) must be whole blocks. A block whose values are not
// all finite, or whose scale does not fit fp16, is stored with a NaN scale:
// it reads back as NaN, never as clipped numbers.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "compute/dtype.h"

namespace depcache {

// The types KV rows can be stored as, in the order the CLI lists them.
std::span<const DType> kv_types();
// "f16", "f32", "q8_0".
std::string kv_type_name(DType type);
// Every kv_types() name, in that order.
std::vector<std::string> kv_type_names();
// A KV type from its name; InvalidInput, listing the names, otherwise.
DType parse_kv_type(const std::string& name);

// Why rows of row_elems elements cannot be stored as `type`; empty when they can.
std::string kv_type_refusal(DType type, int64_t row_elems);
inline bool kv_type_fits(DType type, int64_t row_elems) { return kv_type_refusal(type, row_elems).empty(); }
// Throws Error(InvalidInput) with kv_type_refusal's reason.
void require_kv_type(DType type, int64_t row_elems);

// Bytes of one stored row; the type must fit.
size_t kv_row_bytes(DType type, int64_t row_elems);

// n_rows rows of row_elems floats, stored / read back.
void kv_encode(DType type, const float* src, uint8_t* dst, int64_t n_rows, int64_t row_elems);
void kv_decode(DType type, const uint8_t* src, float* dst, int64_t n_rows, int64_t row_elems);
// Elements [first, first + n) of one stored row (a head's slice).
void kv_decode_part(DType type, const uint8_t* row, int64_t first, int64_t n, float* dst);

}  // namespace depcache

#pragma once
// Float64 reference dequantizer for tests. Written independently of the
// fast paths and as plainly as possible: it reads raw bytes at the offsets the
// GGUF format gives (not through the block structs) and extracts each
// element's bits by its index, so a layout slip in either shows up as a
// mismatch.
#include <cstdint>

#include "compute/dtype.h"

namespace depcache {

// F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K; Error(InvalidInput) otherwise or if
// n is not a multiple of the block size.
void dequantize_row_f64(DType t, const void* src, double* dst, int64_t n);

}  // namespace depcache

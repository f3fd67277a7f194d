#pragma once
// Block layouts of the quantized types, byte for byte as in GGUF files, and
// row-wise conversion to and from fp32.
//
// Rows handed to these functions must be 2-byte aligned (GGUF tensor data is
// aligned to 32 bytes and every block size here is even).
#include <cstdint>

#include "compute/dtype.h"

namespace depcache {

// 32 values: value[i] = d * qs[i].
struct BlockQ8_0 {
  uint16_t d;  // fp16
  int8_t qs[32];
};

// 32 values: value[i] = d * (nibble[i] - 8); byte j holds element j in its
// low nibble and element j + 16 in its high nibble.
struct BlockQ4_0 {
  uint16_t d;  // fp16
  uint8_t qs[16];
};

// 256 values in 8 sub-blocks of 32: value = d * sc[s] * q - dmin * m[s], with
// 6-bit sc/m packed into `scales` (see unpack_q4k_scales). The nibbles come in
// 4 groups of 32 bytes: group g holds sub-block 2g in the low nibbles and
// sub-block 2g + 1 in the high nibbles.
struct BlockQ4_K {
  uint16_t d;     // fp16, scale of the sub-block scales
  uint16_t dmin;  // fp16, scale of the sub-block mins
  uint8_t scales[12];
  uint8_t qs[128];
};

// 256 values in 16 sub-blocks of 16: value = d * scales[s] * (q - 32), q a
// 6-bit number. Per half of 128 values (ql advances 64 bytes, qh 32), for
// l in 0..31: ql[l] low/high nibble -> elements l and l + 64, ql[l + 32]
// low/high -> l + 32 and l + 96; qh[l] bits 0-1, 2-3, 4-5, 6-7 are the top
// bits of elements l, l + 32, l + 64, l + 96. Sub-block = element / 16.
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;  // fp16
};

static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ6_K) == 210);

// Decodes the 8 six-bit scales and mins of a Q4_K super-block. Sub-blocks 0-3
// use the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7 take
// their low 4 bits from the nibbles of bytes 8-11 and their top 2 bits from
// the spare top bits of bytes 0-3 (scales) and 4-7 (mins).
void unpack_q4k_scales(const uint8_t packed[12], uint8_t sc[8], uint8_t m[8]);
void pack_q4k_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t packed[12]);

// F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K. n must be a multiple of the block
// size and the type supported, else Error(InvalidInput). dequantize_row uses
// the SIMD kernels of the current ISA (see dot.h).
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
void quantize_row(DType t, const float* src, void* dst, int64_t n);

}  // namespace depcache

#pragma once
// Weight matrices rearranged once at load into panels of kPanelRows output
// rows, so that one vector load gives the same input column of 32 rows. The
// GEMM broadcasts an input value and multiplies it into whole columns: no
// horizontal sums, the tile of a prefill and the matvec of a decode run the
// same kernel, and the panel of a large prefill stays in cache while every
// token goes past it. Values keep the file's precision: f16/bf16 stay 16-bit,
// Q8_0 keeps its int8 codes (scales widened to f32), Q4_K its nibbles.
//
// Layout of panel p (rows 32p .. 32p+31, rows past n_out are zero):
//   F32, F16: element (r, k) at index k * 32 + r.
//   BF16: element (r, k) at index k * 32 + s(r), rows interleaved in fours:
//         s(r) = 8 (r / 4) + r % 4 for r < 16, 8 ((r - 16) / 4) + 4 + r % 4
//         after, so that unpacking a column with zeros gives rows in order.
//   Q8_0: per block of 32 inputs, 1088 bytes: fp16 a[32] (the block scale
//         d of each row), then uint8 u[8][32 rows][4]: group g, row r holds
//         inputs 4g .. 4g+3 as q + 128. Value = a[r] * u - 128 * a[r].
//   Q4_K: per super-block of 256 inputs, 4736 bytes: fp16 d[32], fp16
//         dmin[32] (each row's), then 8 sub-blocks of 32 inputs, 576 bytes
//         each: uint8 sc[32], uint8 mn[32] (each row's 6-bit scale and min),
//         then uint8 u[4][32 rows][4]: group g, row r, byte b holds input
//         8g + b in its low nibble and 8g + 4 + b in its high nibble.
//         Value = a[r] * q - m[r] with a = d * sc and m = dmin * mn, both
//         exact in fp32.
//   Q4_0: per block of 32 inputs, 576 bytes: fp16 d[32], then the nibbles
//         as in a Q4_K sub-block. a = d, m = 8d.
//   Q6_K: per super-block of 256 inputs, 8768 bytes: fp16 d[32] (each
//         row's), then 8 blocks of 32 inputs, 1088 bytes each: int8 sc0[32],
//         int8 sc1[32] (each row's scales of inputs 0..15 and 16..31), then
//         uint8 u[8][32][4] as for Q8_0 holding the 6-bit q. Value = a * q -
//         32 * a, a = d * sc0 for inputs 0..15 and d * sc1 for 16..31 (exact
//         in fp32).
// The quantized layouts keep the weights unsigned in four-input groups per
// row: the shape of the int8 dot-product instructions (VNNI), whose kernels
// run on activations quantized per token to int8 in blocks of 32. They keep
// the file's scales rather than their products in float (which would add a
// third to Q4_K's bytes and half to Q6_K's): a decode step streams every
// byte, and the kernels form the products in registers.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "compute/dtype.h"

namespace depcache {

struct WeightMatrix;

inline constexpr int64_t kPanelRows = 32;
inline constexpr int64_t kActScales = 4;

// Quantized panels (layouts above): a block of 32 inputs of Q8_0/Q6_K, a
// sub-block of Q4_K/Q4_0, and the per-row scales heading a K-quant
// super-block of 256.
inline constexpr size_t kBytePanelBlock = 2 * kPanelRows + kPanelRows * kQ32;    // 1088
inline constexpr size_t kQ6_KPanelHead = 2 * kPanelRows;                         // 64
inline constexpr size_t kQ6_KPanelBlock = kQ6_KPanelHead + 8 * kBytePanelBlock;  // 8768
inline constexpr size_t kQ4PanelNibbles = kPanelRows * kQ32 / 2;                 // 512
inline constexpr size_t kQ4PanelSub = 2 * kPanelRows + kQ4PanelNibbles;          // 576
inline constexpr size_t kQ4_KPanelHead = 2 * kPanelRows * 2;                     // 128
inline constexpr size_t kQ4_KPanelBlock = kQ4_KPanelHead + 8 * kQ4PanelSub;      // 4736

// Whether t has a panel layout and kernels.
bool packable(DType t);
// Bytes of one panel of n_in inputs (n_in a valid row length of t).
size_t panel_bytes(DType t, int64_t n_in);
// Q8_0/Q6_K (k_quants): where block b (inputs 32b .. 32b+31) of a panel
// starts; its bytes follow its 64 bytes of scales.
inline const uint8_t* byte_block(bool k_quants, const uint8_t* panel, int64_t b) {
  return k_quants ? panel + (b / 8) * kQ6_KPanelBlock + kQ6_KPanelHead + (b % 8) * kBytePanelBlock
                  : panel + b * kBytePanelBlock;
}
// Q4_K/Q4_0: where sub-block s (inputs 32s .. 32s+31) of a panel starts.
inline const uint8_t* q4_sub_block(bool k_quants, const uint8_t* panel, int64_t s) {
  return k_quants ? panel + (s / 8) * kQ4_KPanelBlock + kQ4_KPanelHead + (s % 8) * kQ4PanelSub
                  : panel + s * kQ4PanelSub;
}

class PackedMatrix {
 public:
  // Error(InvalidInput) if the type has no panel layout.
  explicit PackedMatrix(const WeightMatrix& w);

  DType type() const { return type_; }
  int64_t n_in() const { return n_in_; }
  int64_t n_out() const { return n_out_; }
  int64_t n_panels() const { return (n_out_ + kPanelRows - 1) / kPanelRows; }
  size_t bytes() const { return n_panels() * panel_bytes_; }
  const uint8_t* panel(int64_t p) const { return data_.get() + static_cast<size_t>(p) * panel_bytes_; }

 private:
  struct Unmap {
    size_t size;
    void operator()(uint8_t* p) const;
  };
  DType type_;
  int64_t n_in_, n_out_;
  size_t panel_bytes_;
  // Anonymous memory with huge pages where the kernel gives them: streaming
  // the weights of a decode step from it runs at nearly twice the speed of
  // the file mapping on the machines we measured.
  std::unique_ptr<uint8_t, Unmap> data_;
};

// Weight (r, k) of a panel as a float; the reference the kernels are tested
// against.
float panel_value(DType t, const uint8_t* panel, int64_t r, int64_t k);

// y[t * y_stride + r] = sum_k W(r, k) * x[t * x_stride + k] for the n_rows
// (<= 32) valid rows of one panel and n_tok tokens, with the kernels of the
// current ISA.
void panel_gemm(DType t, const uint8_t* panel, int64_t n_in, const float* x, int64_t x_stride, int64_t n_tok,
                float* y, int64_t y_stride, int n_rows);

// Int8 activations for the quantized panels: per token and block of 32
// inputs, d = max|x| / 127 and q = round(x / d); xs gets kActScales floats
// per block: d, d * sum q, and d * sum q over each half of 16 (for the
// 16-input sub-blocks of Q6_K). n_in must be a multiple of 32. A token's result depends on its own
// values only, so a batch gives every token what it would get alone.
void quantize_activations(const float* x, int64_t n_tok, int64_t n_in, int8_t* xq, float* xs);

// panel_gemm on int8 activations, with the kernels of the current ISA;
// Error(InvalidInput) where they have no int8 kernel for t.
void panel_gemm_i8(DType t, const uint8_t* panel, int64_t n_in, const int8_t* xq, const float* xs,
                   int64_t n_tok, float* y, int64_t y_stride, int n_rows);
// Whether the current ISA has an int8 kernel for t.
bool has_int8_panels(DType t);

// BF16 products for the F16 and BF16 panels: each token's input rounded to
// bfloat16 (nearest even), a row of n_in rounded up to even values with a 0
// after an odd n_in, so that the kernels read inputs in pairs.
int64_t bf16_row_length(int64_t n_in);
void round_activations_bf16(const float* x, int64_t n_tok, int64_t n_in, uint16_t* xb);
// What the BF16 kernels compute, for any CPU to check them against: weight
// (r, k) rounded to bfloat16 (F16 weights round; BF16 ones are kept), times
// the rounded activation, the products exact in fp32 and summed in fp32;
// subnormal operands and sums count as zero (the instruction flushes them).
// bf16_product_operand: v as a product sees it (rounded, subnormal to zero).
float bf16_product_operand(float v);
float panel_value_bf16(DType t, const uint8_t* panel, int64_t r, int64_t k);
// panel_gemm on bfloat16 activations (rows of bf16_row_length(n_in)), with
// the kernels of the current ISA; Error(InvalidInput) where there is none.
void panel_gemm_bf16(DType t, const uint8_t* panel, int64_t n_in, const uint16_t* xb, int64_t n_tok, float* y,
                     int64_t y_stride, int n_rows);
// Whether the current ISA has a bfloat16 kernel for t (AVX512-BF16: F16, BF16).
bool has_bf16_panels(DType t);

}  // namespace depcache

#pragma once
// Row-times-vector kernels for the matmuls of the forward pass, with the
// instruction set chosen once at run time.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "compute/dtype.h"

namespace depcache {

enum class Isa { Scalar, Avx2, Avx512 };

// Best ISA this CPU (and OS) supports: Avx2 needs avx2+fma+f16c, Avx512 needs
// avx512f+bw+vl+dq.
Isa best_isa();
bool isa_supported(Isa isa);
// Selects the kernels; Error(InvalidInput) if the CPU lacks the ISA.
void set_isa(Isa isa);
// The ISA in use. The first use picks DEPCACHE_ISA=scalar|avx2|avx512 when set
// (falling back to best_isa() with a warning if unsupported), else best_isa().
Isa current_isa();
std::string_view isa_name(Isa isa);                       // "scalar", "avx2", "avx512"
std::optional<Isa> isa_from_name(std::string_view name);  // case-insensitive

// Int8 activations: matmuls on Q8_0, Q4_K, Q4_0 and Q6_K panels quantize
// each token's input to int8 in blocks of 32 (as the Q8_0 format does) and
// use integer dot products (AVX-512 VNNI, or AVX2's vpmaddubsw/vpmaddwd),
// no longer exact in the activations. Off by default; the first use reads
// DEPCACHE_INT8_ACTIVATIONS=1. The scalar kernels have none: there the
// setting changes nothing.
void set_int8_activations(bool on);
bool int8_activations();

// BF16 products: matmuls on BF16 and F16 panels round each token's input to
// bfloat16 (and F16 weights too) and multiply pairs of bfloat16 with fp32
// sums (AVX512-BF16's vdpbf16ps), no longer exact in the activations (nor in
// F16 weights). Off by default; the first use reads DEPCACHE_BF16_PRODUCTS=1.
// Only CPUs with AVX512-BF16 have the kernels: elsewhere the setting changes
// nothing.
void set_bf16_products(bool on);
bool bf16_products();

// What the approximate matmul modes that are on make of a model's results:
// "" when matmuls are exact, else a name per mode ("int8-activations",
// "bf16-products", joined by '+'). K/V computed under a mode is cached under
// this name, so that it never mixes with exact K/V.
std::string matmul_mode_tag();

// sum_i dequant(w_row)[i] * x[i] for F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K.
// n must be a multiple of the block size, else Error(InvalidInput).
float dot_row(DType t, const void* w_row, const float* x, int64_t n);

// Dequantizes n_rows rows of n elements, row r starting at
// src + r * row_stride_bytes, into dst (n_rows * n floats, rows contiguous).
void dequantize_rows(DType t, const void* src, size_t row_stride_bytes, int64_t n_rows, int64_t n,
                     float* dst);

namespace detail {

// Kernels take n already checked against the block size.
using DotFn = float (*)(const void* w, const float* x, int64_t n);
using DequantFn = void (*)(const void* src, float* dst, int64_t n);
// One panel of a PackedMatrix times n_tok tokens (see packed_matrix.h).
using PanelFn = void (*)(const uint8_t* panel, int64_t n_in, const float* x, int64_t x_stride, int64_t n_tok,
                         float* y, int64_t y_stride, int n_rows);

// The same on int8 activations (quantize_activations in packed_matrix.h):
// xq rows of n_in values, xs rows of n_in / 32 groups of kActScales scales.
using PanelI8Fn = void (*)(const uint8_t* panel, int64_t n_in, const int8_t* xq, const float* xs,
                           int64_t n_tok, float* y, int64_t y_stride, int n_rows);

// The same on bfloat16 activations (round_activations_bf16 in
// packed_matrix.h): xb rows of n_in rounded up to even values, the padding 0.
using PanelBf16Fn = void (*)(const uint8_t* panel, int64_t n_in, const uint16_t* xb, int64_t n_tok, float* y,
                             int64_t y_stride, int n_rows);

struct TypeKernels {
  DotFn dot = nullptr;
  DequantFn dequant = nullptr;
  PanelFn panel = nullptr;
  PanelI8Fn panel_i8 = nullptr;      // only where the CPU has int8 dot products
  PanelBf16Fn panel_bf16 = nullptr;  // only where the CPU has bfloat16 dot products
};

// Indexed by the DType number (all supported numbers are below 32).
inline constexpr uint32_t kKernelTableSize = 32;
struct KernelSet {
  TypeKernels by_type[kKernelTableSize];
};

// The set of the current ISA.
const KernelSet& active_kernels();
// The current kernels of t, after checking that t has kernels and that n is a
// non-negative multiple of its block size (else Error(InvalidInput)).
const TypeKernels& kernels_for(DType t, int64_t n);

// Each ISA fills the entries it implements over a copy of the set below it,
// so unimplemented entries fall back to the lower ISA.
void fill_scalar_dequant(KernelSet& set);  // quant.cpp
void fill_scalar_panels(KernelSet& set);   // packed_matrix.cpp
void fill_avx2_kernels(KernelSet& set);    // dot_avx2.cpp
void fill_avx512_kernels(KernelSet& set);  // dot_avx512.cpp
void fill_avx2_panels(KernelSet& set);     // gemm_avx2.cpp
void fill_avx512_panels(KernelSet& set);   // gemm_avx512.cpp

}  // namespace detail
}  // namespace depcache

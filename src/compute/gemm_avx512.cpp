// AVX-512 panel kernels (layouts in packed_matrix.h): a tile of MR tokens by
// the 32 rows of a panel lives in 2*MR accumulators; each input column is
// decoded into two 16-row vectors once and multiplied into every token of the
// tile with a broadcast. Quantized columns are decoded to fp32 with the
// format's formula (one rounding), so x is used exactly as given; the
// one-token Q8_0/Q6_K tile instead scales each block's sum once (exact
// products, fp32 sums: the same error bound).
//
// As in dot_avx512.cpp, only intrinsics and plain structs come from headers.
#include <cstdint>

#include "compute/dot.h"
#include "compute/packed_matrix.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#include "compute/avx512_intrinsics.h"

namespace depcache::detail {
namespace {

constexpr int64_t kRows = kPanelRows;

// Accumulators of one tile. A single token (decode) alternates two sets on
// even and odd columns, since two FMA chains alone would wait on latency.
template <int MR>
struct Tile {
  static constexpr int kTokens = MR;
  static constexpr int kSets = MR == 1 ? 2 : MR;
  const float* x;
  int64_t xs;
  __m512 acc[kSets][2];

  void zero() {
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
  }
  template <int S>
  void put(int64_t k, __m512 w0, __m512 w1) {
    if constexpr (MR == 1) {
      const __m512 xb = _mm512_set1_ps(x[k]);
      acc[S][0] = _mm512_fmadd_ps(w0, xb, acc[S][0]);
      acc[S][1] = _mm512_fmadd_ps(w1, xb, acc[S][1]);
    } else {
      for (int t = 0; t < MR; ++t) {
        const __m512 xb = _mm512_set1_ps(x[t * xs + k]);
        acc[t][0] = _mm512_fmadd_ps(w0, xb, acc[t][0]);
        acc[t][1] = _mm512_fmadd_ps(w1, xb, acc[t][1]);
      }
    }
  }
  void store(float* y, int64_t ys, __mmask16 m0, __mmask16 m1) const {
    if constexpr (MR == 1) {
      _mm512_mask_storeu_ps(y, m0, _mm512_add_ps(acc[0][0], acc[1][0]));
      _mm512_mask_storeu_ps(y + 16, m1, _mm512_add_ps(acc[0][1], acc[1][1]));
    } else {
      for (int t = 0; t < MR; ++t) {
        _mm512_mask_storeu_ps(y + t * ys, m0, acc[t][0]);
        _mm512_mask_storeu_ps(y + t * ys + 16, m1, acc[t][1]);
      }
    }
  }
};

// ---- Column walkers: hand every input column k of a panel to the tile as
// two 16-row vectors, alternating the set S.

template <class Load>
struct WalkDense {
  static constexpr int kTokens = 12;
  template <class T>
  static void run(const uint8_t* panel, int64_t n_in, T& tile) {
    __m512 w0, w1, w2, w3;
    int64_t k = 0;
    for (; k + 2 <= n_in; k += 2) {
      Load::column(panel, k * kRows, w0, w1);
      Load::column(panel, (k + 1) * kRows, w2, w3);
      tile.template put<0>(k, w0, w1);
      tile.template put<1>(k + 1, w2, w3);
    }
    if (k < n_in) {
      Load::column(panel, k * kRows, w0, w1);
      tile.template put<0>(k, w0, w1);
    }
  }
};
// column(): the 32 rows of the input column starting at element i.
struct F32Load {
  static void column(const uint8_t* p, int64_t i, __m512& w0, __m512& w1) {
    w0 = _mm512_loadu_ps(reinterpret_cast<const float*>(p) + i);
    w1 = _mm512_loadu_ps(reinterpret_cast<const float*>(p) + i + 16);
  }
};
struct F16Load {
  static void column(const uint8_t* p, int64_t i, __m512& w0, __m512& w1) {
    w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)));
    w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i + 32)));
  }
};
// bf16 is the top half of an fp32: unpacking with zeros widens it exactly
// (the packed row order makes the result rows 0-15 and 16-31).
struct BF16Load {
  static void column(const uint8_t* p, int64_t i, __m512& w0, __m512& w1) {
    const __m512i v = _mm512_loadu_si512(p + 2 * i), z = _mm512_setzero_si512();
    w0 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, v));
    w1 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, v));
  }
};

// Quantized panels: 64 bytes hold one four-slot group of 16 rows; slot j
// of every row is (v >> 8j) & 0xFF, or a nibble of it for Q4_K.
inline __m512 slot(__m512i v, int shift, int mask, __m512 a, __m512 m) {
  const __m512i q = _mm512_and_si512(_mm512_srli_epi32(v, shift), _mm512_set1_epi32(mask));
  return _mm512_fmsub_ps(_mm512_cvtepi32_ps(q), a, m);  // a*q - m, exact before its one rounding
}

// Sixteen fp16 values, or sixteen signed or unsigned bytes, as floats.
inline __m512 fp16x16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 i8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 u8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// The scales a of block b's rows 0-15 and 16-31, for its inputs 0..15
// (half 0) or 16..31 (half 1): Q8_0's fp16 d, or Q6_K's (kK6) d * sc, an
// exact product. The block's bytes follow at byte_block(...) + 64.
template <bool kK6>
inline void byte_scales(const uint8_t* panel, int64_t b, int half, __m512& a0, __m512& a1) {
  const uint8_t* blk = byte_block(kK6, panel, b);
  if constexpr (kK6) {
    const uint8_t* head = panel + (b / 8) * kQ6_KPanelBlock;
    a0 = _mm512_mul_ps(fp16x16(head), i8x16(blk + 32 * half));
    a1 = _mm512_mul_ps(fp16x16(head + 32), i8x16(blk + 32 * half + 16));
  } else {
    a0 = fp16x16(blk);
    a1 = fp16x16(blk + 32);
  }
}

// Q8_0 (one scale per block, m = 128 a) and Q6_K (a scale per half of 16,
// m = 32 a): eight groups of four byte slots after the scales.
template <int kOffset, bool kHalves>
struct WalkBytes {
  static constexpr int kTokens = 10;

  // One token (decode), where the column decode is the cost: per run of
  // inputs under one scale, sum q * x with q = u - kOffset as an exact float,
  // then multiply the sum by the scale once. q comes from the byte's bits
  // placed in the mantissa of 2^23 (2^23 + u exactly) minus 2^23 + kOffset:
  // a logic op and a subtraction instead of a mask, a conversion and a fused
  // multiply-subtract. Error within fp32 summation's bound, as q * a is exact.
  static void run_one(const uint8_t* panel, int64_t n_in, Tile<1>& tile) {
    const __m512i magic = _mm512_set1_epi32(0x4B000000), low = _mm512_set1_epi32(0xFF);
    const __m512 bias = _mm512_set1_ps(8388608.0f + kOffset);
    // (v >> 8j & 0xFF) | magic as a float, minus the bias; 0xEA: (A & B) | C.
    auto q = [&](__m512i v, int j) {
      const __m512i b = j == 3   ? _mm512_or_si512(_mm512_srli_epi32(v, 24), magic)
                        : j == 0 ? _mm512_ternarylogic_epi32(v, low, magic, 0xEA)
                                 : _mm512_ternarylogic_epi32(_mm512_srli_epi32(v, 8 * j), low, magic, 0xEA);
      return _mm512_sub_ps(_mm512_castsi512_ps(b), bias);
    };
    const float* x = tile.x;
    __m512 s[2][2];
    auto clear = [&] {
      for (auto& a : s) a[0] = a[1] = _mm512_setzero_ps();
    };
    clear();
    for (int64_t b = 0; b < n_in / 32; ++b) {
      const uint8_t* u = byte_block(kHalves, panel, b) + 2 * kPanelRows;
      for (int64_t g = 0; g < 8; ++g) {
        const __m512i v0 = _mm512_loadu_si512(u + g * 128), v1 = _mm512_loadu_si512(u + g * 128 + 64);
        const int64_t k = 32 * b + 4 * g;
        for (int j = 0; j < 4; ++j) {
          const __m512 xb = _mm512_set1_ps(x[k + j]);
          s[j & 1][0] = _mm512_fmadd_ps(q(v0, j), xb, s[j & 1][0]);
          s[j & 1][1] = _mm512_fmadd_ps(q(v1, j), xb, s[j & 1][1]);
        }
        if (g == 7 || (kHalves && g == 3)) {  // the end of a scale's run
          __m512 a0, a1;
          byte_scales<kHalves>(panel, b, kHalves && g == 7, a0, a1);
          for (int set = 0; set < 2; ++set) {
            tile.acc[set][0] = _mm512_fmadd_ps(s[set][0], a0, tile.acc[set][0]);
            tile.acc[set][1] = _mm512_fmadd_ps(s[set][1], a1, tile.acc[set][1]);
          }
          clear();
        }
      }
    }
  }

  template <class T>
  static void run(const uint8_t* panel, int64_t n_in, T& tile) {
    if constexpr (T::kTokens == 1) return run_one(panel, n_in, tile);
    const __m512 off = _mm512_set1_ps(static_cast<float>(kOffset));
    for (int64_t b = 0; b < n_in / 32; ++b) {
      const uint8_t* u = byte_block(kHalves, panel, b) + 2 * kPanelRows;
      // The scales once per run of groups under them: Q6_K's halves are
      // groups 0-3 and 4-7, Q8_0's one scale covers all eight.
      for (int half = 0; half < (kHalves ? 2 : 1); ++half) {
        __m512 a0, a1;
        byte_scales<kHalves>(panel, b, half, a0, a1);
        const __m512 m0 = _mm512_mul_ps(a0, off), m1 = _mm512_mul_ps(a1, off);
        for (int64_t g = 4 * half; g < (kHalves ? 4 * half + 4 : 8); ++g) {
          const __m512i v0 = _mm512_loadu_si512(u + g * 128), v1 = _mm512_loadu_si512(u + g * 128 + 64);
          const int64_t k = 32 * b + 4 * g;
          tile.template put<0>(k, slot(v0, 0, 0xFF, a0, m0), slot(v1, 0, 0xFF, a1, m1));
          tile.template put<1>(k + 1, slot(v0, 8, 0xFF, a0, m0), slot(v1, 8, 0xFF, a1, m1));
          tile.template put<0>(k + 2, slot(v0, 16, 0xFF, a0, m0), slot(v1, 16, 0xFF, a1, m1));
          tile.template put<1>(k + 3, slot(v0, 24, 0xFF, a0, m0), slot(v1, 24, 0xFF, a1, m1));
        }
      }
    }
  }
};
using WalkQ8_0 = WalkBytes<128, false>;
using WalkQ6_K = WalkBytes<32, true>;

// A nibble slot: vpermps reads only the low four bits of each index, so one
// permute of the table 0..15 both masks the nibble and makes it a float
// (instead of a mask and a conversion), the same value either way. Used by
// the one-token tile (decode: panel_gemm Q4_K 37 -> 40 GFLOP/s on a Zen 4),
// where the FMA pipe has room for the permute; the larger tiles keep the mask
// (the permute cost them 2-3%).
inline __m512 nibble(__m512i v, int shift, __m512 a, __m512 m) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 q = _mm512_permutexvar_ps(shift ? _mm512_srli_epi32(v, shift) : v, iota);
  return _mm512_fmsub_ps(q, a, m);
}

// Q4_K (kK) or Q4_0 sub-block s: its scales a and offsets m (rows 0-15 and
// 16-31; a = d * sc and m = dmin * mn, exact products) and its nibbles.
template <bool kK>
inline const uint8_t* q4_scales(const uint8_t* panel, int64_t s, __m512& a0, __m512& a1, __m512& m0,
                                __m512& m1) {
  const uint8_t* sub = q4_sub_block(kK, panel, s);
  if constexpr (kK) {
    const uint8_t* head = panel + (s / 8) * kQ4_KPanelBlock;
    a0 = _mm512_mul_ps(fp16x16(head), u8x16(sub));
    a1 = _mm512_mul_ps(fp16x16(head + 32), u8x16(sub + 16));
    m0 = _mm512_mul_ps(fp16x16(head + 64), u8x16(sub + 32));
    m1 = _mm512_mul_ps(fp16x16(head + 96), u8x16(sub + 48));
  } else {
    a0 = fp16x16(sub);
    a1 = fp16x16(sub + 32);
    m0 = _mm512_mul_ps(a0, _mm512_set1_ps(8.0f));
    m1 = _mm512_mul_ps(a1, _mm512_set1_ps(8.0f));
  }
  return sub + 2 * kPanelRows;
}

template <bool kK>
struct WalkQ4 {
  static constexpr int kTokens = 8;
  template <class T>
  static void run(const uint8_t* panel, int64_t n_in, T& tile) {
    auto take = [](__m512i v, int shift, __m512 a, __m512 m) {
      if constexpr (T::kTokens == 1)
        return nibble(v, shift, a, m);
      else
        return slot(v, shift, 0xF, a, m);
    };
    for (int64_t s = 0; s < n_in / 32; ++s) {
      __m512 a0, a1, m0, m1;
      const uint8_t* u = q4_scales<kK>(panel, s, a0, a1, m0, m1);
      for (int64_t g = 0; g < 4; ++g) {
        const __m512i v0 = _mm512_loadu_si512(u + g * 128), v1 = _mm512_loadu_si512(u + g * 128 + 64);
        const int64_t k = 32 * s + 8 * g;
        // Input 8g + j: byte j % 4, low nibble for j < 4, high for j >= 4.
        tile.template put<0>(k, take(v0, 0, a0, m0), take(v1, 0, a1, m1));
        tile.template put<1>(k + 1, take(v0, 8, a0, m0), take(v1, 8, a1, m1));
        tile.template put<0>(k + 2, take(v0, 16, a0, m0), take(v1, 16, a1, m1));
        tile.template put<1>(k + 3, take(v0, 24, a0, m0), take(v1, 24, a1, m1));
        tile.template put<0>(k + 4, take(v0, 4, a0, m0), take(v1, 4, a1, m1));
        tile.template put<1>(k + 5, take(v0, 12, a0, m0), take(v1, 12, a1, m1));
        tile.template put<0>(k + 6, take(v0, 20, a0, m0), take(v1, 20, a1, m1));
        tile.template put<1>(k + 7, take(v0, 28, a0, m0), take(v1, 28, a1, m1));
      }
    }
  }
};

template <class Walk, int MR>
void tile(const uint8_t* panel, int64_t n_in, const float* x, int64_t xs, float* y, int64_t ys, __mmask16 m0,
          __mmask16 m1) {
  Tile<MR> t{x, xs, {}};
  t.zero();
  Walk::run(panel, n_in, t);
  t.store(y, ys, m0, m1);
}

// Every panel kernel's walk over the tokens: tile.template operator()<M>(i)
// for tiles of MR tokens from token i, then one of exactly the n_tok % MR
// left (the tile sizes are template arguments: the accumulators stay in
// registers).
template <int M, class F>
void last_tile(int left, int64_t i, F& tile) {
  if constexpr (M > 0) {
    if (left == M) return tile.template operator()<M>(i);
    last_tile<M - 1>(left, i, tile);
  }
}
template <int MR, class F>
void for_tiles(int64_t n_tok, F&& tile) {
  int64_t i = 0;
  for (; i + MR <= n_tok; i += MR) tile.template operator()<MR>(i);
  if (i < n_tok) last_tile<MR - 1>(static_cast<int>(n_tok - i), i, tile);
}

// Masks of a panel's valid rows among 0-15 and 16-31.
inline __mmask16 row_mask(int n) {
  return static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << (n < 0 ? 0 : n)) - 1);
}

template <class Walk>
void panel_kernel(const uint8_t* panel, int64_t n_in, const float* x, int64_t xs, int64_t n_tok, float* y,
                  int64_t ys, int n_rows) {
  const __mmask16 m0 = row_mask(n_rows), m1 = row_mask(n_rows - 16);
  for_tiles<Walk::kTokens>(
      n_tok, [&]<int M>(int64_t i) { tile<Walk, M>(panel, n_in, x + i * xs, xs, y + i * ys, ys, m0, m1); });
}

// ---- Int8 activations (VNNI). Per block of 32 inputs a tile of MR tokens
// by 32 rows sums u * xq in int32 (vpdpbusd: unsigned weights times signed
// activations, four per lane), then adds d_x * (a * sum - m * sum xq) in
// fp32: Q8_0 values are u - 128 (m = 128 a), Q6_K u - 32 per half block
// (m = 32 a, its own scale and activation sum per half), Q4_K/Q4_0 nibbles
// with their own m.
enum class I8 { Q8_0, Q4_K, Q4_0, Q6_K };

template <I8 kKind, int MR>
void tile_i8(const uint8_t* panel, int64_t n_in, const int8_t* xq, const float* xs, float* y, int64_t ys,
             __mmask16 k0, __mmask16 k1) {
  constexpr bool kQ4 = kKind == I8::Q4_K || kKind == I8::Q4_0;
  const int64_t nb = n_in / 32;
  __m512 acc[MR][2];
  for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
  __m512i ia[MR][2];
  auto x4 = [&](int t, int64_t i) {  // four activations of token t as one broadcast lane
    int32_t v;
    __builtin_memcpy(&v, xq + t * n_in + i, 4);
    return _mm512_set1_epi32(v);
  };
  // acc += d_x * (a * ia - m * sum xq), sum taken from scale slot `which`.
  auto flush = [&](int64_t b, __m512 a0, __m512 a1, __m512 m0, __m512 m1, int which) {
    for (int t = 0; t < MR; ++t) {
      const float* sc = xs + (t * nb + b) * kActScales;
      const __m512 dx = _mm512_set1_ps(sc[0]), dxs = _mm512_set1_ps(sc[which]);
      acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][0]), _mm512_mul_ps(a0, dx),
                                  _mm512_fnmadd_ps(m0, dxs, acc[t][0]));
      acc[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][1]), _mm512_mul_ps(a1, dx),
                                  _mm512_fnmadd_ps(m1, dxs, acc[t][1]));
      ia[t][0] = ia[t][1] = _mm512_setzero_si512();
    }
  };
  for (auto& a : ia) a[0] = a[1] = _mm512_setzero_si512();
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (kQ4) {
      __m512 a0, a1, m0, m1;
      const uint8_t* u = q4_scales<kKind == I8::Q4_K>(panel, b, a0, a1, m0, m1);
      const __m512i low4 = _mm512_set1_epi8(0x0F);
      for (int64_t g = 0; g < 4; ++g) {
        const __m512i v0 = _mm512_loadu_si512(u + g * 128), v1 = _mm512_loadu_si512(u + g * 128 + 64);
        const __m512i lo0 = _mm512_and_si512(v0, low4),
                      hi0 = _mm512_and_si512(_mm512_srli_epi32(v0, 4), low4);
        const __m512i lo1 = _mm512_and_si512(v1, low4),
                      hi1 = _mm512_and_si512(_mm512_srli_epi32(v1, 4), low4);
        for (int t = 0; t < MR; ++t) {
          const __m512i xl = x4(t, 32 * b + 8 * g), xh = x4(t, 32 * b + 8 * g + 4);
          ia[t][0] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ia[t][0], lo0, xl), hi0, xh);
          ia[t][1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ia[t][1], lo1, xl), hi1, xh);
        }
      }
      flush(b, a0, a1, m0, m1, 1);
    } else {
      constexpr bool kK6 = kKind == I8::Q6_K;
      __m512 a0, a1;
      const uint8_t* u = byte_block(kK6, panel, b) + 2 * kPanelRows;
      for (int64_t g = 0; g < 8; ++g) {
        const __m512i w0 = _mm512_loadu_si512(u + g * 128), w1 = _mm512_loadu_si512(u + g * 128 + 64);
        for (int t = 0; t < MR; ++t) {
          const __m512i xb = x4(t, 32 * b + 4 * g);
          ia[t][0] = _mm512_dpbusd_epi32(ia[t][0], w0, xb);
          ia[t][1] = _mm512_dpbusd_epi32(ia[t][1], w1, xb);
        }
        if (kKind == I8::Q6_K && (g == 3 || g == 7)) {
          byte_scales<kK6>(panel, b, g == 7, a0, a1);
          const __m512 s32 = _mm512_set1_ps(32.f);
          flush(b, a0, a1, _mm512_mul_ps(a0, s32), _mm512_mul_ps(a1, s32), g == 3 ? 2 : 3);
        }
      }
      if constexpr (kKind == I8::Q8_0) {
        byte_scales<kK6>(panel, b, 0, a0, a1);
        const __m512 s128 = _mm512_set1_ps(128.f);
        flush(b, a0, a1, _mm512_mul_ps(a0, s128), _mm512_mul_ps(a1, s128), 1);
      }
    }
  }
  for (int t = 0; t < MR; ++t) {
    _mm512_mask_storeu_ps(y + t * ys, k0, acc[t][0]);
    _mm512_mask_storeu_ps(y + t * ys + 16, k1, acc[t][1]);
  }
}

template <I8 kKind>
void panel_kernel_i8(const uint8_t* panel, int64_t n_in, const int8_t* xq, const float* xs, int64_t n_tok,
                     float* y, int64_t ys, int n_rows) {
  const __mmask16 k0 = row_mask(n_rows), k1 = row_mask(n_rows - 16);
  const int64_t xs_row = n_in / 32 * kActScales;
  for_tiles<kKind == I8::Q4_K || kKind == I8::Q4_0 ? 5 : 6>(n_tok, [&]<int M>(int64_t i) {
    tile_i8<kKind, M>(panel, n_in, xq + i * n_in, xs + i * xs_row, y + i * ys, ys, k0, k1);
  });
}

// ---- BF16 products (AVX512-BF16). A 32-bit lane holds one row's weights
// of two input columns k, k+1 as bfloat16, and vdpbf16ps adds both products
// (exact in fp32) to the row's fp32 sum: half the multiply instructions of
// the fp32 walk, on activations rounded to bfloat16 beforehand. kOdd: column
// k is the last one; its partner is zero (as is the activation's padding).

inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }

// BF16 panels: interleaving two columns gives the pairs, the layout's row
// order making the lanes rows 0-15 and 16-31.
struct BF16Pairs {
  static constexpr int kTokens = 12;
  template <bool kOdd>
  static void pair(const uint8_t* p, int64_t k, __m512i& w0, __m512i& w1) {
    const __m512i a = _mm512_loadu_si512(p + 2 * k * kRows);
    const __m512i b = kOdd ? _mm512_setzero_si512() : _mm512_loadu_si512(p + 2 * (k + 1) * kRows);
    w0 = _mm512_unpacklo_epi16(a, b);
    w1 = _mm512_unpackhi_epi16(a, b);
  }
};
// F16 panels: both columns widened, rounded to bfloat16 (nearest even) side
// by side, then interleaved.
struct F16Pairs {
  static constexpr int kTokens = 12;
  static __m512i half(const uint8_t* p, int64_t k, int64_t r0, bool zero, __m512i order) {
    const auto* c = reinterpret_cast<const __m256i*>(p + 2 * (k * kRows + r0));
    const __m512 a = _mm512_cvtph_ps(_mm256_loadu_si256(c));
    const __m512 b = zero ? _mm512_setzero_ps()
                          : _mm512_cvtph_ps(_mm256_loadu_si256(
                                reinterpret_cast<const __m256i*>(p + 2 * ((k + 1) * kRows + r0))));
    // Words 0-15: column k; 16-31: column k+1; then row i's two in lane i.
    return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(b, a));
  }
  template <bool kOdd>
  static void pair(const uint8_t* p, int64_t k, __m512i& w0, __m512i& w1) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23,
                                           7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    w0 = half(p, k, 0, kOdd, order);
    w1 = half(p, k, 16, kOdd, order);
  }
};

template <class Pairs, int MR>
void tile_bf16(const uint8_t* panel, int64_t n_in, const uint16_t* xb, float* y, int64_t ys, __mmask16 m0,
               __mmask16 m1) {
  // The fp32 tile's sums (one token alternating two sets) and store.
  Tile<MR> sums{nullptr, 0, {}};
  sums.zero();
  const int64_t xs = bf16_row_length(n_in);
  auto step = [&]<bool kOdd>(int set, int64_t k) {
    __m512i w0, w1;
    Pairs::template pair<kOdd>(panel, k, w0, w1);
    for (int t = 0; t < MR; ++t) {
      int32_t two;
      __builtin_memcpy(&two, xb + t * xs + k, 4);
      const __m512bh x2 = as_bh(_mm512_set1_epi32(two));
      __m512* a = sums.acc[MR == 1 ? set : t];
      a[0] = _mm512_dpbf16_ps(a[0], as_bh(w0), x2);
      a[1] = _mm512_dpbf16_ps(a[1], as_bh(w1), x2);
    }
  };
  int64_t k = 0;
  for (; k + 4 <= n_in; k += 4) {
    step.template operator()<false>(0, k);
    step.template operator()<false>(1, k + 2);
  }
  if (k + 2 <= n_in) step.template operator()<false>(0, k), k += 2;
  if (k < n_in) step.template operator()<true>(1, k);
  sums.store(y, ys, m0, m1);
}

template <class Pairs>
void panel_kernel_bf16(const uint8_t* panel, int64_t n_in, const uint16_t* xb, int64_t n_tok, float* y,
                       int64_t ys, int n_rows) {
  const __mmask16 m0 = row_mask(n_rows), m1 = row_mask(n_rows - 16);
  const int64_t xs = bf16_row_length(n_in);
  for_tiles<Pairs::kTokens>(n_tok, [&]<int M>(int64_t i) {
    tile_bf16<Pairs, M>(panel, n_in, xb + i * xs, y + i * ys, ys, m0, m1);
  });
}

}  // namespace

void fill_avx512_panels(KernelSet& set) {
  auto put = [&](DType t, PanelFn f) { set.by_type[static_cast<uint32_t>(t)].panel = f; };
  put(DType::F32, panel_kernel<WalkDense<F32Load>>);
  put(DType::F16, panel_kernel<WalkDense<F16Load>>);
  put(DType::BF16, panel_kernel<WalkDense<BF16Load>>);
  put(DType::Q8_0, panel_kernel<WalkQ8_0>);
  put(DType::Q4_K, panel_kernel<WalkQ4<true>>);
  put(DType::Q4_0, panel_kernel<WalkQ4<false>>);
  put(DType::Q6_K, panel_kernel<WalkQ6_K>);
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni")) {
    auto put_i8 = [&](DType t, PanelI8Fn f) { set.by_type[static_cast<uint32_t>(t)].panel_i8 = f; };
    put_i8(DType::Q8_0, panel_kernel_i8<I8::Q8_0>);
    put_i8(DType::Q4_K, panel_kernel_i8<I8::Q4_K>);
    put_i8(DType::Q4_0, panel_kernel_i8<I8::Q4_0>);
    put_i8(DType::Q6_K, panel_kernel_i8<I8::Q6_K>);
  }
  if (__builtin_cpu_supports("avx512bf16")) {
    auto put_bf16 = [&](DType t, PanelBf16Fn f) { set.by_type[static_cast<uint32_t>(t)].panel_bf16 = f; };
    put_bf16(DType::BF16, panel_kernel_bf16<BF16Pairs>);
    put_bf16(DType::F16, panel_kernel_bf16<F16Pairs>);
  }
}

}  // namespace depcache::detail

#else
namespace depcache::detail {
void fill_avx512_panels(KernelSet&) {}  // compiler without AVX-512: the AVX2 kernels stay
}  // namespace depcache::detail
#endif

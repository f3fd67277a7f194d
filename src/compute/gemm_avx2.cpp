// AVX2 panel kernels (layouts in packed_matrix.h). With 16 vector registers
// a tile covers 16 rows (one half of a panel) by MR tokens; otherwise the
// scheme of the AVX-512 file: decode a column once, broadcast-multiply it
// into every token of the tile.
//
// As in dot_avx2.cpp, only intrinsics and plain structs come from headers.
#include <algorithm>
#include <cstdint>

#include "compute/dot.h"
#include "compute/packed_matrix.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace depcache::detail {
namespace {

constexpr int64_t kRows = kPanelRows;

template <int MR>
struct Tile {
  static constexpr int kSets = MR == 1 ? 2 : MR;
  const float* x;
  int64_t xs;
  __m256 acc[kSets][2];

  void zero() {
    for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  }
  template <int S>
  void put(int64_t k, __m256 w0, __m256 w1) {
    if constexpr (MR == 1) {
      const __m256 xb = _mm256_broadcast_ss(x + k);
      acc[S][0] = _mm256_fmadd_ps(w0, xb, acc[S][0]);
      acc[S][1] = _mm256_fmadd_ps(w1, xb, acc[S][1]);
    } else {
      for (int t = 0; t < MR; ++t) {
        const __m256 xb = _mm256_broadcast_ss(x + t * xs + k);
        acc[t][0] = _mm256_fmadd_ps(w0, xb, acc[t][0]);
        acc[t][1] = _mm256_fmadd_ps(w1, xb, acc[t][1]);
      }
    }
  }
  // Vector 0 holds rows o0.., vector 1 rows o1.. (masks: the valid ones).
  void store(float* y, int64_t ys, int o0, int o1, __m256i m0, __m256i m1) const {
    if constexpr (MR == 1) {
      _mm256_maskstore_ps(y + o0, m0, _mm256_add_ps(acc[0][0], acc[1][0]));
      _mm256_maskstore_ps(y + o1, m1, _mm256_add_ps(acc[0][1], acc[1][1]));
    } else {
      for (int t = 0; t < MR; ++t) {
        _mm256_maskstore_ps(y + t * ys + o0, m0, acc[t][0]);
        _mm256_maskstore_ps(y + t * ys + o1, m1, acc[t][1]);
      }
    }
  }
};

// ---- Column walkers over rows 16h .. 16h + 15 of a panel.

template <class Load>
struct WalkDense {
  static constexpr int kTokens = 6;
  // Rows of the two vectors of half h (see BF16Load for the exception).
  static constexpr int row_offset(int h, int part) { return Load::row_offset(h, part); }
  template <class T>
  static void run(const uint8_t* panel, int64_t n_in, int h, T& tile) {
    __m256 w0, w1, w2, w3;
    int64_t k = 0;
    for (; k + 2 <= n_in; k += 2) {
      Load::half(panel, k * kRows + 16 * h, w0, w1);
      Load::half(panel, (k + 1) * kRows + 16 * h, w2, w3);
      tile.template put<0>(k, w0, w1);
      tile.template put<1>(k + 1, w2, w3);
    }
    if (k < n_in) {
      Load::half(panel, k * kRows + 16 * h, w0, w1);
      tile.template put<0>(k, w0, w1);
    }
  }
};
// half(): the 16 stored values of a column starting at element i.
struct F32Load {
  static constexpr int row_offset(int h, int part) { return 16 * h + 8 * part; }
  static void half(const uint8_t* p, int64_t i, __m256& w0, __m256& w1) {
    w0 = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + i);
    w1 = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + i + 8);
  }
};
struct F16Load {
  static constexpr int row_offset(int h, int part) { return 16 * h + 8 * part; }
  static void half(const uint8_t* p, int64_t i, __m256& w0, __m256& w1) {
    w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
    w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i + 16)));
  }
};
// bf16 widened by unpacking with zeros; with the packed row order (see
// packed_matrix.h) half h yields rows 8h..8h+7 and 16+8h..16+8h+7.
struct BF16Load {
  static constexpr int row_offset(int h, int part) { return 8 * h + 16 * part; }
  static void half(const uint8_t* p, int64_t i, __m256& w0, __m256& w1) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i)),
                  z = _mm256_setzero_si256();
    w0 = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
    w1 = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
  }
};

// Quantized panels: 32 bytes hold one four-slot group of 8 rows; slot j of
// every row is (v >> 8j) & 0xFF, or a nibble of it for Q4_K.
inline __m256 slot(__m256i v, int shift, int mask, __m256 a, __m256 m) {
  const __m256i q = _mm256_and_si256(_mm256_srli_epi32(v, shift), _mm256_set1_epi32(mask));
  return _mm256_fmsub_ps(_mm256_cvtepi32_ps(q), a, m);  // a*q - m, exact before its one rounding
}
inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Eight fp16 values, or eight signed or unsigned bytes, as floats.
inline __m256 fp16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 i8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 u8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// The scales a of block b's rows 16h .. 16h+7 and 16h+8 .. 16h+15, for its
// inputs 0..15 (half 0) or 16..31 (half 1): Q8_0's fp16 d, or Q6_K's (kK6)
// d * sc, an exact product. The block's bytes follow at byte_block(...) + 64.
template <bool kK6>
inline void byte_scales(const uint8_t* panel, int64_t b, int h, int half, __m256& a0, __m256& a1) {
  const uint8_t* blk = byte_block(kK6, panel, b);
  if constexpr (kK6) {
    const uint8_t* head = panel + (b / 8) * kQ6_KPanelBlock + 32 * h;
    a0 = _mm256_mul_ps(fp16x8(head), i8x8(blk + 32 * half + 16 * h));
    a1 = _mm256_mul_ps(fp16x8(head + 16), i8x8(blk + 32 * half + 16 * h + 8));
  } else {
    a0 = fp16x8(blk + 32 * h);
    a1 = fp16x8(blk + 32 * h + 16);
  }
}

// Q8_0 (one scale per block, m = 128 a) and Q6_K (a scale per half of 16,
// m = 32 a): eight groups of four byte slots after the scales.
template <int kOffset, bool kHalves>
struct WalkBytes {
  static constexpr int kTokens = 5;
  static constexpr int row_offset(int h, int part) { return 16 * h + 8 * part; }
  template <class T>
  static void run(const uint8_t* panel, int64_t n_in, int h, T& tile) {
    const __m256 off = _mm256_set1_ps(static_cast<float>(kOffset));
    for (int64_t b = 0; b < n_in / 32; ++b) {
      const uint8_t* u = byte_block(kHalves, panel, b) + 2 * kPanelRows + 64 * h;
      // The scales once per run of groups under them: Q6_K's halves are
      // groups 0-3 and 4-7, Q8_0's one scale covers all eight.
      for (int half = 0; half < (kHalves ? 2 : 1); ++half) {
        __m256 a0, a1;
        byte_scales<kHalves>(panel, b, h, half, a0, a1);
        const __m256 m0 = _mm256_mul_ps(a0, off), m1 = _mm256_mul_ps(a1, off);
        for (int64_t g = 4 * half; g < (kHalves ? 4 * half + 4 : 8); ++g) {
          const __m256i v0 = load32(u + g * 128), v1 = load32(u + g * 128 + 32);
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

// Q4_K (kK) or Q4_0 sub-block s, rows 16h .. 16h+15: its scales a and
// offsets m (a = d * sc and m = dmin * mn, exact products) and its nibbles.
template <bool kK>
inline const uint8_t* q4_scales(const uint8_t* panel, int64_t s, int h, __m256& a0, __m256& a1, __m256& m0,
                                __m256& m1) {
  const uint8_t* sub = q4_sub_block(kK, panel, s);
  if constexpr (kK) {
    const uint8_t* head = panel + (s / 8) * kQ4_KPanelBlock + 32 * h;
    const uint8_t* sc = sub + 16 * h;
    a0 = _mm256_mul_ps(fp16x8(head), u8x8(sc));
    a1 = _mm256_mul_ps(fp16x8(head + 16), u8x8(sc + 8));
    m0 = _mm256_mul_ps(fp16x8(head + 64), u8x8(sc + 32));
    m1 = _mm256_mul_ps(fp16x8(head + 80), u8x8(sc + 40));
  } else {
    a0 = fp16x8(sub + 32 * h);
    a1 = fp16x8(sub + 32 * h + 16);
    m0 = _mm256_mul_ps(a0, _mm256_set1_ps(8.0f));
    m1 = _mm256_mul_ps(a1, _mm256_set1_ps(8.0f));
  }
  return sub + 2 * kPanelRows + 64 * h;
}

template <bool kK>
struct WalkQ4 {
  static constexpr int kTokens = 4;
  static constexpr int row_offset(int h, int part) { return 16 * h + 8 * part; }
  template <class T>
  static void run(const uint8_t* panel, int64_t n_in, int h, T& tile) {
    for (int64_t s = 0; s < n_in / 32; ++s) {
      __m256 a0, a1, m0, m1;
      const uint8_t* u = q4_scales<kK>(panel, s, h, a0, a1, m0, m1);
      for (int64_t g = 0; g < 4; ++g) {
        const __m256i v0 = load32(u + g * 128), v1 = load32(u + g * 128 + 32);
        const int64_t k = 32 * s + 8 * g;
        // Input 8g + j: byte j % 4, low nibble for j < 4, high for j >= 4.
        tile.template put<0>(k, slot(v0, 0, 0xF, a0, m0), slot(v1, 0, 0xF, a1, m1));
        tile.template put<1>(k + 1, slot(v0, 8, 0xF, a0, m0), slot(v1, 8, 0xF, a1, m1));
        tile.template put<0>(k + 2, slot(v0, 16, 0xF, a0, m0), slot(v1, 16, 0xF, a1, m1));
        tile.template put<1>(k + 3, slot(v0, 24, 0xF, a0, m0), slot(v1, 24, 0xF, a1, m1));
        tile.template put<0>(k + 4, slot(v0, 4, 0xF, a0, m0), slot(v1, 4, 0xF, a1, m1));
        tile.template put<1>(k + 5, slot(v0, 12, 0xF, a0, m0), slot(v1, 12, 0xF, a1, m1));
        tile.template put<0>(k + 6, slot(v0, 20, 0xF, a0, m0), slot(v1, 20, 0xF, a1, m1));
        tile.template put<1>(k + 7, slot(v0, 28, 0xF, a0, m0), slot(v1, 28, 0xF, a1, m1));
      }
    }
  }
};

template <class Walk, int MR>
void tile(const uint8_t* panel, int64_t n_in, int h, const float* x, int64_t xs, float* y, int64_t ys,
          const __m256i* masks) {
  Tile<MR> t{x, xs, {}};
  t.zero();
  Walk::run(panel, n_in, h, t);
  t.store(y, ys, Walk::row_offset(h, 0), Walk::row_offset(h, 1), masks[0], masks[1]);
}

template <class Walk, int MR>
void tail(int left, const uint8_t* panel, int64_t n_in, int h, const float* x, int64_t xs, float* y,
          int64_t ys, const __m256i* masks) {
  if constexpr (MR > 0) {
    if (left == MR) return tile<Walk, MR>(panel, n_in, h, x, xs, y, ys, masks);
    tail<Walk, MR - 1>(left, panel, n_in, h, x, xs, y, ys, masks);
  }
}

// Lanes below n (of 8) set.
inline __m256i lane_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <class Walk>
void panel_kernel(const uint8_t* panel, int64_t n_in, const float* x, int64_t xs, int64_t n_tok, float* y,
                  int64_t ys, int n_rows) {
  constexpr int MR = Walk::kTokens;
  for (int h = 0; h < 2; ++h) {
    const int o0 = Walk::row_offset(h, 0), o1 = Walk::row_offset(h, 1);
    if (n_rows <= std::min(o0, o1)) continue;  // no valid row in this half
    const __m256i masks[2] = {lane_mask(n_rows - o0), lane_mask(n_rows - o1)};
    int64_t i = 0;
    for (; i + MR <= n_tok; i += MR) tile<Walk, MR>(panel, n_in, h, x + i * xs, xs, y + i * ys, ys, masks);
    if (i < n_tok)
      tail<Walk, MR - 1>(static_cast<int>(n_tok - i), panel, n_in, h, x + i * xs, xs, y + i * ys, ys, masks);
  }
}

// ---- Int8 activations without VNNI. Per block of 32 inputs a tile of MR
// tokens by one half panel (16 rows) sums weight times xq in int32 with
// vpmaddubsw (unsigned by signed bytes, pairs to int16) and vpmaddwd (pairs
// to int32), then adds d_x * (a * sum - m * sum xq) in fp32 as the VNNI
// kernel does. A pair of products must fit int16: nibbles (Q4_K, Q4_0) and
// 6-bit values (Q6_K) do; Q8_0's slots (q + 128) would not, so they are
// turned back into q and multiplied as |q| by x with q's sign (|q| <= 128,
// |x| <= 127), with m = 0.
enum class I8 { Q8_0, Q4_K, Q4_0, Q6_K };

// Four unsigned weight bytes by four signed activations per int32 lane.
inline __m256i dot4(__m256i u, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

template <I8 kKind, int MR>
void tile_i8(const uint8_t* panel, int64_t n_in, int h, const int8_t* xq, const float* xs, float* y,
             int64_t ys, const __m256i* masks) {
  const int64_t nb = n_in / 32;
  __m256 acc[MR][2];
  __m256i ia[MR][2];
  for (int t = 0; t < MR; ++t) {
    acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    ia[t][0] = ia[t][1] = _mm256_setzero_si256();
  }
  auto x4 = [&](int t, int64_t i) {  // four activations of token t as one broadcast lane
    int32_t v;
    __builtin_memcpy(&v, xq + t * n_in + i, 4);
    return _mm256_set1_epi32(v);
  };
  // acc += d_x * (a * ia - m * sum xq), the sum from scale slot `which`.
  auto flush = [&](int64_t b, __m256 a0, __m256 a1, __m256 m0, __m256 m1, int which) {
    for (int t = 0; t < MR; ++t) {
      const float* sc = xs + (t * nb + b) * kActScales;
      const __m256 dx = _mm256_set1_ps(sc[0]), dxs = _mm256_set1_ps(sc[which]);
      acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t][0]), _mm256_mul_ps(a0, dx),
                                  _mm256_fnmadd_ps(m0, dxs, acc[t][0]));
      acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t][1]), _mm256_mul_ps(a1, dx),
                                  _mm256_fnmadd_ps(m1, dxs, acc[t][1]));
      ia[t][0] = ia[t][1] = _mm256_setzero_si256();
    }
  };
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    constexpr bool kK6 = kKind == I8::Q6_K;
    const uint8_t* bytes = byte_block(kK6, panel, b) + 2 * kPanelRows + 64 * h;  // Q8_0, Q6_K
    if constexpr (kKind == I8::Q4_K || kKind == I8::Q4_0) {
      __m256 a0, a1, m0, m1;
      const uint8_t* u = q4_scales<kKind == I8::Q4_K>(panel, b, h, a0, a1, m0, m1);
      const __m256i low4 = _mm256_set1_epi8(0x0F);
      for (int64_t g = 0; g < 4; ++g) {
        const __m256i v0 = load32(u + g * 128), v1 = load32(u + g * 128 + 32);
        const __m256i lo0 = _mm256_and_si256(v0, low4),
                      hi0 = _mm256_and_si256(_mm256_srli_epi32(v0, 4), low4);
        const __m256i lo1 = _mm256_and_si256(v1, low4),
                      hi1 = _mm256_and_si256(_mm256_srli_epi32(v1, 4), low4);
        for (int t = 0; t < MR; ++t) {
          const __m256i xl = x4(t, 32 * b + 8 * g), xh = x4(t, 32 * b + 8 * g + 4);
          ia[t][0] = _mm256_add_epi32(ia[t][0], _mm256_add_epi32(dot4(lo0, xl), dot4(hi0, xh)));
          ia[t][1] = _mm256_add_epi32(ia[t][1], _mm256_add_epi32(dot4(lo1, xl), dot4(hi1, xh)));
        }
      }
      flush(b, a0, a1, m0, m1, 1);
    } else if constexpr (kKind == I8::Q8_0) {
      const uint8_t* u = bytes;
      const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
      for (int64_t g = 0; g < 8; ++g) {
        const __m256i q0 = _mm256_xor_si256(load32(u + g * 128), bias),
                      q1 = _mm256_xor_si256(load32(u + g * 128 + 32), bias);
        const __m256i m0 = _mm256_sign_epi8(q0, q0), m1 = _mm256_sign_epi8(q1, q1);  // |q|
        for (int t = 0; t < MR; ++t) {
          const __m256i xb = x4(t, 32 * b + 4 * g);
          ia[t][0] = _mm256_add_epi32(ia[t][0], dot4(m0, _mm256_sign_epi8(xb, q0)));
          ia[t][1] = _mm256_add_epi32(ia[t][1], dot4(m1, _mm256_sign_epi8(xb, q1)));
        }
      }
      __m256 a0, a1;
      byte_scales<false>(panel, b, h, 0, a0, a1);
      flush(b, a0, a1, zero, zero, 1);
    } else {
      const uint8_t* u = bytes;
      for (int64_t g = 0; g < 8; ++g) {
        const __m256i w0 = load32(u + g * 128), w1 = load32(u + g * 128 + 32);
        for (int t = 0; t < MR; ++t) {
          const __m256i xb = x4(t, 32 * b + 4 * g);
          ia[t][0] = _mm256_add_epi32(ia[t][0], dot4(w0, xb));
          ia[t][1] = _mm256_add_epi32(ia[t][1], dot4(w1, xb));
        }
        if (g == 3 || g == 7) {
          __m256 a0, a1;
          byte_scales<true>(panel, b, h, g == 7, a0, a1);
          const __m256 s32 = _mm256_set1_ps(32.f);
          flush(b, a0, a1, _mm256_mul_ps(a0, s32), _mm256_mul_ps(a1, s32), g == 3 ? 2 : 3);
        }
      }
    }
  }
  for (int t = 0; t < MR; ++t) {
    _mm256_maskstore_ps(y + t * ys + 16 * h, masks[0], acc[t][0]);
    _mm256_maskstore_ps(y + t * ys + 16 * h + 8, masks[1], acc[t][1]);
  }
}

template <I8 kKind, int MR>
void tail_i8(int left, const uint8_t* panel, int64_t n_in, int h, const int8_t* xq, const float* xs, float* y,
             int64_t ys, const __m256i* masks) {
  if constexpr (MR > 0) {
    if (left == MR) return tile_i8<kKind, MR>(panel, n_in, h, xq, xs, y, ys, masks);
    tail_i8<kKind, MR - 1>(left, panel, n_in, h, xq, xs, y, ys, masks);
  }
}

template <I8 kKind>
void panel_kernel_i8(const uint8_t* panel, int64_t n_in, const int8_t* xq, const float* xs, int64_t n_tok,
                     float* y, int64_t ys, int n_rows) {
  constexpr int MR = 2;
  const int64_t xs_row = n_in / 32 * kActScales;
  for (int h = 0; h < 2; ++h) {
    if (n_rows <= 16 * h) continue;  // no valid row in this half
    const __m256i masks[2] = {lane_mask(n_rows - 16 * h), lane_mask(n_rows - 16 * h - 8)};
    int64_t i = 0;
    for (; i + MR <= n_tok; i += MR)
      tile_i8<kKind, MR>(panel, n_in, h, xq + i * n_in, xs + i * xs_row, y + i * ys, ys, masks);
    if (i < n_tok)
      tail_i8<kKind, MR - 1>(static_cast<int>(n_tok - i), panel, n_in, h, xq + i * n_in, xs + i * xs_row,
                             y + i * ys, ys, masks);
  }
}

}  // namespace

void fill_avx2_panels(KernelSet& set) {
  auto put = [&](DType t, PanelFn f) { set.by_type[static_cast<uint32_t>(t)].panel = f; };
  put(DType::F32, panel_kernel<WalkDense<F32Load>>);
  put(DType::F16, panel_kernel<WalkDense<F16Load>>);
  put(DType::BF16, panel_kernel<WalkDense<BF16Load>>);
  put(DType::Q8_0, panel_kernel<WalkQ8_0>);
  put(DType::Q4_K, panel_kernel<WalkQ4<true>>);
  put(DType::Q4_0, panel_kernel<WalkQ4<false>>);
  put(DType::Q6_K, panel_kernel<WalkQ6_K>);
  auto put_i8 = [&](DType t, PanelI8Fn f) { set.by_type[static_cast<uint32_t>(t)].panel_i8 = f; };
  put_i8(DType::Q8_0, panel_kernel_i8<I8::Q8_0>);
  put_i8(DType::Q4_K, panel_kernel_i8<I8::Q4_K>);
  put_i8(DType::Q4_0, panel_kernel_i8<I8::Q4_0>);
  put_i8(DType::Q6_K, panel_kernel_i8<I8::Q6_K>);
}

}  // namespace depcache::detail

#else
namespace depcache::detail {
void fill_avx2_panels(KernelSet&) {}  // compiler without AVX2: the portable kernels stay
}  // namespace depcache::detail
#endif

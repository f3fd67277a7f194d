#include "compute/packed_matrix.h"

#include <sys/mman.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "compute/dot.h"
#include "compute/fp16.h"
#include "compute/matmul.h"
#include "compute/quant.h"
#include "util/error.h"

namespace depcache {
namespace {

// Position of row r within an input column of a BF16 panel: interleaved so
// that widening by unpacking with zeros (which works per 128-bit lane on 4
// of every 8 values) yields rows in order.
constexpr int64_t bf16_slot(int64_t r) {
  return r < 16 ? (r / 4) * 8 + r % 4 : ((r - 16) / 4) * 8 + 4 + r % 4;
}

template <class T>
void pack_dense(const WeightMatrix& w, int64_t r0, int64_t rows, uint8_t* dst) {
  auto* out = reinterpret_cast<T*>(dst);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* src = reinterpret_cast<const T*>(w.row(r0 + r));
    const int64_t slot = w.type == DType::BF16 ? bf16_slot(r) : r;
    for (int64_t k = 0; k < w.n_in; ++k) out[k * kPanelRows + slot] = src[k];
  }
}

// Offset of byte slot j (< 32) of row r in the value bytes of a block: slots
// come in groups of four per row, groups of all 32 rows one after another.
constexpr size_t slot_byte(int64_t r, int64_t j) {
  return static_cast<size_t>((j / 4) * kPanelRows * 4 + r * 4 + j % 4);
}
// The slot of Q4_K input i (< 32): inputs 8g+b and 8g+4+b share slot 4g+b.
constexpr int64_t q4k_slot(int64_t i) { return (i / 8) * 4 + i % 4; }

void pack_q8_0(const WeightMatrix& w, int64_t r0, int64_t rows, uint8_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(w.row(r0 + r));
    for (int64_t b = 0; b < w.n_in / kQ32; ++b) {
      uint8_t* out = dst + b * kBytePanelBlock;
      std::memcpy(out + 2 * r, &blocks[b].d, 2);
      uint8_t* u = out + 2 * kPanelRows;
      for (int64_t k = 0; k < kQ32; ++k) u[slot_byte(r, k)] = static_cast<uint8_t>(blocks[b].qs[k] + 128);
    }
  }
}

// Writes the nibble of each input of row r into a Q4 sub-block's nibbles.
void put_q4_nibbles(uint8_t* u, int64_t r, const int* q) {
  // Inputs 8g .. 8g+3 in the low nibbles, 8g+4 .. 8g+7 in the high.
  for (int64_t i = 0; i < kQ32; ++i)
    u[slot_byte(r, q4k_slot(i))] |= static_cast<uint8_t>(q[i] << (i % 8 < 4 ? 0 : 4));
}

void pack_q4_k(const WeightMatrix& w, int64_t r0, int64_t rows, uint8_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto* blocks = reinterpret_cast<const BlockQ4_K*>(w.row(r0 + r));
    for (int64_t sb = 0; sb < w.n_in / kQK; ++sb) {
      const BlockQ4_K& b = blocks[sb];
      uint8_t* head = dst + sb * kQ4_KPanelBlock;
      std::memcpy(head + 2 * r, &b.d, 2);
      std::memcpy(head + 2 * (kPanelRows + r), &b.dmin, 2);
      uint8_t sc[8], mn[8];
      unpack_q4k_scales(b.scales, sc, mn);
      for (int s = 0; s < 8; ++s) {
        uint8_t* sub = head + kQ4_KPanelHead + s * kQ4PanelSub;
        sub[r] = sc[s];
        sub[kPanelRows + r] = mn[s];
        const uint8_t* src = b.qs + 32 * (s / 2);
        int q[kQ32];
        for (int64_t i = 0; i < kQ32; ++i) q[i] = (src[i] >> (4 * (s & 1))) & 0xF;
        put_q4_nibbles(sub + 2 * kPanelRows, r, q);
      }
    }
  }
}

void pack_q4_0(const WeightMatrix& w, int64_t r0, int64_t rows, uint8_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto* blocks = reinterpret_cast<const BlockQ4_0*>(w.row(r0 + r));
    for (int64_t b = 0; b < w.n_in / kQ32; ++b) {
      uint8_t* sub = dst + b * kQ4PanelSub;
      std::memcpy(sub + 2 * r, &blocks[b].d, 2);
      int q[kQ32];
      for (int i = 0; i < 16; ++i) q[i] = blocks[b].qs[i] & 0xF, q[i + 16] = blocks[b].qs[i] >> 4;
      put_q4_nibbles(sub + 2 * kPanelRows, r, q);
    }
  }
}

void pack_q6_k(const WeightMatrix& w, int64_t r0, int64_t rows, uint8_t* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto* blocks = reinterpret_cast<const BlockQ6_K*>(w.row(r0 + r));
    for (int64_t sb = 0; sb < w.n_in / kQK; ++sb) {
      const BlockQ6_K& b = blocks[sb];
      uint8_t* head = dst + sb * kQ6_KPanelBlock;
      std::memcpy(head + 2 * r, &b.d, 2);
      for (int64_t c = 0; c < 8; ++c) {
        uint8_t* out = head + kQ6_KPanelHead + c * kBytePanelBlock;
        out[r] = static_cast<uint8_t>(b.scales[2 * c]);
        out[kPanelRows + r] = static_cast<uint8_t>(b.scales[2 * c + 1]);
        uint8_t* u = out + 2 * kPanelRows;
        for (int64_t i = 0; i < kQ32; ++i) {
          // Element e of the super-block (layout in quant.h).
          const int64_t e = 32 * c + i, h = e / 128, l = e % 32, quarter = (e % 128) / 32;
          const uint8_t lo = b.ql[64 * h + l + 32 * (quarter & 1)];
          const int nibble = quarter < 2 ? (lo & 0xF) : (lo >> 4);
          const int top = (b.qh[32 * h + l] >> (2 * quarter)) & 3;
          u[slot_byte(r, i)] = static_cast<uint8_t>(nibble | (top << 4));
        }
      }
    }
  }
}

// The portable kernel: one input column of the panel at a time, decoded by
// panel_value.
void panel_scalar(DType t, const uint8_t* panel, int64_t n_in, const float* x, int64_t x_stride,
                  int64_t n_tok, float* y, int64_t y_stride, int n_rows) {
  std::vector<float> acc(static_cast<size_t>(n_tok) * kPanelRows, 0.0f);
  float col[kPanelRows];
  for (int64_t k = 0; k < n_in; ++k) {
    for (int r = 0; r < n_rows; ++r) col[r] = panel_value(t, panel, r, k);
    for (int64_t i = 0; i < n_tok; ++i) {
      const float xv = x[i * x_stride + k];
      for (int r = 0; r < n_rows; ++r) acc[i * kPanelRows + r] += col[r] * xv;
    }
  }
  for (int64_t i = 0; i < n_tok; ++i)
    for (int r = 0; r < n_rows; ++r) y[i * y_stride + r] = acc[i * kPanelRows + r];
}

// The current ISA's kernels of t, or null for a type outside the table.
const detail::TypeKernels* kernels_of(DType t) {
  const auto raw = static_cast<uint32_t>(t);
  return raw < detail::kKernelTableSize ? &detail::active_kernels().by_type[raw] : nullptr;
}

template <DType T>
void panel_scalar_of(const uint8_t* panel, int64_t n_in, const float* x, int64_t x_stride, int64_t n_tok,
                     float* y, int64_t y_stride, int n_rows) {
  panel_scalar(T, panel, n_in, x, x_stride, n_tok, y, y_stride, n_rows);
}

}  // namespace

bool packable(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q4_0:
    case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

size_t panel_bytes(DType t, int64_t n_in) {
  switch (t) {
    case DType::F32:
      return n_in * kPanelRows * 4;
    case DType::F16:
    case DType::BF16:
      return n_in * kPanelRows * 2;
    case DType::Q8_0:
      return n_in / kQ32 * kBytePanelBlock;
    case DType::Q4_K:
      return n_in / kQK * kQ4_KPanelBlock;
    case DType::Q4_0:
      return n_in / kQ32 * kQ4PanelSub;
    case DType::Q6_K:
      return n_in / kQK * kQ6_KPanelBlock;
    default:
      fail(ErrorKind::InvalidInput, "tensor type {} has no panel layout", dtype_info(t).name);
  }
}

void PackedMatrix::Unmap::operator()(uint8_t* p) const { munmap(p, size); }

PackedMatrix::PackedMatrix(const WeightMatrix& w) : type_(w.type), n_in_(w.n_in), n_out_(w.n_out) {
  if (!packable(w.type))
    fail(ErrorKind::InvalidInput, "tensor type {} has no panel layout", dtype_info(w.type).name);
  row_bytes(w.type, w.n_in);  // validates n_in against the block size
  panel_bytes_ = panel_bytes(w.type, w.n_in);
  const size_t size = std::max<size_t>(1, bytes());
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    fail(ErrorKind::LimitExceeded, "cannot allocate {} bytes for a {}x{} weight matrix", size, n_out_, n_in_);
  madvise(p, size, MADV_HUGEPAGE);  // advice only; 4 KiB pages work too
  data_ = std::unique_ptr<uint8_t, Unmap>(static_cast<uint8_t*>(p), Unmap{size});
  // Anonymous pages start zeroed, so the rows past n_out of the last panel
  // are zero weights.
  for (int64_t p0 = 0; p0 < n_panels(); ++p0) {
    const int64_t r0 = p0 * kPanelRows, rows = std::min(kPanelRows, n_out_ - r0);
    uint8_t* dst = data_.get() + p0 * panel_bytes_;
    switch (type_) {
      case DType::F32:
        pack_dense<uint32_t>(w, r0, rows, dst);
        break;
      case DType::F16:
      case DType::BF16:
        pack_dense<uint16_t>(w, r0, rows, dst);
        break;
      case DType::Q8_0:
        pack_q8_0(w, r0, rows, dst);
        break;
      case DType::Q4_0:
        pack_q4_0(w, r0, rows, dst);
        break;
      case DType::Q6_K:
        pack_q6_k(w, r0, rows, dst);
        break;
      default:
        pack_q4_k(w, r0, rows, dst);
        break;
    }
  }
}

float panel_value(DType t, const uint8_t* panel, int64_t r, int64_t k) {
  auto read_f32 = [](const uint8_t* p) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
  };
  auto read_u16 = [](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return h;
  };
  const size_t idx = static_cast<size_t>(k * kPanelRows + r);
  switch (t) {
    case DType::F32:
      return read_f32(panel + idx * 4);
    case DType::F16:
      return fp16_to_fp32(read_u16(panel + idx * 2));
    case DType::BF16:
      return bf16_to_fp32(read_u16(panel + (k * kPanelRows + bf16_slot(r)) * 2));
    case DType::Q8_0: {
      const uint8_t* blk = byte_block(false, panel, k / kQ32);
      const int u = blk[2 * kPanelRows + slot_byte(r, k % kQ32)];
      const float a = fp16_to_fp32(read_u16(blk + 2 * r));
      return a * static_cast<float>(u) - 128 * a;
    }
    case DType::Q6_K: {
      const uint8_t* blk = byte_block(true, panel, k / kQ32);
      const int64_t i = k % kQ32;
      const int u = blk[2 * kPanelRows + slot_byte(r, i)];
      const float d = fp16_to_fp32(read_u16(panel + (k / kQK) * kQ6_KPanelBlock + 2 * r));
      const float a = d * static_cast<float>(static_cast<int8_t>(blk[(i < 16 ? 0 : kPanelRows) + r]));
      return a * static_cast<float>(u) - 32 * a;
    }
    case DType::Q4_0:
    case DType::Q4_K: {
      const bool k_quants = t == DType::Q4_K;
      const uint8_t* sub = q4_sub_block(k_quants, panel, k / kQ32);
      const int64_t i = k % kQ32;
      const uint8_t byte = sub[2 * kPanelRows + slot_byte(r, q4k_slot(i))];
      const int q = (i % 8 < 4) ? (byte & 0xF) : (byte >> 4);
      float a, m;
      if (k_quants) {  // d * sc and dmin * mn: exact products, as the kernels compute them
        const uint8_t* head = panel + (k / kQK) * kQ4_KPanelBlock;
        a = fp16_to_fp32(read_u16(head + 2 * r)) * static_cast<float>(sub[r]);
        m = fp16_to_fp32(read_u16(head + 2 * (kPanelRows + r))) * static_cast<float>(sub[kPanelRows + r]);
      } else {
        a = fp16_to_fp32(read_u16(sub + 2 * r));
        m = 8 * a;
      }
      return a * static_cast<float>(q) - m;
    }
    default:
      fail(ErrorKind::InvalidInput, "tensor type {} has no panel layout", dtype_info(t).name);
  }
}

void panel_gemm(DType t, const uint8_t* panel, int64_t n_in, const float* x, int64_t x_stride, int64_t n_tok,
                float* y, int64_t y_stride, int n_rows) {
  const detail::TypeKernels* k = kernels_of(t);
  if (!k || !k->panel)
    fail(ErrorKind::InvalidInput, "tensor type {} has no panel layout", dtype_info(t).name);
  k->panel(panel, n_in, x, x_stride, n_tok, y, y_stride, n_rows);
}

void quantize_activations(const float* x, int64_t n_tok, int64_t n_in, int8_t* xq, float* xs) {
  if (n_in % kQ32 != 0)
    fail(ErrorKind::InvalidInput, "int8 activations need rows of whole 32-blocks, not {}", n_in);
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t b = 0; b < n_in / kQ32; ++b) {
      const float* src = x + t * n_in + b * kQ32;
      int8_t* q = xq + t * n_in + b * kQ32;
      float amax = 0;
      for (int64_t i = 0; i < kQ32; ++i) amax = std::max(amax, std::fabs(src[i]));
      const float d = amax / 127, id = d > 0 ? 1 / d : 0;
      int sum[2] = {0, 0};
      for (int64_t i = 0; i < kQ32; ++i) {
        q[i] = static_cast<int8_t>(std::nearbyint(src[i] * id));
        sum[i / 16] += q[i];
      }
      float* out = xs + (t * (n_in / kQ32) + b) * kActScales;
      out[0] = d;
      out[1] = d * static_cast<float>(sum[0] + sum[1]);
      out[2] = d * static_cast<float>(sum[0]);
      out[3] = d * static_cast<float>(sum[1]);
    }
}

bool has_int8_panels(DType t) {
  const detail::TypeKernels* k = kernels_of(t);
  return k && k->panel_i8;
}

void panel_gemm_i8(DType t, const uint8_t* panel, int64_t n_in, const int8_t* xq, const float* xs,
                   int64_t n_tok, float* y, int64_t y_stride, int n_rows) {
  if (!has_int8_panels(t))
    fail(ErrorKind::InvalidInput, "no int8 kernel for tensor type {} on {}", dtype_info(t).name,
         isa_name(current_isa()));
  kernels_of(t)->panel_i8(panel, n_in, xq, xs, n_tok, y, y_stride, n_rows);
}

int64_t bf16_row_length(int64_t n_in) { return n_in + (n_in & 1); }

void round_activations_bf16(const float* x, int64_t n_tok, int64_t n_in, uint16_t* xb) {
  const int64_t len = bf16_row_length(n_in);
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t k = 0; k < n_in; ++k) xb[t * len + k] = fp32_to_bf16(x[t * n_in + k]);
    if (len > n_in) xb[t * len + n_in] = 0;
  }
}

float bf16_product_operand(float v) {
  const float b = bf16_to_fp32(fp32_to_bf16(v));
  return std::fabs(b) < FLT_MIN ? 0.0f : b;
}

float panel_value_bf16(DType t, const uint8_t* panel, int64_t r, int64_t k) {
  return bf16_product_operand(panel_value(t, panel, r, k));
}

bool has_bf16_panels(DType t) {
  const detail::TypeKernels* k = kernels_of(t);
  return k && k->panel_bf16;
}

void panel_gemm_bf16(DType t, const uint8_t* panel, int64_t n_in, const uint16_t* xb, int64_t n_tok, float* y,
                     int64_t y_stride, int n_rows) {
  if (!has_bf16_panels(t))
    fail(ErrorKind::InvalidInput, "no bfloat16 kernel for tensor type {} on {}", dtype_info(t).name,
         isa_name(current_isa()));
  kernels_of(t)->panel_bf16(panel, n_in, xb, n_tok, y, y_stride, n_rows);
}

namespace detail {

void fill_scalar_panels(KernelSet& set) {
  set.by_type[static_cast<uint32_t>(DType::F32)].panel = panel_scalar_of<DType::F32>;
  set.by_type[static_cast<uint32_t>(DType::F16)].panel = panel_scalar_of<DType::F16>;
  set.by_type[static_cast<uint32_t>(DType::BF16)].panel = panel_scalar_of<DType::BF16>;
  set.by_type[static_cast<uint32_t>(DType::Q8_0)].panel = panel_scalar_of<DType::Q8_0>;
  set.by_type[static_cast<uint32_t>(DType::Q4_K)].panel = panel_scalar_of<DType::Q4_K>;
  set.by_type[static_cast<uint32_t>(DType::Q4_0)].panel = panel_scalar_of<DType::Q4_0>;
  set.by_type[static_cast<uint32_t>(DType::Q6_K)].panel = panel_scalar_of<DType::Q6_K>;
}

}  // namespace detail
}  // namespace depcache

#include "compute/dot.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "compute/fp16.h"
#include "compute/quant.h"
#include "util/error.h"

namespace depcache {
namespace detail {
namespace {

// ---- Portable dot kernels. Eight partial sums: independent chains the
// compiler can keep in one vector register, and a shorter summation chain.

struct Acc8 {
  float a[8] = {};
  // Adds w[i] * x[i] for i < len.
  template <class Load>
  void add(Load w, const float* x, int64_t len) {
    int64_t i = 0;
    for (; i + 8 <= len; i += 8)
      for (int k = 0; k < 8; ++k) a[k] += w(i + k) * x[i + k];
    for (; i < len; ++i) a[i & 7] += w(i) * x[i];
  }
  float sum() const { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }
};

float dot_f32(const void* w, const float* x, int64_t n) {
  const auto* p = static_cast<const float*>(w);
  Acc8 acc;
  acc.add([p](int64_t i) { return p[i]; }, x, n);
  return acc.sum();
}

float dot_f16(const void* w, const float* x, int64_t n) {
  const auto* p = static_cast<const uint16_t*>(w);
  Acc8 acc;
  acc.add([p](int64_t i) { return fp16_to_fp32(p[i]); }, x, n);
  return acc.sum();
}

float dot_bf16(const void* w, const float* x, int64_t n) {
  const auto* p = static_cast<const uint16_t*>(w);
  Acc8 acc;
  acc.add([p](int64_t i) { return bf16_to_fp32(p[i]); }, x, n);
  return acc.sum();
}

// Quantized types: dequantize 256 elements at a time (one K super-block or
// eight simple blocks) with the portable dequantizer, then dot.
template <DType T>
float dot_quant(const void* w, const float* x, int64_t n) {
  static const DequantFn deq = [] {
    KernelSet s;
    fill_scalar_dequant(s);
    return s.by_type[static_cast<uint32_t>(T)].dequant;
  }();
  const DTypeInfo& info = dtype_info(T);
  const auto* src = static_cast<const uint8_t*>(w);
  float tmp[256];
  Acc8 acc;
  for (int64_t i = 0; i < n; i += 256) {
    const int64_t len = std::min<int64_t>(256, n - i);
    deq(src + (i / info.block_size) * info.block_bytes, tmp, len);
    acc.add([&tmp](int64_t j) { return tmp[j]; }, x + i, len);
  }
  return acc.sum();
}

struct IsaKernels {
  Isa isa;
  KernelSet set;
};

const IsaKernels& scalar_set() {
  static const IsaKernels k = [] {
    IsaKernels s{Isa::Scalar, {}};
    fill_scalar_dequant(s.set);
    fill_scalar_panels(s.set);
    auto put = [&](DType t, DotFn f) { s.set.by_type[static_cast<uint32_t>(t)].dot = f; };
    put(DType::F32, dot_f32);
    put(DType::F16, dot_f16);
    put(DType::BF16, dot_bf16);
    put(DType::Q8_0, dot_quant<DType::Q8_0>);
    put(DType::Q4_0, dot_quant<DType::Q4_0>);
    put(DType::Q4_K, dot_quant<DType::Q4_K>);
    put(DType::Q6_K, dot_quant<DType::Q6_K>);
    return s;
  }();
  return k;
}

const IsaKernels& avx2_set() {
  static const IsaKernels k = [] {
    IsaKernels s{Isa::Avx2, scalar_set().set};
    fill_avx2_kernels(s.set);
    fill_avx2_panels(s.set);
    return s;
  }();
  return k;
}

const IsaKernels& avx512_set() {
  static const IsaKernels k = [] {
    IsaKernels s{Isa::Avx512, avx2_set().set};
    fill_avx512_kernels(s.set);
    fill_avx512_panels(s.set);
    return s;
  }();
  return k;
}

const IsaKernels& set_of(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return avx512_set();
    case Isa::Avx2:
      return avx2_set();
    default:
      return scalar_set();
  }
}

#if defined(__x86_64__) || defined(__i386__)
// Read from CPUID (leaf 1, ECX bit 29): clang's __builtin_cpu_supports does
// not know "f16c".
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
#endif

Isa detect_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  // The AVX-512 set falls back to AVX2 kernels, so it needs both.
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return Isa::Avx512;
  if (avx2) return Isa::Avx2;
#endif
  return Isa::Scalar;
}

// One pointer swap selects a whole set, so a kernel call costs one load and
// one indirect call, never a branch per element.
std::atomic<const IsaKernels*> g_active{nullptr};

// The first use honours DEPCACHE_ISA; a bad value only warns, since failing
// inside the first matmul would be worse than running a slower path.
const IsaKernels& pick_initial_set() {
  Isa isa = best_isa();
  if (const char* env = std::getenv("DEPCACHE_ISA"); env && *env) {
    const std::optional<Isa> want = isa_from_name(env);
    if (!want)
      fmt::print(stderr, "depcache: DEPCACHE_ISA={} is not scalar|avx2|avx512; using {}\n", env,
                 isa_name(isa));
    else if (!isa_supported(*want))
      fmt::print(stderr, "depcache: DEPCACHE_ISA={} is not supported by this CPU; using {}\n", env,
                 isa_name(isa));
    else
      isa = *want;
  }
  return set_of(isa);
}

const IsaKernels& active() {
  const IsaKernels* p = g_active.load(std::memory_order_acquire);
  if (p) return *p;
  static const IsaKernels* const init = &pick_initial_set();
  // Keep a set_isa() that raced ahead of the first use.
  if (g_active.compare_exchange_strong(p, init, std::memory_order_acq_rel)) return *init;
  return *p;
}

}  // namespace

const KernelSet& active_kernels() { return active().set; }

const TypeKernels& kernels_for(DType t, int64_t n) {
  const auto raw = static_cast<uint32_t>(t);
  const TypeKernels* k = raw < kKernelTableSize ? &active().set.by_type[raw] : nullptr;
  if (!k || !k->dot || !k->dequant) {
    const auto info = dtype_info(raw);
    fail(ErrorKind::InvalidInput, "no compute kernels for tensor type {}",
         info ? std::string(info->name) : std::to_string(raw));
  }
  const DTypeInfo& info = dtype_info(t);
  if (n < 0 || n % info.block_size != 0)
    fail(ErrorKind::InvalidInput, "row of {} elements is not a multiple of the {} block size {}", n,
         info.name, info.block_size);
  return *k;
}

}  // namespace detail

Isa best_isa() {
  static const Isa isa = detail::detect_isa();
  return isa;
}

bool isa_supported(Isa isa) { return static_cast<int>(isa) <= static_cast<int>(best_isa()); }

void set_isa(Isa isa) {
  if (!isa_supported(isa))
    fail(ErrorKind::InvalidInput, "this CPU does not support the {} kernels (best: {})", isa_name(isa),
         isa_name(best_isa()));
  detail::g_active.store(&detail::set_of(isa), std::memory_order_release);
}

Isa current_isa() { return detail::active().isa; }

namespace {

// An on/off mode read from the environment ("1") at its first use unless
// set before: -1 until then.
class MatmulMode {
 public:
  explicit MatmulMode(const char* env) : env_(env) {}
  void set(bool on) { v_.store(on ? 1 : 0, std::memory_order_relaxed); }
  bool get() {
    int v = v_.load(std::memory_order_relaxed);
    if (v < 0) {
      const char* env = std::getenv(env_);
      v = env && std::string_view(env) == "1" ? 1 : 0;
      int expected = -1;
      if (!v_.compare_exchange_strong(expected, v)) v = expected;
    }
    return v == 1;
  }

 private:
  const char* env_;
  std::atomic<int> v_{-1};
};

MatmulMode g_int8("DEPCACHE_INT8_ACTIVATIONS");
MatmulMode g_bf16("DEPCACHE_BF16_PRODUCTS");

}  // namespace

void set_int8_activations(bool on) { g_int8.set(on); }
bool int8_activations() { return g_int8.get(); }
void set_bf16_products(bool on) { g_bf16.set(on); }
bool bf16_products() { return g_bf16.get(); }

std::string matmul_mode_tag() {
  std::string tag = int8_activations() ? "int8-activations" : "";
  if (bf16_products()) tag += tag.empty() ? "bf16-products" : "+bf16-products";
  return tag;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx2:
      return "avx2";
    default:
      return "scalar";
  }
}

std::optional<Isa> isa_from_name(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (lower == isa_name(isa)) return isa;
  return std::nullopt;
}

float dot_row(DType t, const void* w_row, const float* x, int64_t n) {
  return detail::kernels_for(t, n).dot(w_row, x, n);
}

void dequantize_rows(DType t, const void* src, size_t row_stride_bytes, int64_t n_rows, int64_t n,
                     float* dst) {
  const detail::TypeKernels& k = detail::kernels_for(t, n);
  if (n_rows < 0) fail(ErrorKind::InvalidInput, "negative row count {}", n_rows);
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t r = 0; r < n_rows; ++r) k.dequant(p + r * row_stride_bytes, dst + r * n, n);
}

}  // namespace depcache

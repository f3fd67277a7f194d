#pragma once
// GGUF model files: a reader (versions 1-3, memory-mapped, every offset checked)
// and a writer (version 3). The metadata value type is shared by both.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "compute/dtype.h"

namespace depcache {

// "GGUF", read as a little-endian u32: the first bytes of every GGUF file.
inline constexpr uint32_t kGgufMagic = 0x46554747;

enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata value. Integers keep their signedness; arrays carry their element type.
struct GgufValue {
  GgufType type = GgufType::U32;
  GgufType elem_type = GgufType::U32;  // for arrays
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> data;

  static GgufValue u32(uint32_t v) { return {GgufType::U32, GgufType::U32, uint64_t{v}}; }
  static GgufValue i32(int32_t v) { return {GgufType::I32, GgufType::U32, int64_t{v}}; }
  static GgufValue u64(uint64_t v) { return {GgufType::U64, GgufType::U32, v}; }
  static GgufValue f32(float v) { return {GgufType::F32, GgufType::U32, double{v}}; }
  static GgufValue boolean(bool v) { return {GgufType::Bool, GgufType::U32, v}; }
  static GgufValue string(std::string v) { return {GgufType::String, GgufType::U32, std::move(v)}; }
  static GgufValue array(GgufType elem, std::vector<GgufValue> items) {
    return {GgufType::Array, elem, std::move(items)};
  }

  bool is_integer() const;
  bool is_number() const { return is_integer() || type == GgufType::F32 || type == GgufType::F64; }
  // Typed access; throw depcache::Error naming `what` when the type does not fit.
  int64_t as_int(std::string_view what) const;
  double as_float(std::string_view what) const;
  bool as_bool(std::string_view what) const;
  const std::string& as_string(std::string_view what) const;
  const std::vector<GgufValue>& as_array(std::string_view what) const;
};

struct GgufTensor {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> dims;  // dims[0] is the innermost (row length)
  uint64_t offset = 0;        // from the start of the data section
  const uint8_t* data = nullptr;
  size_t n_bytes = 0;

  int64_t n_elements() const;
  int64_t n_rows() const { return dims.empty() ? 0 : n_elements() / dims[0]; }
};

class GgufFile {
 public:
  // Memory-maps and parses `path`. Throws depcache::Error with the byte offset
  // and field on any truncation, overflow or inconsistency.
  static GgufFile open(const std::filesystem::path& path);
  // Parses bytes the caller keeps alive (used by tests and the fuzzer).
  static GgufFile parse(std::span<const uint8_t> bytes, std::string source_name = "<memory>");

  uint32_t version() const { return version_; }
  size_t alignment() const { return alignment_; }
  const std::string& source() const { return source_; }
  size_t file_size() const { return bytes_.size(); }

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  const GgufValue& get(std::string_view key) const;  // throws NotFound
  int64_t get_int(std::string_view key) const { return get(key).as_int(key); }
  std::optional<int64_t> get_int_or(std::string_view key) const;
  std::optional<double> get_float_or(std::string_view key) const;
  std::optional<std::string> get_string_or(std::string_view key) const;
  std::string get_string(std::string_view key) const { return get(key).as_string(key); }

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;

 private:
  std::shared_ptr<const void> mapping_;  // keeps the mmap alive across copies
  std::span<const uint8_t> bytes_;
  std::string source_;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensor> tensors_;
};

// Writes GGUF version 3. Tensor bytes are produced one tensor at a time by a
// callback, so models larger than memory can be written.
class GgufWriter {
 public:
  using Fill = std::function<void(uint8_t* dst, size_t n_bytes)>;

  void set(std::string key, GgufValue value);  // replaces an existing key
  void add_tensor(std::string name, DType type, std::vector<int64_t> dims, Fill fill);
  void write(const std::filesystem::path& path) const;

 private:
  struct PendingTensor {
    std::string name;
    DType type;
    std::vector<int64_t> dims;
    Fill fill;
  };
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<PendingTensor> tensors_;
  size_t alignment_ = 32;
};

}  // namespace depcache

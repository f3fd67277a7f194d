#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <unordered_set>

#include "model/gguf.h"
#include "util/error.h"

namespace depcache {
namespace {

constexpr int kMaxDims = 4;
constexpr int kMaxArrayDepth = 4;
constexpr uint64_t kMaxStringLength = uint64_t{1} << 30;

// Reads little-endian fields with a bounds check before every access.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& source) : bytes_(bytes), source_(source) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  [[noreturn]] void corrupt(std::string_view field, std::string_view why) const {
    fail(ErrorKind::InvalidInput, "{}: corrupt GGUF at byte {} ({}): {}", source_, pos_, field, why);
  }

  void need(size_t n, std::string_view field) const {
    if (n > remaining())
      fail(ErrorKind::InvalidInput, "{}: truncated GGUF at byte {} reading {}: need {} bytes, {} left",
           source_, pos_, field, n, remaining());
  }

  template <typename T>
  T read(std::string_view field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // Counts and lengths are 32-bit in version 1 and 64-bit afterwards.
  uint64_t read_size(uint32_t version, std::string_view field) {
    return version == 1 ? read<uint32_t>(field) : read<uint64_t>(field);
  }

  std::string read_string(uint32_t version, std::string_view field) {
    const uint64_t len = read_size(version, field);
    if (len > kMaxStringLength) corrupt(field, fmt::format("string length {} is implausible", len));
    need(len, field);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& source_;
  size_t pos_ = 0;
};

// Smallest encoded size of a value of type t, to bound counts before allocating.
size_t min_encoded_size(GgufType t, uint32_t version) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::Bool:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    case GgufType::String:
      return version == 1 ? 4 : 8;
    case GgufType::Array:
      return 4 + (version == 1 ? 4 : 8);
  }
  return 1;
}

bool valid_value_type(uint32_t raw) { return raw <= static_cast<uint32_t>(GgufType::F64); }

GgufValue read_value(Cursor& c, uint32_t version, GgufType type, const std::string& key, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::U8:
      v.data = uint64_t{c.read<uint8_t>(key)};
      break;
    case GgufType::I8:
      v.data = int64_t{c.read<int8_t>(key)};
      break;
    case GgufType::U16:
      v.data = uint64_t{c.read<uint16_t>(key)};
      break;
    case GgufType::I16:
      v.data = int64_t{c.read<int16_t>(key)};
      break;
    case GgufType::U32:
      v.data = uint64_t{c.read<uint32_t>(key)};
      break;
    case GgufType::I32:
      v.data = int64_t{c.read<int32_t>(key)};
      break;
    case GgufType::U64:
      v.data = c.read<uint64_t>(key);
      break;
    case GgufType::I64:
      v.data = c.read<int64_t>(key);
      break;
    case GgufType::F32:
      v.data = double{c.read<float>(key)};
      break;
    case GgufType::F64:
      v.data = c.read<double>(key);
      break;
    case GgufType::Bool: {
      const uint8_t b = c.read<uint8_t>(key);
      if (b > 1) c.corrupt(key, fmt::format("bool value {} is neither 0 nor 1", b));
      v.data = b != 0;
      break;
    }
    case GgufType::String:
      v.data = c.read_string(version, key);
      break;
    case GgufType::Array: {
      if (depth >= kMaxArrayDepth) c.corrupt(key, "arrays nested too deeply");
      const uint32_t raw_elem = c.read<uint32_t>(key);
      if (!valid_value_type(raw_elem)) c.corrupt(key, fmt::format("unknown array element type {}", raw_elem));
      v.elem_type = static_cast<GgufType>(raw_elem);
      const uint64_t n = c.read_size(version, key);
      if (n > c.remaining() / min_encoded_size(v.elem_type, version))
        c.corrupt(key, fmt::format("array of {} elements cannot fit in the {} bytes left", n, c.remaining()));
      std::vector<GgufValue> items;
      items.reserve(n);
      for (uint64_t i = 0; i < n; ++i) items.push_back(read_value(c, version, v.elem_type, key, depth + 1));
      v.data = std::move(items);
      break;
    }
  }
  return v;
}

// The metadata section: n_kv entries, each key once.
void read_metadata(Cursor& c, uint32_t version, uint64_t n_kv,
                   std::vector<std::pair<std::string, GgufValue>>& out) {
  std::unordered_set<std::string> keys;
  out.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string(version, "metadata key");
    if (!keys.insert(key).second) c.corrupt(key, "duplicate metadata key");
    const uint32_t raw_type = c.read<uint32_t>(key);
    if (!valid_value_type(raw_type)) c.corrupt(key, fmt::format("unknown value type {}", raw_type));
    GgufValue v = read_value(c, version, static_cast<GgufType>(raw_type), key, 0);
    out.emplace_back(std::move(key), std::move(v));
  }
}

// A tensor's dimensions into t.dims; returns their product.
int64_t read_dims(Cursor& c, uint32_t version, GgufTensor& t) {
  const uint32_t n_dims = c.read<uint32_t>(t.name);
  if (n_dims == 0 || n_dims > kMaxDims)
    c.corrupt(t.name, fmt::format("{} dimensions (1 to {} allowed)", n_dims, kMaxDims));
  int64_t n_elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t dim = c.read_size(version, t.name);
    if (dim == 0 || dim > (uint64_t{1} << 40))
      c.corrupt(t.name, fmt::format("dimension {} has size {}", d, dim));
    if (n_elements > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(dim))
      c.corrupt(t.name, "element count overflows");
    n_elements *= static_cast<int64_t>(dim);
    t.dims.push_back(static_cast<int64_t>(dim));
  }
  return n_elements;
}

// One tensor's header entry: name (not in `names` yet), dimensions, type and
// data offset.
GgufTensor read_tensor_info(Cursor& c, uint32_t version, size_t alignment,
                            std::unordered_set<std::string>& names) {
  GgufTensor t;
  t.name = c.read_string(version, "tensor name");
  if (!names.insert(t.name).second) c.corrupt(t.name, "duplicate tensor name");
  const int64_t n_elements = read_dims(c, version, t);
  const uint32_t raw_type = c.read<uint32_t>(t.name);
  const auto info = dtype_info(raw_type);
  if (!info) c.corrupt(t.name, fmt::format("unknown tensor type {}", raw_type));
  t.type = static_cast<DType>(raw_type);
  if (t.dims[0] % info->block_size != 0)
    c.corrupt(t.name, fmt::format("row length {} is not a multiple of the {} block size {}", t.dims[0],
                                  info->name, info->block_size));
  t.n_bytes = static_cast<size_t>(n_elements / info->block_size) * info->block_bytes;
  t.offset = c.read<uint64_t>(t.name);
  if (t.offset % alignment != 0)
    c.corrupt(t.name, fmt::format("data offset {} is not aligned to {}", t.offset, alignment));
  return t;
}

// The tensor infos section: n_tensors entries, each name once.
void read_tensor_infos(Cursor& c, uint32_t version, uint64_t n_tensors, size_t alignment,
                       std::vector<GgufTensor>& out) {
  const size_t min_tensor_info = min_encoded_size(GgufType::String, version) + 4 + 4 + 8;
  if (n_tensors > c.remaining() / min_tensor_info)
    c.corrupt("tensor count", fmt::format("{} tensors cannot fit in the file", n_tensors));
  std::unordered_set<std::string> names;
  out.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) out.push_back(read_tensor_info(c, version, alignment, names));
}

// Points each tensor at its bytes. The data section starts at the next
// alignment boundary after the header, which ends at header_end.
void place_tensor_data(std::span<const uint8_t> bytes, size_t header_end, size_t alignment,
                       const std::string& source, std::vector<GgufTensor>& tensors) {
  const size_t data_start = (header_end + alignment - 1) / alignment * alignment;
  if (!tensors.empty() && data_start > bytes.size())
    fail(ErrorKind::InvalidInput, "{}: truncated GGUF: data section would start at byte {} of {}", source,
         data_start, bytes.size());
  for (GgufTensor& t : tensors) {
    const size_t avail = bytes.size() - data_start;
    if (t.offset > avail || t.n_bytes > avail - t.offset)
      fail(ErrorKind::InvalidInput,
           "{}: truncated GGUF: tensor '{}' needs bytes {}..{} of the data section but it has {}", source,
           t.name, t.offset, t.offset + t.n_bytes, avail);
    t.data = bytes.data() + data_start + t.offset;
  }
}

struct Unmapper {
  size_t size;
  void operator()(const void* p) const { munmap(const_cast<void*>(p), size); }
};

}  // namespace

GgufFile GgufFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::NotFound, "cannot open model file {}: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(ErrorKind::InvalidInput, "{} is not a regular file", path.string());
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    fail(ErrorKind::InvalidInput, "{}: empty file, not a GGUF model", path.string());
  }
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) fail(ErrorKind::Internal, "cannot map {}: {}", path.string(), std::strerror(errno));
  std::shared_ptr<const void> mapping(p, Unmapper{size});
  GgufFile f = parse({static_cast<const uint8_t*>(p), size}, path.string());
  f.mapping_ = std::move(mapping);
  return f;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string source_name) {
  GgufFile f;
  f.source_ = std::move(source_name);
  f.bytes_ = bytes;
  Cursor c(bytes, f.source_);

  if (c.read<uint32_t>("magic") != kGgufMagic)
    c.corrupt("magic", "not a GGUF file (magic bytes are not 'GGUF')");
  f.version_ = c.read<uint32_t>("version");
  if (f.version_ < 1 || f.version_ > 3)
    fail(ErrorKind::InvalidInput, "{}: GGUF version {} is not supported (1, 2 and 3 are)", f.source_,
         f.version_);
  const uint64_t n_tensors = c.read_size(f.version_, "tensor count");
  const uint64_t n_kv = c.read_size(f.version_, "metadata count");
  // Each key-value pair needs at least a key length and a type tag.
  if (n_kv > c.remaining() / (min_encoded_size(GgufType::String, f.version_) + 4))
    c.corrupt("metadata count", fmt::format("{} entries cannot fit in the file", n_kv));
  read_metadata(c, f.version_, n_kv, f.metadata_);

  if (const GgufValue* a = f.find("general.alignment")) {
    const int64_t align = a->as_int("general.alignment");
    if (align <= 0 || (align & (align - 1)) != 0 || align > (1 << 20))
      fail(ErrorKind::InvalidInput, "{}: general.alignment {} is not a power of two", f.source_, align);
    f.alignment_ = static_cast<size_t>(align);
  }

  read_tensor_infos(c, f.version_, n_tensors, f.alignment_, f.tensors_);
  place_tensor_data(bytes, c.pos(), f.alignment_, f.source_, f.tensors_);
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const auto& [k, v] : metadata_)
    if (k == key) return &v;
  return nullptr;
}

const GgufValue& GgufFile::get(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) fail(ErrorKind::NotFound, "{}: metadata key '{}' is missing", source_, key);
  return *v;
}

std::optional<int64_t> GgufFile::get_int_or(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? std::optional<int64_t>(v->as_int(key)) : std::nullopt;
}

std::optional<double> GgufFile::get_float_or(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? std::optional<double>(v->as_float(key)) : std::nullopt;
}

std::optional<std::string> GgufFile::get_string_or(std::string_view key) const {
  const GgufValue* v = find(key);
  return v ? std::optional<std::string>(v->as_string(key)) : std::nullopt;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  for (const GgufTensor& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

int64_t GgufTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

}  // namespace depcache

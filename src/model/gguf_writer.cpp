#include <cstring>
#include <fstream>

#include "model/gguf.h"
#include "util/error.h"

namespace depcache {
namespace {

constexpr uint32_t kVersion = 3;

class Out {
 public:
  explicit Out(std::ofstream& os) : os_(os) {}
  template <typename T>
  void put(T v) {
    os_.write(reinterpret_cast<const char*>(&v), sizeof(T));
    pos_ += sizeof(T);
  }
  void put_bytes(const void* p, size_t n) {
    os_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    pos_ += n;
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    put_bytes(s.data(), s.size());
  }
  void pad_to(size_t alignment) {
    static const char zeros[64] = {};
    while (pos_ % alignment != 0) put_bytes(zeros, std::min<size_t>(64, alignment - pos_ % alignment));
  }
  size_t pos() const { return pos_; }

 private:
  std::ofstream& os_;
  size_t pos_ = 0;
};

void put_value(Out& o, const GgufValue& v) {
  switch (v.type) {
    case GgufType::U8:
      o.put<uint8_t>(static_cast<uint8_t>(std::get<uint64_t>(v.data)));
      break;
    case GgufType::I8:
      o.put<int8_t>(static_cast<int8_t>(std::get<int64_t>(v.data)));
      break;
    case GgufType::U16:
      o.put<uint16_t>(static_cast<uint16_t>(std::get<uint64_t>(v.data)));
      break;
    case GgufType::I16:
      o.put<int16_t>(static_cast<int16_t>(std::get<int64_t>(v.data)));
      break;
    case GgufType::U32:
      o.put<uint32_t>(static_cast<uint32_t>(std::get<uint64_t>(v.data)));
      break;
    case GgufType::I32:
      o.put<int32_t>(static_cast<int32_t>(std::get<int64_t>(v.data)));
      break;
    case GgufType::U64:
      o.put<uint64_t>(std::get<uint64_t>(v.data));
      break;
    case GgufType::I64:
      o.put<int64_t>(std::get<int64_t>(v.data));
      break;
    case GgufType::F32:
      o.put<float>(static_cast<float>(std::get<double>(v.data)));
      break;
    case GgufType::F64:
      o.put<double>(std::get<double>(v.data));
      break;
    case GgufType::Bool:
      o.put<uint8_t>(std::get<bool>(v.data) ? 1 : 0);
      break;
    case GgufType::String:
      o.put_string(std::get<std::string>(v.data));
      break;
    case GgufType::Array: {
      const auto& items = std::get<std::vector<GgufValue>>(v.data);
      o.put<uint32_t>(static_cast<uint32_t>(v.elem_type));
      o.put<uint64_t>(items.size());
      for (const GgufValue& item : items) put_value(o, item);
      break;
    }
  }
}

}  // namespace

void GgufWriter::set(std::string key, GgufValue value) {
  if (key == "general.alignment") alignment_ = static_cast<size_t>(value.as_int(key));
  for (auto& [k, v] : metadata_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  metadata_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> dims, Fill fill) {
  if (dims.empty() || dims.size() > 4) fail(ErrorKind::InvalidInput, "tensor {}: 1 to 4 dimensions", name);
  row_bytes(type, dims[0]);  // validates the row length against the block size
  tensors_.push_back({std::move(name), type, std::move(dims), std::move(fill)});
}

void GgufWriter::write(const std::filesystem::path& path) const {
  // Write to a temporary name and rename, so a failed write never leaves a
  // truncated model under the final name.
  const std::filesystem::path tmp = path.string() + ".partial";
  std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
  if (!os) fail(ErrorKind::InvalidInput, "cannot create {}", tmp.string());
  Out o(os);
  o.put<uint32_t>(kGgufMagic);
  o.put<uint32_t>(kVersion);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(metadata_.size());
  for (const auto& [k, v] : metadata_) {
    o.put_string(k);
    o.put<uint32_t>(static_cast<uint32_t>(v.type));
    put_value(o, v);
  }
  std::vector<size_t> sizes;
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    int64_t rows = 1;
    for (size_t d = 1; d < t.dims.size(); ++d) rows *= t.dims[d];
    const size_t n_bytes = row_bytes(t.type, t.dims[0]) * static_cast<size_t>(rows);
    sizes.push_back(n_bytes);
    o.put_string(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) o.put<uint64_t>(static_cast<uint64_t>(d));
    o.put<uint32_t>(static_cast<uint32_t>(t.type));
    o.put<uint64_t>(offset);
    offset += (n_bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  o.pad_to(alignment_);
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    buf.assign(sizes[i], 0);
    tensors_[i].fill(buf.data(), buf.size());
    o.put_bytes(buf.data(), buf.size());
    o.pad_to(alignment_);
  }
  os.close();
  if (!os) fail(ErrorKind::Internal, "writing {} failed (disk full?)", tmp.string());
  std::filesystem::rename(tmp, path);
}

}  // namespace depcache

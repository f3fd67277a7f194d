#pragma once
// A fixed-size array of zeroed trivially copyable values from calloc. Large
// arrays come as fresh zero pages, not written ones, and a failed allocation
// is an empty result the caller turns into an error: a throwing operator new
// aborts the process under AddressSanitizer instead of throwing.
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <optional>
#include <type_traits>

namespace depcache {

template <class T>
class ZeroedArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  ZeroedArray() = default;
  ZeroedArray(ZeroedArray&& o) noexcept : data_(std::move(o.data_)), size_(o.size_) { o.size_ = 0; }
  ZeroedArray& operator=(ZeroedArray&& o) noexcept {
    data_ = std::move(o.data_);
    size_ = o.size_;
    o.size_ = 0;
    return *this;
  }
  // nullopt when the memory cannot be had.
  static std::optional<ZeroedArray> allocate(size_t n) {
    ZeroedArray a;
    if (n == 0) return a;
    a.data_.reset(static_cast<T*>(std::calloc(n, sizeof(T))));
    if (!a.data_) return std::nullopt;
    a.size_ = n;
    return a;
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data(); }
  const T* begin() const { return data(); }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], Free> data_;
  size_t size_ = 0;
};

}  // namespace depcache

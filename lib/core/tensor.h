// Tensor: a row-major array with a shape, an element type and a device, either owning its
// (64-byte aligned, zero-filled) storage or viewing someone else's, e.g. one parameter inside a
// flat buffer laid out by model/layout.h. Tested in tests/unit/core/test_tensor.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"

namespace mt {

enum class Device { cpu, cuda };

class Tensor {
 public:
  Tensor() = default;
  // Owning, zero-filled; bytes are reported to `counter` when given.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype, ByteCounter* counter = nullptr);
  // A view of `data` (not owned); the caller keeps it alive.
  static Tensor view(void* data, std::vector<int64_t> shape, DType dtype, Device device = Device::cpu);

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t numel() const;
  int64_t bytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype_)); }
  bool owns_storage() const { return static_cast<bool>(storage_); }
  void* raw() const { return data_; }
  // Typed access; throws mt::Error when T does not match the dtype.
  template <typename T>
  T* data() const {
    check_type(sizeof(T), type_tag<T>());
    return static_cast<T*>(data_);
  }
  // Rows [begin, end) along dimension 0, as a view sharing this tensor's storage.
  Tensor rows(int64_t begin, int64_t end) const;
  std::string describe() const;  // e.g. "float32[128, 64]"

 private:
  template <typename T>
  static int type_tag();
  void check_type(size_t element_size, int tag) const;

  void* data_ = nullptr;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
  std::shared_ptr<Buffer<unsigned char>> storage_;
};

template <> inline int Tensor::type_tag<float>() { return static_cast<int>(DType::f32); }
template <> inline int Tensor::type_tag<double>() { return static_cast<int>(DType::f64); }
template <> inline int Tensor::type_tag<uint8_t>() { return static_cast<int>(DType::u8); }
template <> inline int Tensor::type_tag<int8_t>() { return static_cast<int>(DType::i8); }
template <> inline int Tensor::type_tag<int16_t>() { return static_cast<int>(DType::i16); }
template <> inline int Tensor::type_tag<int32_t>() { return static_cast<int>(DType::i32); }
template <> inline int Tensor::type_tag<int64_t>() { return static_cast<int>(DType::i64); }
template <> inline int Tensor::type_tag<uint16_t>() { return -1; }  // the bits of any 2-byte dtype

}  // namespace mt

// Tensor (see tensor.h).
#include "core/tensor.h"

#include "core/error.h"

namespace mt {

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, ByteCounter* counter) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  for (int64_t extent : t.shape_) {
    if (extent < 0) throw Error("tensor shape", "negative extent");
  }
  t.storage_ = std::make_shared<Buffer<unsigned char>>(t.bytes(), counter);
  t.data_ = t.storage_->data();
  return t;
}

Tensor Tensor::view(void* data, std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t extent : shape_) n *= extent;
  return n;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  if (shape_.empty() || begin < 0 || end < begin || end > shape_[0]) {
    throw Error("rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + describe(), "out of range");
  }
  Tensor t = *this;
  const int64_t row_bytes = shape_[0] > 0 ? bytes() / shape_[0] : 0;
  t.data_ = static_cast<unsigned char*>(data_) + begin * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

std::string Tensor::describe() const {
  std::string text = std::string(dtype_name(dtype_)) + "[";
  for (size_t i = 0; i < shape_.size(); ++i) text += (i ? ", " : "") + std::to_string(shape_[i]);
  return text + "]";
}

void Tensor::check_type(size_t element_size, int tag) const {
  const bool sixteen_bit = tag == -1 && dtype_size(dtype_) == 2;
  if (element_size != dtype_size(dtype_) || (!sixteen_bit && tag != static_cast<int>(dtype_))) {
    throw Error("tensor " + describe(), "accessed with another element type");
  }
}

}  // namespace mt

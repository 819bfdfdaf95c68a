// Hugging Face safetensors files, read and written by mt itself (Debian packages no C++ library
// for them). The format (github.com/huggingface/safetensors, "Format"): an unsigned little-endian
// 64-bit header size N; N bytes of UTF-8 JSON mapping each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end)} (offsets into the byte buffer that follows the header, which the
// tensors fill back to back without holes), plus an optional "__metadata__" map of strings; the
// header may be padded with spaces; then the byte buffer, every value little-endian, row-major.
// mt writes F32, BF16 and F16 and reads those three (widened to fp32 exactly); anything else is
// refused naming the tensor. The writer pads the header with spaces to a multiple of 8 bytes (so
// every tensor is 8-byte aligned) and writes under a temporary name, fsynced and renamed.
// Tested in tests/unit/io/test_safetensors.cpp and, against an independent reader that follows
// the specification, tests/tools/safetensors_reader.py (tests/tools/mt-ckpt.bats).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mt::io {

// "F32", "BF16", "F16": safetensors' names of mt's floating-point dtypes (throws for others).
const char* safetensors_dtype_name(DType dtype);

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // data_offsets: bytes into the buffer after the header
  int64_t elements() const;
};

// Writes `path` from tensors given as fp32 values, each stored as its `dtype` (rounded to nearest
// even for BF16/F16, as kernels/common/half.h rounds).
class SafetensorsWriter {
 public:
  void add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<float> values);
  // Writes the file (temporary name, fsync, rename) with `metadata` as "__metadata__"; returns its bytes.
  int64_t write(const std::string& path, const std::map<std::string, std::string>& metadata) const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<float> values;
  };
  std::vector<Pending> tensors_;
};

class SafetensorsReader {
 public:
  // What the constructor does with bytes of the buffer that no tensor covers (a hole): refuse
  // them, or keep the problem in hole() for a caller that first names the tensors it misses (a
  // tensor deleted from the header leaves a hole; issue 28 U16).
  enum class Holes { refuse, keep };
  // Reads and checks the header (size, JSON, dtypes, shapes against byte ranges, the ranges
  // covering the buffer back to back without overlaps or holes, the file's size). Throws
  // mt::Error naming the file and what is wrong.
  explicit SafetensorsReader(std::string path, Holes holes = Holes::refuse);
  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in offset order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // The tensor's values widened to fp32. Throws mt::Error naming it when absent.
  std::vector<float> read(const std::string& name) const;
  // With Holes::keep: the first hole, as the error Holes::refuse throws ("" when none).
  const std::string& hole() const { return hole_; }

 private:
  std::string path_;
  int64_t buffer_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::string hole_;
};

}  // namespace mt::io

// safetensors writer and reader (see safetensors.h).
#include "io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/temporary_file.h"
#include "kernels/common/half.h"

namespace mt::io {
namespace {

// A header array of integers (shape, data_offsets) as int64: a float, a negative number where
// none belongs or a value past int64 is refused here, before any conversion (nlohmann's get
// would convert a float out of range, which is undefined behaviour).
std::vector<int64_t> header_integers(const nlohmann::json& array, const std::string& what, const char* field) {
  if (!array.is_array()) throw Error(what, std::string(field) + " is not an array");
  std::vector<int64_t> values;
  for (const nlohmann::json& value : array) {
    const bool fits = value.is_number_integer() &&
                      (!value.is_number_unsigned() ||
                       value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    if (!fits) throw Error(what, std::string(field) + " holds " + value.dump() + ", not a 64-bit integer");
    values.push_back(value.get<int64_t>());
  }
  return values;
}

// The specification's limit on the header (the reference implementation refuses larger ones).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const std::pair<DType, const char*> kDtypes[] = {{DType::f32, "F32"}, {DType::bf16, "BF16"}, {DType::f16, "F16"}};

// The value's little-endian bytes in `dtype`.
void append_value(std::string& out, DType dtype, float value) {
  uint32_t bits = 0;
  int bytes = 4;
  if (dtype == DType::f32) {
    std::memcpy(&bits, &value, sizeof bits);
  } else {
    bits = dtype == DType::bf16 ? kernels::fp32_to_bf16_bits(value) : kernels::fp32_to_fp16_bits(value);
    bytes = 2;
  }
  for (int b = 0; b < bytes; ++b) out.push_back(static_cast<char>((bits >> (8 * b)) & 0xffu));
}

float value_at(const unsigned char* bytes, DType dtype) {
  if (dtype == DType::f32) {
    const uint32_t bits = uint32_t{bytes[0]} | uint32_t{bytes[1]} << 8 | uint32_t{bytes[2]} << 16 |
                          uint32_t{bytes[3]} << 24;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }
  const auto bits = static_cast<uint16_t>(bytes[0] | bytes[1] << 8);
  return dtype == DType::bf16 ? kernels::bf16_bits_to_fp32(bits) : kernels::fp16_bits_to_fp32(bits);
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& [known, name] : kDtypes) {
    if (known == dtype) return name;
  }
  throw Error("safetensors", std::string("dtype ") + dtype_name(dtype) + " is not written by mt (F32, BF16, F16)");
}

int64_t SafetensorsEntry::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<float> values) {
  safetensors_dtype_name(dtype);
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  if (elements != static_cast<int64_t>(values.size())) {
    throw Error("safetensors: tensor " + name, std::to_string(values.size()) + " values for " +
                                                   std::to_string(elements) + " elements");
  }
  tensors_.push_back(Pending{std::move(name), dtype, std::move(shape), std::move(values)});
}

int64_t SafetensorsWriter::write(const std::string& path, const std::map<std::string, std::string>& metadata) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const Pending& t : tensors_) {
    const int64_t bytes = static_cast<int64_t>(t.values.size() * dtype_size(t.dtype));
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string prefix;
  for (int b = 0; b < 8; ++b) prefix.push_back(static_cast<char>((uint64_t{text.size()} >> (8 * b)) & 0xffu));

  TemporaryFile temporary(path);
  std::FILE* file = std::fopen(temporary.path().c_str(), "wb");
  if (file == nullptr) throw Error(path, "cannot create " + temporary.path() + ": " + std::strerror(errno));
  bool ok = std::fwrite(prefix.data(), 1, prefix.size(), file) == prefix.size() &&
            std::fwrite(text.data(), 1, text.size(), file) == text.size();
  std::string buffer;
  for (size_t i = 0; ok && i < tensors_.size(); ++i) {
    buffer.clear();
    buffer.reserve(tensors_[i].values.size() * dtype_size(tensors_[i].dtype));
    for (float value : tensors_[i].values) append_value(buffer, tensors_[i].dtype, value);
    ok = std::fwrite(buffer.data(), 1, buffer.size(), file) == buffer.size();
  }
  ok = std::fflush(file) == 0 && ok;
  const bool closed = std::fclose(file) == 0;
  if (!ok || !closed) throw Error(path, "cannot write " + temporary.path() + ": " + std::strerror(errno));
  temporary.commit();
  return static_cast<int64_t>(prefix.size() + text.size()) + offset;
}

SafetensorsReader::SafetensorsReader(std::string path, Holes holes) : path_(std::move(path)) {
  std::ifstream in(path_, std::ios::binary);
  if (!in) throw Error(path_, "cannot open");
  unsigned char prefix[8];
  if (!in.read(reinterpret_cast<char*>(prefix), 8)) throw Error(path_, "shorter than the 8-byte header size");
  uint64_t header_bytes = 0;
  for (int b = 7; b >= 0; --b) header_bytes = header_bytes << 8 | prefix[b];
  std::error_code error;
  const uint64_t file_bytes = std::filesystem::file_size(path_, error);
  if (error) throw Error(path_, "cannot stat: " + error.message());
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    throw Error(path_, "header size " + std::to_string(header_bytes) + " does not fit the file (" +
                           std::to_string(file_bytes) + " bytes)");
  }
  std::string text(header_bytes, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(header_bytes))) throw Error(path_, "header truncated");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path_, std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) throw Error(path_, "header is not a JSON object");
  buffer_start_ = static_cast<int64_t>(8 + header_bytes);
  for (const auto& [name, value] : header.items()) {
    const std::string what = path_ + ": tensor " + name;
    if (name == "__metadata__") {
      if (!value.is_object()) throw Error(path_, "__metadata__ is not an object");
      for (const auto& [key, text_value] : value.items()) {
        if (!text_value.is_string()) throw Error(path_, "__metadata__ value " + key + " is not a string");
        metadata_[key] = text_value.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry entry;
    entry.name = name;
    try {
      const std::string dtype = value.at("dtype").get<std::string>();
      const auto known = std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const auto& d) { return dtype == d.second; });
      if (known == std::end(kDtypes)) throw Error(what, "dtype " + dtype + " is not read by mt (F32, BF16, F16)");
      entry.dtype = known->first;
      entry.shape = header_integers(value.at("shape"), what, "shape");
      const auto offsets = header_integers(value.at("data_offsets"), what, "data_offsets");
      if (offsets.size() != 2) throw Error(what, "data_offsets is not [begin, end]");
      entry.begin = offsets[0];
      entry.end = offsets[1];
    } catch (const nlohmann::json::exception& e) {
      throw Error(what, std::string("malformed header entry: ") + e.what());
    }
    int64_t elements = 1;
    for (int64_t d : entry.shape) {
      if (d < 0) throw Error(what, "negative dimension");
      if (__builtin_mul_overflow(elements, d, &elements)) throw Error(what, "its shape has more than 2^63 elements");
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(elements, static_cast<int64_t>(dtype_size(entry.dtype)), &bytes) || entry.begin < 0 ||
        entry.end < entry.begin || entry.end - entry.begin != bytes) {
      throw Error(what, "data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                            ") do not hold its shape and dtype");
    }
    entries_.push_back(std::move(entry));
  }
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  int64_t expected = 0;
  for (const SafetensorsEntry& entry : entries_) {
    if (entry.begin < expected) {
      throw Error(path_ + ": tensor " + entry.name, "starts at byte " + std::to_string(entry.begin) +
                                                         ", inside the tensor before it (which ends at byte " +
                                                         std::to_string(expected) + "): overlapping tensors");
    }
    if (entry.begin > expected && hole_.empty()) {
      hole_ = path_ + ": bytes " + std::to_string(expected) + " to " + std::to_string(entry.begin) +
              " of the buffer belong to no tensor (the next is " + entry.name +
              "): a tensor missing from the header, or a damaged file";
    }
    expected = entry.end;
  }
  const uint64_t end = static_cast<uint64_t>(buffer_start_ + expected);
  if (end > file_bytes) {
    throw Error(path_, "the tensors end at byte " + std::to_string(end) + " of a " + std::to_string(file_bytes) +
                           "-byte file");
  }
  if (end < file_bytes && hole_.empty()) {
    hole_ = path_ + ": the tensors end at byte " + std::to_string(end) + " of a " + std::to_string(file_bytes) +
            "-byte file: a tensor missing from the header, or a damaged file";
  }
  if (!hole_.empty() && holes == Holes::refuse) throw Error(hole_, "");
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  for (const SafetensorsEntry& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::vector<float> SafetensorsReader::read(const std::string& name) const {
  const SafetensorsEntry* entry = find(name);
  if (entry == nullptr) throw Error(path_, "tensor " + name + " missing");
  std::ifstream in(path_, std::ios::binary);
  std::vector<unsigned char> bytes(static_cast<size_t>(entry->end - entry->begin));
  in.seekg(buffer_start_ + entry->begin);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()))) {
    throw Error(path_, "read of tensor " + name + " failed");
  }
  const size_t size = dtype_size(entry->dtype);
  std::vector<float> values(static_cast<size_t>(entry->elements()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = value_at(bytes.data() + i * size, entry->dtype);
  return values;
}

}  // namespace mt::io

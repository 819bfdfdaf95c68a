// The sample-index file (see sample_index.h). Tested in tests/unit/data/test_sample_index.cpp.
#include "data/sample_index.h"

#include <hdf5.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <variant>

#include "core/error.h"
#include "core/input_file.h"
#include "core/temporary_file.h"
#include "io/hdf5_attributes.h"

namespace mt::data {
namespace {

using io::Hdf5Handle;
using io::read_int_attribute;
using io::read_string_attribute;
using io::write_int_attribute;
using io::write_string_attribute;

constexpr const char* kFormat = "mt-sample-index";
constexpr int64_t kFormatVersion = 1;

// ---- writing ----

void write_int_attributes(const std::string& path, hid_t object, const char* name, const std::vector<int64_t>& values,
                          bool scalar) {
  const hsize_t dims[1] = {values.size()};
  Hdf5Handle space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims, nullptr), H5Sclose);
  Hdf5Handle attribute(H5Acreate2(object, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attribute.ok() || H5Awrite(attribute.get(), H5T_NATIVE_INT64, values.data()) < 0) {
    throw Error(path, std::string("cannot write attribute ") + name);
  }
}


void write_array(const std::string& path, hid_t group, const char* name, hid_t file_type, hid_t memory_type,
                 const void* data, hsize_t rows, hsize_t columns = 0) {
  const hsize_t dims[2] = {rows, columns};
  Hdf5Handle space(H5Screate_simple(columns ? 2 : 1, dims, nullptr), H5Sclose);
  Hdf5Handle dataset(H5Dcreate2(group, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (!dataset.ok()) throw Error(path, std::string("cannot create dataset ") + name);
  if (rows > 0 && H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    throw Error(path, std::string("cannot write dataset ") + name + io::with_failure_reason(path));
  }
}

hid_t create_group(const std::string& path, hid_t parent, const std::string& name) {
  const hid_t group = H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (group < 0) throw Error(path, "cannot create group " + name);
  return group;
}

void write_component(const std::string& path, hid_t split_group, int k, const IndexComponent& c) {
  Hdf5Handle group(create_group(path, split_group, "component_" + std::to_string(k)), H5Gclose);
  write_int_attribute(path, group.get(), "dataset", c.dataset);
  write_int_attribute(path, group.get(), "sequence_begin", c.sequence_begin);
  write_int_attribute(path, group.get(), "sequence_end", c.sequence_end);
  write_int_attribute(path, group.get(), "num_samples", c.num_samples);
  write_int_attribute(path, group.get(), "num_epochs", c.indices.num_epochs);
  write_int_attribute(path, group.get(), "separate_final_epoch", c.indices.separate_final_epoch ? 1 : 0);
  write_int_attribute(path, group.get(), "num_tokens_per_epoch", c.indices.num_tokens_per_epoch);
  const GptIndices& x = c.indices;
  write_array(path, group.get(), "document_index", H5T_STD_I32LE, H5T_NATIVE_INT32, x.document_index.data(),
              x.document_index.size());
  if (const auto* rows = std::get_if<std::vector<int32_t>>(&x.sample_index)) {
    write_array(path, group.get(), "sample_index", H5T_STD_I32LE, H5T_NATIVE_INT32, rows->data(), rows->size() / 2, 2);
  } else {
    const auto& wide = std::get<std::vector<int64_t>>(x.sample_index);
    write_array(path, group.get(), "sample_index", H5T_STD_I64LE, H5T_NATIVE_INT64, wide.data(), wide.size() / 2, 2);
  }
  if (const auto* order = std::get_if<std::vector<uint32_t>>(&x.shuffle_index)) {
    write_array(path, group.get(), "shuffle_index", H5T_STD_U32LE, H5T_NATIVE_UINT32, order->data(), order->size());
  } else {
    const auto& wide = std::get<std::vector<int64_t>>(x.shuffle_index);
    write_array(path, group.get(), "shuffle_index", H5T_STD_I64LE, H5T_NATIVE_INT64, wide.data(), wide.size());
  }
}

void write_contents(const std::string& path, const std::string& temporary, hid_t root, const SampleIndex& index) {
  const std::string parameters = index.parameters.dump();
  write_string_attribute(path, root, "mt_format", kFormat);
  write_int_attribute(path, root, "mt_format_version", kFormatVersion);
  write_string_attribute(path, root, "parameters", parameters);
  write_string_attribute(path, root, "parameters_md5", md5_hex(parameters));
  write_string_attribute(path, root, "datasets", index.datasets.dump());
  if (index.parameters.contains("seq_length")) {
    write_int_attribute(path, root, "seq_length", index.parameters["seq_length"].get<int64_t>());
  }
  if (index.parameters.contains("seed"))
    write_int_attribute(path, root, "seed", index.parameters["seed"].get<int64_t>());
  if (index.parameters.contains("split") && index.parameters["split"].is_string()) {
    write_string_attribute(path, root, "split", index.parameters["split"].get<std::string>());
  }
  if (index.parameters.contains("num_samples")) {
    write_int_attributes(path, root, "num_samples", index.parameters["num_samples"].get<std::vector<int64_t>>(), false);
  }
  for (size_t s = 0; s < index.splits.size(); ++s) {
    const IndexSplit& split = index.splits[s];
    if (!split.present) continue;
    Hdf5Handle group(create_group(path, root, std::string(split_name(static_cast<Split>(s)))), H5Gclose);
    write_int_attribute(path, group.get(), "num_samples", split.num_samples);
    write_int_attribute(path, group.get(), "size", split.size());
    write_int_attribute(path, group.get(), "components", static_cast<int64_t>(split.components.size()));
    write_int_attribute(path, group.get(), "blended", split.blended ? 1 : 0);
    if (split.blended) {
      write_array(path, group.get(), "dataset_index", H5T_STD_I16LE, H5T_NATIVE_INT16, split.dataset_index.data(),
                  split.dataset_index.size());
      write_array(path, group.get(), "dataset_sample_index", H5T_STD_I64LE, H5T_NATIVE_INT64,
                  split.dataset_sample_index.data(), split.dataset_sample_index.size());
    }
    for (size_t k = 0; k < split.components.size(); ++k) {
      write_component(path, group.get(), static_cast<int>(k), split.components[k]);
    }
  }
  if (H5Fflush(root, H5F_SCOPE_GLOBAL) < 0) throw Error(path, "cannot flush " + temporary + io::with_failure_reason(path));
}

// A failed write (a full disk) closes the file so that the close cannot fail (io/hdf5_attributes.h).
void write_file(const std::string& path, const std::string& temporary, const SampleIndex& index) {
  const hid_t file = H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) throw Error(path, "cannot create " + temporary + io::with_failure_reason(path));
  try {
    write_contents(path, temporary, file, index);
  } catch (const Error&) {
    io::close_abandoned_file(file);
    throw;
  }
  if (H5Fclose(file) < 0) throw Error(path, "cannot close " + temporary + io::with_failure_reason(path));
}

// ---- reading ----

int64_t require_int(const std::string& path, hid_t object, const std::string& where, const char* name) {
  const auto value = read_int_attribute(object, name);
  if (!value) throw Error(path, "attribute " + where + "/" + name + " is missing");
  return *value;
}

// Reads an integer dataset of `rank` dimensions (second dimension `columns` when 2-D) as `T`.
template <typename T>
std::vector<T> read_array(const std::string& path, hid_t group, const std::string& where, const char* name,
                          hid_t memory_type, int rank = 1, hsize_t columns = 0) {
  const std::string full = where + "/" + name;
  if (H5Lexists(group, name, H5P_DEFAULT) <= 0) throw Error(path, "dataset " + full + " is missing");
  Hdf5Handle dataset(H5Dopen2(group, name, H5P_DEFAULT), H5Dclose);
  if (!dataset.ok()) throw Error(path, "cannot open dataset " + full);
  Hdf5Handle type(H5Dget_type(dataset.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER) throw Error(path, "dataset " + full + " is not integer");
  Hdf5Handle space(H5Dget_space(dataset.get()), H5Sclose);
  if (H5Sget_simple_extent_ndims(space.get()) != rank) {
    throw Error(path, "dataset " + full + " is not " + std::to_string(rank) + "-D");
  }
  hsize_t dims[2] = {0, 0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  if (rank == 2 && dims[1] != columns)
    throw Error(path, "dataset " + full + " does not have " + std::to_string(columns) + " columns");
  const hsize_t count = rank == 2 ? dims[0] * dims[1] : dims[0];
  std::vector<T> values(count);
  if (count > 0 && H5Dread(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
    throw Error(path, "cannot read dataset " + full);
  }
  return values;
}

bool stored_as(hid_t group, const char* name, size_t size, H5T_sign_t sign) {
  Hdf5Handle dataset(H5Dopen2(group, name, H5P_DEFAULT), H5Dclose);
  Hdf5Handle type(H5Dget_type(dataset.get()), H5Tclose);
  return H5Tget_size(type.get()) == size && H5Tget_sign(type.get()) == sign;
}

IndexComponent read_component(const std::string& path, hid_t split_group, const std::string& split_label, int k,
                              int64_t dataset_count) {
  const std::string name = "component_" + std::to_string(k);
  const std::string where = "/" + split_label + "/" + name;
  if (H5Lexists(split_group, name.c_str(), H5P_DEFAULT) <= 0) throw Error(path, "group " + where + " is missing");
  Hdf5Handle group(H5Gopen2(split_group, name.c_str(), H5P_DEFAULT), H5Gclose);
  if (!group.ok()) throw Error(path, "cannot open group " + where);
  IndexComponent c;
  c.dataset = static_cast<int>(require_int(path, group.get(), where, "dataset"));
  if (c.dataset < 0 || c.dataset >= dataset_count)
    throw Error(path, where + ": dataset " + std::to_string(c.dataset) + " out of range");
  c.sequence_begin = require_int(path, group.get(), where, "sequence_begin");
  c.sequence_end = require_int(path, group.get(), where, "sequence_end");
  c.num_samples = require_int(path, group.get(), where, "num_samples");
  GptIndices& x = c.indices;
  x.num_epochs = require_int(path, group.get(), where, "num_epochs");
  x.separate_final_epoch = require_int(path, group.get(), where, "separate_final_epoch") != 0;
  x.num_tokens_per_epoch = require_int(path, group.get(), where, "num_tokens_per_epoch");
  x.document_index = read_array<int32_t>(path, group.get(), where, "document_index", H5T_NATIVE_INT32);
  if (stored_as(group.get(), "sample_index", 4, H5T_SGN_2)) {
    x.sample_index = read_array<int32_t>(path, group.get(), where, "sample_index", H5T_NATIVE_INT32, 2, 2);
  } else {
    x.sample_index = read_array<int64_t>(path, group.get(), where, "sample_index", H5T_NATIVE_INT64, 2, 2);
  }
  if (stored_as(group.get(), "shuffle_index", 4, H5T_SGN_NONE)) {
    x.shuffle_index = read_array<uint32_t>(path, group.get(), where, "shuffle_index", H5T_NATIVE_UINT32);
  } else {
    x.shuffle_index = read_array<int64_t>(path, group.get(), where, "shuffle_index", H5T_NATIVE_INT64);
  }
  // The reader trusts nothing: every index the loader follows must stay inside its array.
  const int64_t samples = x.num_samples();
  if (samples < 0) throw Error(path, where + "/sample_index is empty");
  const int64_t documents = static_cast<int64_t>(x.document_index.size());
  for (int64_t r = 0; r <= samples; ++r) {
    const auto [doc, offset] = x.sample(r);
    if (doc < 0 || doc >= documents || offset < 0) {
      throw Error(path, where + "/sample_index row " + std::to_string(r) + " points outside the document index");
    }
  }
  for (const int32_t sequence : x.document_index) {
    if (sequence < c.sequence_begin || sequence >= c.sequence_end) {
      throw Error(path, where + "/document_index names sequence " + std::to_string(sequence) + " outside [" +
                            std::to_string(c.sequence_begin) + ", " + std::to_string(c.sequence_end) + ")");
    }
  }
  const int64_t shuffled = std::visit([](const auto& v) { return static_cast<int64_t>(v.size()); }, x.shuffle_index);
  if (shuffled != samples) throw Error(path, where + "/shuffle_index length differs from the samples (truncated?)");
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t s = x.shuffled(i);
    if (s < 0 || s >= samples)
      throw Error(path, where + "/shuffle_index holds " + std::to_string(s) + ", past the samples");
  }
  return c;
}

// A (possibly nested) JSON value as one line of text for messages.
std::string brief(const nlohmann::ordered_json& value) {
  std::string text = value.dump();
  if (text.size() > 120) text = text.substr(0, 117) + "...";
  return text;
}

// Keys of `want` whose values differ in `have` ("key: file X, asked Y").
void collect_differences(const nlohmann::ordered_json& have, const nlohmann::ordered_json& want,
                         const std::string& prefix, std::vector<std::string>& out) {
  if (have.is_object() && want.is_object()) {
    for (auto it = want.begin(); it != want.end(); ++it) {
      const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
      if (!have.contains(it.key())) {
        out.push_back(key + ": file has none, asked " + brief(it.value()));
      } else {
        collect_differences(have[it.key()], it.value(), key, out);
      }
    }
    for (auto it = have.begin(); it != have.end(); ++it) {
      if (!want.contains(it.key()))
        out.push_back((prefix.empty() ? it.key() : prefix + "." + it.key()) + ": not asked");
    }
    return;
  }
  if (have.is_array() && want.is_array() && have.size() == want.size()) {
    for (size_t i = 0; i < want.size(); ++i) {
      collect_differences(have[i], want[i], prefix + "[" + std::to_string(i) + "]", out);
    }
    return;
  }
  if (have != want) out.push_back(prefix + ": file " + brief(have) + ", asked " + brief(want));
}

}  // namespace

int64_t IndexSplit::size() const {
  if (!present || components.empty()) return 0;
  if (blended) return static_cast<int64_t>(dataset_index.size());
  return components.front().size();
}

void write_sample_index(const std::string& path, const SampleIndex& index) {
  const io::Hdf5QuietErrors quiet;
  TemporaryFile temporary(path);  // removed if writing fails
  write_file(path, temporary.path(), index);
  temporary.commit();
}

SampleIndex read_sample_index(const std::string& path) {
  const io::Hdf5QuietErrors quiet;
  check_input_file(path);
  if (H5Fis_hdf5(path.c_str()) <= 0) throw Error(path, "not an HDF5 file");
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) throw Error(path, "cannot open as HDF5");
  const hid_t root = file.get();
  const auto format = read_string_attribute(root, "mt_format");
  if (!format || *format != kFormat) {
    throw Error(
        path, "not an mt sample index (mt_format is " + (format ? "'" + *format + "'" : std::string("missing")) + ")");
  }
  const auto version = read_int_attribute(root, "mt_format_version");
  if (!version || *version != kFormatVersion) {
    throw Error(path, "sample-index format version " + (version ? std::to_string(*version) : std::string("missing")) +
                          ", this build reads version " + std::to_string(kFormatVersion));
  }
  SampleIndex index;
  const auto parameters = read_string_attribute(root, "parameters");
  const auto datasets = read_string_attribute(root, "datasets");
  if (!parameters || !datasets) throw Error(path, "attributes parameters/datasets are missing");
  try {
    index.parameters = nlohmann::ordered_json::parse(*parameters);
    index.datasets = nlohmann::ordered_json::parse(*datasets);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path, std::string("parameters are not JSON: ") + e.what());
  }
  if (!index.datasets.is_array()) throw Error(path, "attribute datasets is not a JSON array");
  const int64_t dataset_count = static_cast<int64_t>(index.datasets.size());
  for (size_t s = 0; s < index.splits.size(); ++s) {
    const std::string label(split_name(static_cast<Split>(s)));
    const char* name = label.c_str();
    if (H5Lexists(root, name, H5P_DEFAULT) <= 0) continue;
    Hdf5Handle group(H5Gopen2(root, name, H5P_DEFAULT), H5Gclose);
    if (!group.ok()) throw Error(path, std::string("cannot open group /") + name);
    const std::string where = std::string("/") + name;
    IndexSplit& split = index.splits[s];
    split.present = true;
    split.num_samples = require_int(path, group.get(), where, "num_samples");
    const int64_t components = require_int(path, group.get(), where, "components");
    split.blended = require_int(path, group.get(), where, "blended") != 0;
    if (components < 1 || components > 32767)
      throw Error(path, where + ": " + std::to_string(components) + " components");
    for (int k = 0; k < components; ++k) {
      split.components.push_back(read_component(path, group.get(), name, k, dataset_count));
    }
    if (split.blended) {
      split.dataset_index = read_array<int16_t>(path, group.get(), where, "dataset_index", H5T_NATIVE_INT16);
      split.dataset_sample_index =
          read_array<int64_t>(path, group.get(), where, "dataset_sample_index", H5T_NATIVE_INT64);
      if (split.dataset_index.size() != split.dataset_sample_index.size()) {
        throw Error(path, where + ": dataset_index and dataset_sample_index differ in length");
      }
      for (size_t i = 0; i < split.dataset_index.size(); ++i) {
        const int d = split.dataset_index[i];
        if (d < 0 || d >= components || split.dataset_sample_index[i] < 0 ||
            split.dataset_sample_index[i] >= split.components[static_cast<size_t>(d)].size()) {
          throw Error(path, where + ": blending entry " + std::to_string(i) + " points past its component");
        }
      }
    }
    if (require_int(path, group.get(), where, "size") != split.size()) {
      throw Error(path, where + ": size attribute disagrees with the arrays (truncated?)");
    }
  }
  return index;
}

void check_sample_index(const std::string& path, const SampleIndex& index, const nlohmann::ordered_json& parameters,
                        const nlohmann::ordered_json& datasets) {
  std::vector<std::string> differences;
  collect_differences(index.parameters, parameters, "", differences);
  collect_differences(index.datasets, datasets, "datasets", differences);
  if (differences.empty()) return;
  std::string text;
  for (size_t i = 0; i < differences.size() && i < 4; ++i) text += (i ? "; " : "") + differences[i];
  if (differences.size() > 4) text += "; and " + std::to_string(differences.size() - 4) + " more";
  throw Error(path, "stale sample index, built for other parameters or data (" + text +
                        "); remove it or write the index elsewhere");
}

// RFC 1321.
std::string md5_hex(std::string_view data) {
  static constexpr uint32_t k[64] = {
      0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
      0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
      0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
      0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
      0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
      0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
      0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
      0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};
  static constexpr int r[64] = {7,  12, 17, 22, 7,  12, 17, 22, 7,  12, 17, 22, 7,  12, 17, 22, 5,  9,  14, 20, 5,  9,
                                14, 20, 5,  9,  14, 20, 5,  9,  14, 20, 4,  11, 16, 23, 4,  11, 16, 23, 4,  11, 16, 23,
                                4,  11, 16, 23, 6,  10, 15, 21, 6,  10, 15, 21, 6,  10, 15, 21, 6,  10, 15, 21};
  uint32_t h[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  std::string message(data);
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  message.push_back(static_cast<char>(0x80));
  while (message.size() % 64 != 56) message.push_back('\0');
  for (int i = 0; i < 8; ++i) message.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  for (size_t block = 0; block < message.size(); block += 64) {
    uint32_t w[16];
    for (int i = 0; i < 16; ++i) {
      const auto* b = reinterpret_cast<const unsigned char*>(message.data() + block + 4 * i);
      w[i] = uint32_t{b[0]} | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) | (uint32_t{b[3]} << 24);
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
    for (int i = 0; i < 64; ++i) {
      uint32_t f;
      int g;
      if (i < 16) {
        f = (b & c) | (~b & d);
        g = i;
      } else if (i < 32) {
        f = (d & b) | (~d & c);
        g = (5 * i + 1) % 16;
      } else if (i < 48) {
        f = b ^ c ^ d;
        g = (3 * i + 5) % 16;
      } else {
        f = c ^ (b | ~d);
        g = (7 * i) % 16;
      }
      const uint32_t rotated = a + f + k[i] + w[g];
      a = d;
      d = c;
      c = b;
      b = b + ((rotated << r[i]) | (rotated >> (32 - r[i])));
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
  }
  std::string hex;
  static constexpr char digits[] = "0123456789abcdef";
  for (const uint32_t word : h) {
    for (int i = 0; i < 4; ++i) {
      const unsigned byte = (word >> (8 * i)) & 0xff;
      hex.push_back(digits[byte >> 4]);
      hex.push_back(digits[byte & 15]);
    }
  }
  return hex;
}

}  // namespace mt::data

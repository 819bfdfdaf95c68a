// HDF5 handles and attributes shared by mt's file formats (see hdf5_attributes.h).
#include "io/hdf5_attributes.h"

#include <cstring>

#include "core/error.h"

namespace mt::io {

void write_string_attribute(const std::string& path, hid_t object, const char* name, const std::string& value) {
  Hdf5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), value.empty() ? 1 : value.size());
  Hdf5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Hdf5Handle attribute(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attribute.ok() || H5Awrite(attribute.get(), type.get(), value.c_str()) < 0) {
    throw Error(path, std::string("cannot write attribute ") + name);
  }
}

namespace {

// A scalar attribute of `file_type` from a value of `memory_type`.
void write_scalar_attribute(const std::string& path, hid_t object, const char* name, hid_t file_type,
                            hid_t memory_type, const void* value) {
  Hdf5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Hdf5Handle attribute(H5Acreate2(object, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attribute.ok() || H5Awrite(attribute.get(), memory_type, value) < 0) {
    throw Error(path, std::string("cannot write attribute ") + name);
  }
}

// A scalar attribute of class `type_class` read as `memory_type`; false when absent or another class.
bool read_scalar_attribute(hid_t object, const char* name, H5T_class_t type_class, hid_t memory_type, void* value) {
  if (H5Aexists(object, name) <= 0) return false;
  Hdf5Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  Hdf5Handle type(H5Aget_type(attribute.get()), H5Tclose);
  if (!attribute.ok() || !type.ok() || H5Tget_class(type.get()) != type_class) return false;
  Hdf5Handle space(H5Aget_space(attribute.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return false;
  return H5Aread(attribute.get(), memory_type, value) >= 0;
}

template <typename T>
std::optional<T> read_scalar(hid_t object, const char* name, H5T_class_t type_class, hid_t memory_type) {
  T value{};
  if (!read_scalar_attribute(object, name, type_class, memory_type, &value)) return std::nullopt;
  return value;
}

}  // namespace

void write_int_attribute(const std::string& path, hid_t object, const char* name, int64_t value) {
  write_scalar_attribute(path, object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void write_uint_attribute(const std::string& path, hid_t object, const char* name, uint64_t value) {
  write_scalar_attribute(path, object, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

void write_double_attribute(const std::string& path, hid_t object, const char* name, double value) {
  write_scalar_attribute(path, object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

std::optional<std::string> read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Hdf5Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  Hdf5Handle type(H5Aget_type(attribute.get()), H5Tclose);
  if (!attribute.ok() || !type.ok() || H5Tget_class(type.get()) != H5T_STRING) return std::nullopt;
  Hdf5Handle space(H5Aget_space(attribute.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return std::nullopt;
  Hdf5Handle memory_type(H5Tcopy(H5T_C_S1), H5Tclose);
  std::string value;
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Tset_size(memory_type.get(), H5T_VARIABLE);
    char* text = nullptr;
    if (H5Aread(attribute.get(), memory_type.get(), &text) < 0) return std::nullopt;
    if (text != nullptr) {
      value = text;
      H5free_memory(text);
    }
    return value;
  }
  // Null-padded and one byte longer than stored, so a string filling its size keeps its end.
  value.assign(H5Tget_size(type.get()) + 1, '\0');
  H5Tset_size(memory_type.get(), value.size());
  H5Tset_strpad(memory_type.get(), H5T_STR_NULLPAD);
  if (H5Aread(attribute.get(), memory_type.get(), value.data()) < 0) return std::nullopt;
  value.resize(std::strlen(value.c_str()));
  return value;
}

std::optional<int64_t> read_int_attribute(hid_t object, const char* name) {
  return read_scalar<int64_t>(object, name, H5T_INTEGER, H5T_NATIVE_INT64);
}

std::optional<uint64_t> read_uint_attribute(hid_t object, const char* name) {
  return read_scalar<uint64_t>(object, name, H5T_INTEGER, H5T_NATIVE_UINT64);
}

std::optional<double> read_double_attribute(hid_t object, const char* name) {
  return read_scalar<double>(object, name, H5T_FLOAT, H5T_NATIVE_DOUBLE);
}

}  // namespace mt::io

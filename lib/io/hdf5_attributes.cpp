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

void write_int_attribute(const std::string& path, hid_t object, const char* name, int64_t value) {
  Hdf5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Hdf5Handle attribute(H5Acreate2(object, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attribute.ok() || H5Awrite(attribute.get(), H5T_NATIVE_INT64, &value) < 0) {
    throw Error(path, std::string("cannot write attribute ") + name);
  }
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
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  Hdf5Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  Hdf5Handle type(H5Aget_type(attribute.get()), H5Tclose);
  if (!attribute.ok() || !type.ok() || H5Tget_class(type.get()) != H5T_INTEGER) return std::nullopt;
  Hdf5Handle space(H5Aget_space(attribute.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return std::nullopt;
  int64_t value = 0;
  if (H5Aread(attribute.get(), H5T_NATIVE_INT64, &value) < 0) return std::nullopt;
  return value;
}

}  // namespace mt::io

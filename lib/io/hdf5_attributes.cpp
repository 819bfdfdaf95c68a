// HDF5 handles and attributes shared by mt's file formats (see hdf5_attributes.h).
#include "io/hdf5_attributes.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace mt::io {

namespace {

// mt closes every HDF5 object it opens. HDF5's exit handler only ever meets what a failed close
// left registered, over memory that close already freed, and closing that again is a SIGSEGV after
// the work is done (issue 28 C1, C3). So the library's exit handler is not installed (this runs
// before main, before HDF5 starts).
const bool g_without_hdf5_exit_handler = [] {
  H5dont_atexit();
  return true;
}();

// Collects the descriptions on an HDF5 error stack (H5Ewalk2's callback).
herr_t collect_description(unsigned, const H5E_error2_t* error, void* descriptions) {
  if (error->desc != nullptr) static_cast<std::vector<std::string>*>(descriptions)->push_back(error->desc);
  return 0;
}

// "error message = 'No space left on device'" in the sec2 driver's description of a failed
// write or truncate; "" when absent.
std::string system_message(const std::string& description) {
  const std::string key = "error message = '";
  const size_t begin = description.find(key);
  if (begin == std::string::npos) return "";
  const size_t end = description.find('\'', begin + key.size());
  return end == std::string::npos ? "" : description.substr(begin + key.size(), end - begin - key.size());
}

bool nearly_full(const std::string& path) {
  std::filesystem::path directory = std::filesystem::path(path).parent_path();
  if (directory.empty()) directory = ".";
  struct statvfs fs {};
  if (statvfs(directory.c_str(), &fs) != 0) return false;
  return static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize < (1ULL << 20);
}

}  // namespace

std::string hdf5_failure_reason(const std::string& path) {
  std::vector<std::string> descriptions;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_description, &descriptions);
  for (const std::string& description : descriptions) {
    const std::string message = system_message(description);
    if (!message.empty()) return message;
  }
  return nearly_full(path) ? std::strerror(ENOSPC) : "";
}

std::string with_failure_reason(const std::string& path) {
  const std::string reason = hdf5_failure_reason(path);
  return reason.empty() ? "" : ": " + reason;
}

bool redirect_file_descriptor(hid_t file, int replacement) {
  Hdf5Handle access(H5Fget_access_plist(file), H5Pclose);
  if (!access.ok() || H5Pget_driver(access.get()) != H5FD_SEC2) return false;
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file, access.get(), &handle) < 0 || handle == nullptr) return false;
  return dup2(replacement, *static_cast<int*>(handle)) >= 0;
}

void close_abandoned_file(hid_t file) {
  const Hdf5QuietErrors quiet;
  const int memory = memfd_create("mt-abandoned-hdf5", MFD_CLOEXEC);
  if (memory >= 0) {
    redirect_file_descriptor(file, memory);
    close(memory);
  }
  // The close sets the in-memory file to HDF5's end of allocation, which a soft `ulimit -f` may
  // forbid (EFBIG): lifted to the hard limit while it closes.
  struct rlimit limit {};
  const bool lifted = getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != limit.rlim_max;
  if (lifted) {
    struct rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_FSIZE, &raised);
  }
  H5Fclose(file);
  if (lifted) setrlimit(RLIMIT_FSIZE, &limit);
}

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

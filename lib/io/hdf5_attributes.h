// The small HDF5 pieces every mt file format needs: a handle that closes itself, a scope that
// keeps HDF5's error printing quiet, scalar string and integer attributes written and read
// the same way everywhere (token datasets, sample indices, checkpoints), and the system's reason
// for a failed write ("No space left on device") and the close of a file whose writing failed. Tested through tests/unit/data/test_token_dataset.cpp,
// test_sample_index.cpp, tests/unit/io/test_checkpoint.cpp and tests/tools/full-disk.bats.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>

namespace mt::io {

// Closes an HDF5 handle when it goes out of scope.
class Hdf5Handle {
 public:
  Hdf5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Hdf5Handle() {
    if (id_ >= 0) close_(id_);
  }
  Hdf5Handle(const Hdf5Handle&) = delete;
  Hdf5Handle& operator=(const Hdf5Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Gives the handle up without closing it (the caller closes it and checks the result).
  hid_t release() {
    const hid_t id = id_;
    id_ = -1;
    return id;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its error stack on stderr whenever a call fails; mt turns each failure into one
// mt::Error line instead. Inside this scope the printing is off for the calling thread, and the
// caller's handler comes back when the scope ends: never process-wide, so a program that links
// mt keeps its own setting. Every mt function that calls HDF5 opens one.
class Hdf5QuietErrors {
 public:
  Hdf5QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &handler_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~Hdf5QuietErrors() { H5Eset_auto2(H5E_DEFAULT, handler_, data_); }
  Hdf5QuietErrors(const Hdf5QuietErrors&) = delete;
  Hdf5QuietErrors& operator=(const Hdf5QuietErrors&) = delete;

 private:
  H5E_auto2_t handler_ = nullptr;
  void* data_ = nullptr;
};

// Why the HDF5 call that just failed on this thread failed, as the system said it: the text of
// the errno on HDF5's error stack ("No space left on device", "File too large"). When the stack
// names none (MPI-IO reports its own codes), "No space left on device" if the file system of
// `path` has less than 1 MiB left, else "". Call it before any other HDF5 call.
std::string hdf5_failure_reason(const std::string& path);
// ": <reason>" for an error line, or "" when there is none.
std::string with_failure_reason(const std::string& path);

// Closes a file whose writing failed so that the close cannot fail: under the sec2 driver (one
// process) the descriptor HDF5 writes through is first swapped for an in-memory file, so what
// HDF5 still flushes goes nowhere. A failed H5Fclose leaves the file's id registered, and HDF5's
// exit handler then closes it again (SIGSEGV). Other drivers are closed as they are.
void close_abandoned_file(hid_t file);
// Points the descriptor of `file` (open through the sec2 driver) at `replacement` (dup2); false
// when `file` is open through another driver.
bool redirect_file_descriptor(hid_t file, int replacement);

// Scalar attributes; a failure throws mt::Error naming `path` (the file) and the attribute.
void write_string_attribute(const std::string& path, hid_t object, const char* name, const std::string& value);
void write_int_attribute(const std::string& path, hid_t object, const char* name, int64_t value);
void write_uint_attribute(const std::string& path, hid_t object, const char* name, uint64_t value);
void write_double_attribute(const std::string& path, hid_t object, const char* name, double value);

// A string attribute (fixed or variable length; a fixed one that fills its size exactly, as
// h5py writes numpy.bytes_, keeps its last character); std::nullopt when absent or not a string.
std::optional<std::string> read_string_attribute(hid_t object, const char* name);
// A scalar integer attribute; std::nullopt when absent or not an integer.
std::optional<int64_t> read_int_attribute(hid_t object, const char* name);
std::optional<uint64_t> read_uint_attribute(hid_t object, const char* name);
// A scalar floating-point attribute; std::nullopt when absent or not a float.
std::optional<double> read_double_attribute(hid_t object, const char* name);

}  // namespace mt::io

// HDF5 checkpoint writer and reader (see checkpoint.h).
#include "io/checkpoint.h"

#include <hdf5.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "core/error.h"

namespace mt::io {
namespace {

constexpr int kFormatVersion = 1;

// Closes an HDF5 handle when it goes out of scope.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

void write_string_attribute(hid_t object, const char* name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), value.empty() ? 1 : value.size());
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attribute(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attribute.ok() || H5Awrite(attribute.get(), type.get(), value.c_str()) < 0) {
    throw Error(std::string("attribute ") + name, "HDF5 write failed");
  }
}

void write_int_attribute(hid_t object, const char* name, int64_t value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attribute(H5Acreate2(object, name, H5T_NATIVE_INT64, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attribute.ok() || H5Awrite(attribute.get(), H5T_NATIVE_INT64, &value) < 0) {
    throw Error(std::string("attribute ") + name, "HDF5 write failed");
  }
}

std::string read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return "";
  Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(attribute.get()), H5Tclose);
  std::string value(H5Tget_size(type.get()), '\0');
  Handle memory_type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(memory_type.get(), value.size());
  H5Aread(attribute.get(), memory_type.get(), value.data());
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

int64_t read_int_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return 0;
  Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  int64_t value = 0;
  H5Aread(attribute.get(), H5T_NATIVE_INT64, &value);
  return value;
}

// The hyperslab of a rank's shard inside the global tensor.
void shard_selection(const model::ParamEntry& entry, std::vector<hsize_t>& start, std::vector<hsize_t>& count) {
  start.assign(entry.global_shape.size(), 0);
  count.assign(entry.local_shape.begin(), entry.local_shape.end());
  if (entry.shard_dim >= 0) start[static_cast<size_t>(entry.shard_dim)] = static_cast<hsize_t>(entry.shard_offset);
}

}  // namespace

void write_parameters(const std::string& path, const model::ParamLayout& layout, const float* params,
                      const CheckpointInfo& info) {
  const std::string temporary = path + ".tmp-" + std::to_string(getpid());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  {
    Handle file(H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) throw Error(path, "cannot create " + temporary);
    write_string_attribute(file.get(), "mt_format", "mt-checkpoint");
    write_int_attribute(file.get(), "mt_format_version", kFormatVersion);
    write_int_attribute(file.get(), "iteration", info.iteration);
    write_int_attribute(file.get(), "consumed_samples", info.consumed_samples);
    write_string_attribute(file.get(), "config", info.config_json);
    Handle group(H5Gcreate2(file.get(), "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    for (const auto& entry : layout.entries) {
      std::vector<hsize_t> dims(entry.global_shape.begin(), entry.global_shape.end());
      Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
      Handle dataset(H5Dcreate2(group.get(), entry.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                                H5P_DEFAULT, H5P_DEFAULT),
                     H5Dclose);
      if (!dataset.ok()) throw Error(path, "cannot create dataset " + entry.name);
      std::vector<hsize_t> start, count;
      shard_selection(entry, start, count);
      H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
      Handle memory(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
      const Tensor shard = layout.view(entry, const_cast<float*>(params));
      if (H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, memory.get(), space.get(), H5P_DEFAULT, shard.data<float>()) < 0) {
        throw Error(path, "write of " + entry.name + " failed");
      }
    }
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) throw Error(path, "flush failed");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw Error(path, "cannot rename " + temporary + " into place");
  }
}

CheckpointInfo read_parameters(const std::string& path, const model::ParamLayout& layout, float* params) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) throw Error(path, "cannot open as HDF5");
  if (read_string_attribute(file.get(), "mt_format") != "mt-checkpoint") throw Error(path, "not an mt checkpoint");
  CheckpointInfo info;
  info.iteration = read_int_attribute(file.get(), "iteration");
  info.consumed_samples = read_int_attribute(file.get(), "consumed_samples");
  info.config_json = read_string_attribute(file.get(), "config");
  for (const auto& entry : layout.entries) {
    const std::string name = "model/" + entry.name;
    if (H5Lexists(file.get(), "model", H5P_DEFAULT) <= 0 || H5Lexists(file.get(), name.c_str(), H5P_DEFAULT) <= 0) {
      throw Error(path, "tensor " + entry.name + " missing");
    }
    Handle dataset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    Handle space(H5Dget_space(dataset.get()), H5Sclose);
    std::vector<hsize_t> dims(static_cast<size_t>(H5Sget_simple_extent_ndims(space.get())));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    if (std::vector<int64_t>(dims.begin(), dims.end()) != entry.global_shape) {
      throw Error(path, "tensor " + entry.name + " has another global shape than the model's");
    }
    std::vector<hsize_t> start, count;
    shard_selection(entry, start, count);
    H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    Handle memory(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
    const Tensor shard = layout.view(entry, params);
    if (H5Dread(dataset.get(), H5T_NATIVE_FLOAT, memory.get(), space.get(), H5P_DEFAULT, shard.data<float>()) < 0) {
      throw Error(path, "read of " + entry.name + " failed");
    }
  }
  return info;
}

}  // namespace mt::io

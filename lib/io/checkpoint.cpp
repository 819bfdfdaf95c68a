// HDF5 checkpoint writer and reader (see checkpoint.h).
#include "io/checkpoint.h"

#include <hdf5.h>

#include <cstdio>
#include <vector>

#include "core/error.h"
#include "core/temporary_file.h"
#include "io/hdf5_attributes.h"

namespace mt::io {
namespace {

constexpr int kFormatVersion = 1;

std::string read_string_or_empty(hid_t object, const char* name) {
  return read_string_attribute(object, name).value_or("");
}

int64_t read_int_or_zero(hid_t object, const char* name) { return read_int_attribute(object, name).value_or(0); }

// The hyperslab of a rank's shard inside the global tensor.
void shard_selection(const model::ParamEntry& entry, std::vector<hsize_t>& start, std::vector<hsize_t>& count) {
  start.assign(entry.global_shape.size(), 0);
  count.assign(entry.local_shape.begin(), entry.local_shape.end());
  if (entry.shard_dim >= 0) start[static_cast<size_t>(entry.shard_dim)] = static_cast<hsize_t>(entry.shard_offset);
}

}  // namespace

void write_parameters(const std::string& path, const model::ParamLayout& layout, const float* params,
                      const CheckpointInfo& info) {
  TemporaryFile temporary(path);  // removed on any failure below
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  {
    Hdf5Handle file(H5Fcreate(temporary.path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) throw Error(path, "cannot create " + temporary.path());
    write_string_attribute(path, file.get(), "mt_format", "mt-checkpoint");
    write_int_attribute(path, file.get(), "mt_format_version", kFormatVersion);
    write_int_attribute(path, file.get(), "iteration", info.iteration);
    write_int_attribute(path, file.get(), "consumed_samples", info.consumed_samples);
    write_string_attribute(path, file.get(), "config", info.config_json);
    Hdf5Handle group(H5Gcreate2(file.get(), "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    for (const auto& entry : layout.entries) {
      std::vector<hsize_t> dims(entry.global_shape.begin(), entry.global_shape.end());
      Hdf5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
      Hdf5Handle dataset(H5Dcreate2(group.get(), entry.name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                                H5P_DEFAULT, H5P_DEFAULT),
                     H5Dclose);
      if (!dataset.ok()) throw Error(path, "cannot create dataset " + entry.name);
      std::vector<hsize_t> start, count;
      shard_selection(entry, start, count);
      H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
      Hdf5Handle memory(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
      const Tensor shard = layout.view(entry, const_cast<float*>(params));
      if (H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, memory.get(), space.get(), H5P_DEFAULT, shard.data<float>()) < 0) {
        throw Error(path, "write of " + entry.name + " failed");
      }
    }
    if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) throw Error(path, "flush failed");
  }
  temporary.commit();
}

CheckpointInfo read_parameters(const std::string& path, const model::ParamLayout& layout, float* params) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) throw Error(path, "cannot open as HDF5");
  if (read_string_or_empty(file.get(), "mt_format") != "mt-checkpoint") throw Error(path, "not an mt checkpoint");
  CheckpointInfo info;
  info.iteration = read_int_or_zero(file.get(), "iteration");
  info.consumed_samples = read_int_or_zero(file.get(), "consumed_samples");
  info.config_json = read_string_or_empty(file.get(), "config");
  for (const auto& entry : layout.entries) {
    const std::string name = "model/" + entry.name;
    if (H5Lexists(file.get(), "model", H5P_DEFAULT) <= 0 || H5Lexists(file.get(), name.c_str(), H5P_DEFAULT) <= 0) {
      throw Error(path, "tensor " + entry.name + " missing");
    }
    Hdf5Handle dataset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    Hdf5Handle space(H5Dget_space(dataset.get()), H5Sclose);
    std::vector<hsize_t> dims(static_cast<size_t>(H5Sget_simple_extent_ndims(space.get())));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    if (std::vector<int64_t>(dims.begin(), dims.end()) != entry.global_shape) {
      throw Error(path, "tensor " + entry.name + " has another global shape than the model's");
    }
    std::vector<hsize_t> start, count;
    shard_selection(entry, start, count);
    H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    Hdf5Handle memory(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose);
    const Tensor shard = layout.view(entry, params);
    if (H5Dread(dataset.get(), H5T_NATIVE_FLOAT, memory.get(), space.get(), H5P_DEFAULT, shard.data<float>()) < 0) {
      throw Error(path, "read of " + entry.name + " failed");
    }
  }
  return info;
}

}  // namespace mt::io

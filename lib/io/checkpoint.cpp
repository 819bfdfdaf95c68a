// HDF5 checkpoint writer, reader and directories (see checkpoint.h).
#include "io/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "core/input_file.h"
#include "io/hdf5_attributes.h"
#include "kernels/common/half.h"

namespace mt::io {
namespace {

constexpr const char* kFormat = "mt-checkpoint";
constexpr const char* kFileName = "checkpoint.h5";
constexpr const char* kTrackerName = "latest_checkpointed_iteration.txt";
// Disk space a group keeps free beside its temporary checkpoint until the metadata is written
// (checkpoint.h).
constexpr off_t kHeadroomBytes = off_t{4} << 20;
// Disk space every writer reserves first and frees just before H5Fcreate, which writes the
// superblock: an H5Fcreate that fails on a full disk leaves HDF5 unable to close itself at exit.
constexpr off_t kCreateBytes = off_t{64} << 10;

// The headroom's size: kHeadroomBytes, or less under a smaller file-size limit (ulimit -f).
off_t headroom_bytes() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return kHeadroomBytes;
  return std::min<off_t>(kHeadroomBytes, static_cast<off_t>(limit.rlim_cur / 2));
}


uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t element_hash(uint64_t global_index, uint32_t bits) { return splitmix64(splitmix64(global_index) ^ bits); }

// The checksum share of `rows` rows of `width` contiguous values whose first elements are at
// the global linear indices first_index(row).
template <typename FirstIndex>
uint64_t rows_checksum(int64_t rows, int64_t width, const float* data, FirstIndex first_index) {
  uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const uint64_t base = first_index(row);
    const float* values = data + row * width;
    for (int64_t i = 0; i < width; ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, values + i, sizeof bits);
      sum += element_hash(base + static_cast<uint64_t>(i), bits);
    }
  }
  return sum;
}

std::vector<hsize_t> to_hsize(const std::vector<int64_t>& values) { return {values.begin(), values.end()}; }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t d = 0; d < shape.size(); ++d) text += (d ? ", " : "") + std::to_string(shape[d]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

void check_box(const std::string& what, const std::vector<int64_t>& shape, const Box& box) {
  bool ok = box.offset.size() == shape.size() && box.extent.size() == shape.size();
  for (size_t d = 0; ok && d < shape.size(); ++d) {
    ok = box.offset[d] >= 0 && box.extent[d] >= 0 && box.offset[d] + box.extent[d] <= shape[d];
  }
  if (!ok) throw Error(what, "a slice lies outside the global shape " + shape_text(shape));
}

// Selects `box` in the file space of a dataset; returns the matching memory space.
hid_t select_box(hid_t file_space, const Box& box) {
  const std::vector<hsize_t> start = to_hsize(box.offset), count = to_hsize(box.extent);
  if (box.offset.empty()) {
    H5Sselect_all(file_space);
    return H5Screate(H5S_SCALAR);
  }
  H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  return H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr);
}

void fsync_or_throw(const std::string& path, int flags, const std::string& what) {
  const int fd = open(path.c_str(), flags);
  if (fd < 0) throw Error(what, "cannot open " + path + " to sync it: " + std::strerror(errno));
  const int result = fsync(fd);
  const int saved = errno;
  close(fd);
  if (result != 0) throw Error(what, "cannot sync " + path + ": " + std::strerror(saved));
}

// Creates `directory` if needed and syncs its parent so the new entry survives a crash.
void make_directory(const std::string& directory) {
  if (mkdir(directory.c_str(), 0777) == 0) {
    const std::filesystem::path parent = std::filesystem::path(directory).parent_path();
    fsync_or_throw(parent.empty() ? "." : parent.string(), O_RDONLY | O_DIRECTORY, directory);
    return;
  }
  if (errno == EEXIST && std::filesystem::is_directory(directory)) return;
  throw Error(directory, std::string("cannot create the checkpoint directory: ") + std::strerror(errno));
}

// Names the datasets of a group and its subgroups, depth first in name order ("model/x").
herr_t collect_dataset(hid_t group, const char* name, const H5L_info_t*, void* names) {
  const hid_t object = H5Oopen(group, name, H5P_DEFAULT);
  if (object < 0) return 0;
  if (H5Iget_type(object) == H5I_DATASET) static_cast<std::vector<std::string>*>(names)->push_back(name);
  H5Oclose(object);
  return 0;
}

// The HDF5 file type of `stored`: IEEE float32, or the 16-bit float with bfloat16's or float16's
// fields (sign bit 15; 8 exponent bits, bias 127, or 5, bias 15), which HDF5 converts exactly to
// float32 when read.
hid_t stored_float_type(DType stored, const std::string& what) {
  if (stored == DType::f32) return H5Tcopy(H5T_IEEE_F32LE);
  if (stored != DType::bf16 && stored != DType::f16) {
    throw Error(what, std::string("cannot store ") + dtype_name(stored) + " (float32, bfloat16 or float16)");
  }
  const hid_t type = H5Tcopy(H5T_IEEE_F32LE);
  const bool bf16 = stored == DType::bf16;
  H5Tset_fields(type, 15, bf16 ? 7 : 10, bf16 ? 8 : 5, 0, bf16 ? 7 : 10);
  H5Tset_size(type, 2);
  H5Tset_ebias(type, bf16 ? 127 : 15);
  return type;
}

// "float32", "bfloat16", "float16" for the float types mt writes, else the class and bits.
std::string stored_dtype_name(hid_t type) {
  const size_t size = H5Tget_size(type);
  if (H5Tget_class(type) != H5T_FLOAT) {
    return (H5Tget_class(type) == H5T_INTEGER ? "int" : "other") + std::to_string(size * 8);
  }
  if (size == 4) return "float32";
  if (size == 2) {
    size_t sign = 0, exponent_position = 0, exponent_bits = 0, mantissa_position = 0, mantissa_bits = 0;
    H5Tget_fields(type, &sign, &exponent_position, &exponent_bits, &mantissa_position, &mantissa_bits);
    if (exponent_bits == 8) return "bfloat16";
    if (exponent_bits == 5) return "float16";
  }
  return "float" + std::to_string(size * 8);
}

bool readable_float(const std::string& dtype) { return dtype == "float32" || dtype == "bfloat16" || dtype == "float16"; }

}  // namespace

int64_t Box::elements() const {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  return n;
}

std::vector<Box> flat_run_boxes(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  std::vector<Box> boxes;
  if (begin >= end) return boxes;
  const size_t rank = shape.size();
  if (rank == 0) return {Box{}};
  // strides[d]: elements per step of dimension d.
  std::vector<int64_t> strides(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) strides[d - 1] = strides[d] * shape[d];
  auto coordinates = [&](int64_t flat) {
    std::vector<int64_t> c(rank);
    for (size_t d = 0; d < rank; ++d) {
      c[d] = flat / strides[d];
      flat %= strides[d];
    }
    return c;
  };
  // Greedy from `begin`: the largest block aligned at the cursor that fits before `end`, as a box
  // spanning whole trailing dimensions (a run of up to `count` steps of dimension d).
  int64_t cursor = begin;
  while (cursor < end) {
    size_t d = rank - 1;
    // Climb while the cursor is aligned to the next larger stride and a whole step fits.
    while (d > 0 && cursor % strides[d - 1] == 0 && cursor + strides[d - 1] <= end) --d;
    const int64_t position = (cursor / strides[d]) % shape[d];
    const int64_t count = std::min(shape[d] - position, (end - cursor) / strides[d]);
    Box box;
    box.offset = coordinates(cursor);
    box.extent.assign(rank, 1);
    box.extent[d] = count;
    for (size_t t = d + 1; t < rank; ++t) box.extent[t] = shape[t];
    boxes.push_back(box);
    cursor += count * strides[d];
  }
  return boxes;
}

uint64_t slice_checksum(const std::vector<int64_t>& global_shape, const TensorSlice& slice) {
  const Box& box = slice.box;
  check_box("checksum", global_shape, box);
  const size_t rank = global_shape.size();
  if (rank == 0) return rows_checksum(1, 1, slice.data, [](int64_t) { return uint64_t{0}; });
  std::vector<int64_t> strides(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) strides[d - 1] = strides[d] * global_shape[d];
  const int64_t width = box.extent[rank - 1];
  const int64_t rows = width > 0 ? box.elements() / width : 0;
  return rows_checksum(rows, width, slice.data, [&](int64_t row) {
    // The row's coordinates in the box, outer dimensions, from the row number.
    uint64_t index = static_cast<uint64_t>(box.offset[rank - 1]);
    for (size_t d = rank - 1; d > 0; --d) {
      const int64_t extent = box.extent[d - 1];
      index += static_cast<uint64_t>((box.offset[d - 1] + row % extent) * strides[d - 1]);
      row /= extent;
    }
    return index;
  });
}

std::string checksum_text(uint64_t checksum) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(checksum));
  return text;
}

Fault requested_fault(const char* point) {
  const char* fault = std::getenv("MT_CHECKPOINT_FAULT");
  if (fault == nullptr) return Fault::none;
  const std::string wanted = fault, name = point;
  if (wanted == name) return Fault::error;
  if (wanted == name + ":kill") return Fault::kill;
  if (wanted == name + ":enospc") return Fault::full_disk;
  return Fault::none;
}

void fault_point(const char* point) {
  const std::string where = std::string("injected fault at ") + point;
  switch (requested_fault(point)) {
    case Fault::none:
      return;
    case Fault::error:
      throw Error("checkpoint", where + " (MT_CHECKPOINT_FAULT)");
    case Fault::kill:
      raise(SIGKILL);
      return;
    case Fault::full_disk:
      throw Error("checkpoint", where + ": " + std::strerror(ENOSPC) + " (MT_CHECKPOINT_FAULT)");
  }
}

// ---- writer ----

CheckpointWriter::CheckpointWriter(std::string path, comm::Communicator* group)
    : path_(std::move(path)), group_(group != nullptr && group->size() > 1 ? group : nullptr) {
  const Hdf5QuietErrors quiet;
  Hdf5Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!in_group()) {
    temporary_.emplace(path_);
    temporary_path_ = temporary_->path();
    reserve_headroom(0);
    // Every write goes straight to the disk, where H5Dwrite sees its error (a sieve buffer would
    // be flushed by a close whose failure HDF5 cannot undo).
    H5Pset_sieve_buf_size(access.get(), 0);
  } else {
    const MPI_Comm comm = comm::mpi_comm_of(*group_);
    if (comm == MPI_COMM_NULL) throw Error(path_, "writing a checkpoint from several ranks needs an MPI communicator");
    // Rank 0 names the temporary (and removes stale ones); every rank opens that name.
    std::string failure;
    if (group_->rank() == 0) {
      try {
        temporary_.emplace(path_);
        temporary_path_ = temporary_->path();
        reserve_headroom(headroom_bytes());
      } catch (const Error& e) {
        failure = e.what();
      }
    }
    comm::broadcast_text(*group_, failure, 0);
    if (!failure.empty()) throw Error(failure, "");
    comm::broadcast_text(*group_, temporary_path_, 0);
    H5Pset_fapl_mpio(access.get(), comm, MPI_INFO_NULL);
    // Metadata is read and written by collective calls (rank 0 writes it), not by every rank.
    H5Pset_all_coll_metadata_ops(access.get(), true);
    H5Pset_coll_metadata_write(access.get(), true);
  }
  make_room_to_create();
  file_id_ = H5Fcreate(temporary_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get());
  if (in_group()) {
    int64_t opened = file_id_ >= 0 ? 1 : 0;
    group_->all_reduce(&opened, 1, DType::i64, comm::ReduceOp::min);
    if (opened == 0) {
      abandon_file();
      throw Error(path_, "cannot create " + temporary_path_ + " on every rank");
    }
  }
  if (file_id_ < 0) throw Error(path_, "cannot create " + temporary_path_);
  writeback_fd_ = open(temporary_path_.c_str(), O_RDONLY);  // without it, the writeback starts at the fsync
}

CheckpointWriter::~CheckpointWriter() { abandon_file(); }

void CheckpointWriter::reserve_headroom(off_t keep) {
  headroom_.emplace(path_ + ".headroom");
  headroom_keep_ = keep;
  const int fd = open(headroom_->path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(path_, "cannot create " + headroom_->path() + ": " + std::strerror(errno));
  const int result = posix_fallocate(fd, 0, keep + kCreateBytes);
  close(fd);
  if (result != 0) {
    throw Error(path_, "cannot reserve " + std::to_string((keep + kCreateBytes) >> 10) +
                           " KiB of disk beside it for the save: " + std::strerror(result));
  }
}

void CheckpointWriter::make_room_to_create() {
  if (!headroom_) return;
  if (headroom_keep_ == 0 || truncate(headroom_->path().c_str(), headroom_keep_) != 0) release_headroom();
}

void CheckpointWriter::release_headroom() { headroom_.reset(); }

void CheckpointWriter::simulate_full_disk() {
  const int full = open("/dev/full", O_RDWR | O_CLOEXEC);
  if (full < 0 || !redirect_file_descriptor(static_cast<hid_t>(file_id_), full)) {
    if (full >= 0) close(full);
    throw Error("checkpoint", "MT_CHECKPOINT_FAULT=mid-tensor:enospc cannot redirect the file to /dev/full");
  }
  close(full);
}

void CheckpointWriter::abandon_file() {
  const Hdf5QuietErrors quiet;
  if (file_id_ >= 0) {
    // One process: whatever HDF5 still flushes goes to memory, so the close succeeds and leaves no
    // id. A group closes collectively (every rank here after agree()), with the headroom free for
    // the metadata it writes.
    release_headroom();
    if (in_group()) {
      H5Fclose(static_cast<hid_t>(file_id_));
    } else {
      close_abandoned_file(static_cast<hid_t>(file_id_));
    }
    file_id_ = -1;
  }
  release_headroom();
  if (writeback_fd_ >= 0) close(writeback_fd_);
  writeback_fd_ = -1;
}

void CheckpointWriter::fail(const Error& error) {
  if (!in_group()) throw error;
  if (failure_.empty()) failure_ = error.what();
}

void CheckpointWriter::agree() {
  if (!in_group()) return;
  int64_t first = failure_.empty() ? group_->size() : group_->rank();
  group_->all_reduce(&first, 1, DType::i64, comm::ReduceOp::min);
  if (first == group_->size()) return;
  std::string failure = failure_;
  comm::broadcast_text(*group_, failure, static_cast<int>(first));
  abandon_file();
  temporary_.reset();  // removes the temporary
  throw Error(failure, "");
}

void CheckpointWriter::write_tensor(const std::string& name, const std::vector<int64_t>& global_shape,
                                    const std::vector<TensorSlice>& slices, DType stored) {
  const Hdf5QuietErrors quiet;
  const std::string what = path_ + ": tensor " + name;
  int64_t total = 1, covered = 0;
  for (int64_t d : global_shape) total *= d;
  for (const TensorSlice& slice : slices) covered += slice.box.elements();
  // The dataset is made by every rank of a group (a collective call), whatever failed before.
  Hdf5Handle link_options(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(link_options.get(), 1);
  Hdf5Handle create_options(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(create_options.get(), H5D_FILL_TIME_NEVER);  // every element is written
  const std::vector<hsize_t> dims = to_hsize(global_shape);
  Hdf5Handle space(global_shape.empty() ? H5Screate(H5S_SCALAR)
                                        : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                   H5Sclose);
  Hdf5Handle file_type(stored_float_type(stored, what), H5Tclose);
  Hdf5Handle dataset(H5Dcreate2(static_cast<hid_t>(file_id_), name.c_str(), file_type.get(), space.get(),
                                link_options.get(), create_options.get(), H5P_DEFAULT),
                     H5Dclose);
  Hdf5Handle transfer(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  if (in_group()) H5Pset_dxpl_mpio(transfer.get(), H5FD_MPIO_INDEPENDENT);
  uint64_t checksum = 0;
  try {
    if (!dataset.ok()) throw Error(path_, "cannot create dataset " + name);
    for (const TensorSlice& slice : slices) check_box(what, global_shape, slice.box);
    if (!in_group() && covered != total) {
      throw Error(what, "the slices hold " + std::to_string(covered) + " of its " + std::to_string(total) + " elements");
    }
    for (size_t s = 0; failure_.empty() && s < slices.size(); ++s) {
      // Midway through the checkpoint: half the tensors written, this one half written.
      if (s == slices.size() / 2 && tensors_ > 0) {
        if (!in_group() && requested_fault("mid-tensor") == Fault::full_disk) {
          simulate_full_disk();
        } else {
          fault_point("mid-tensor");
        }
      }
      TensorSlice slice = slices[s];
      std::vector<float> rounded;  // the values as stored, when narrower than float32
      if (stored != DType::f32) {
        rounded.assign(slice.data, slice.data + slice.box.elements());
        for (float& value : rounded) {
          value = stored == DType::bf16 ? kernels::round_to_bf16(value)
                                        : kernels::fp16_bits_to_fp32(kernels::fp32_to_fp16_bits(value));
        }
        slice.data = rounded.data();
      }
      Hdf5Handle memory(select_box(space.get(), slice.box), H5Sclose);
      if (H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, memory.get(), space.get(), transfer.get(), slice.data) < 0) {
        throw Error(path_, "write of tensor " + name + " failed" + with_failure_reason(temporary_path_));
      }
      checksum += slice_checksum(global_shape, slice);
    }
    if (!in_group()) write_uint_attribute(path_, dataset.get(), "checksum", checksum);
    // The disk starts on what is written while the next tensors are prepared (asynchronous: the
    // fsync at the commit still waits for all of it).
    if (writeback_fd_ >= 0) sync_file_range(writeback_fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
  } catch (const Error& e) {
    fail(e);
  }
  // Collective in a group, so every rank closes it, whatever failed.
  if (H5Dclose(dataset.release()) < 0 && failure_.empty()) {
    fail(Error(path_, "closing tensor " + name + " failed" + with_failure_reason(temporary_path_)));
  }
  ++tensors_;
  if (!in_group()) return;
  names_.push_back(name);
  totals_.push_back(total);
  covered_.push_back(covered);
  checksums_.push_back(checksum);
  // Before the next collective HDF5 call (a rank whose write failed alone would leave the others
  // waiting in another collective inside HDF5).
  agree();
}

int64_t CheckpointWriter::commit(const CheckpointState& s) {
  const Hdf5QuietErrors quiet;
  const hid_t file = static_cast<hid_t>(file_id_);
  if (in_group()) {
    agree();
    // Every rank's element counts and checksum shares (sums mod 2^64 of their shares).
    const size_t tensors = names_.size(), ranks = static_cast<size_t>(group_->size());
    std::vector<int64_t> mine(2 * tensors), all(2 * tensors * ranks);
    for (size_t t = 0; t < tensors; ++t) {
      mine[t] = covered_[t];
      mine[tensors + t] = static_cast<int64_t>(checksums_[t]);
    }
    group_->all_gather(mine.data(), all.data(), static_cast<int64_t>(mine.size()), DType::i64);
    for (size_t t = 0; t < tensors; ++t) {
      int64_t covered = 0;
      uint64_t checksum = 0;
      for (size_t r = 0; r < ranks; ++r) {
        covered += all[r * 2 * tensors + t];
        checksum += static_cast<uint64_t>(all[r * 2 * tensors + tensors + t]);
      }
      try {
        if (covered != totals_[t]) {
          throw Error(path_ + ": tensor " + names_[t], "the slices of all ranks hold " + std::to_string(covered) +
                                                           " of its " + std::to_string(totals_[t]) + " elements");
        }
        Hdf5Handle dataset(H5Dopen2(file, names_[t].c_str(), H5P_DEFAULT), H5Dclose);
        write_uint_attribute(path_, dataset.get(), "checksum", checksum);
      } catch (const Error& e) {
        fail(e);
      }
    }
    agree();
  }
  write_string_attribute(path_, file, "mt_format", kFormat);
  write_int_attribute(path_, file, "mt_format_version", kCheckpointFormatVersion);
  write_int_attribute(path_, file, "iteration", s.iteration);
  write_int_attribute(path_, file, "consumed_train_samples", s.consumed_train_samples);
  write_int_attribute(path_, file, "consumed_valid_samples", s.consumed_valid_samples);
  write_int_attribute(path_, file, "skipped_iterations", s.skipped_iters);
  write_int_attribute(path_, file, "nan_iterations", s.nan_iters);
  write_double_attribute(path_, file, "loss_scale", s.loss_scale);
  write_int_attribute(path_, file, "loss_scale_growth_tracker", s.loss_scale_growth_tracker);
  write_int_attribute(path_, file, "loss_scale_hysteresis_tracker", s.loss_scale_hysteresis_tracker);
  write_uint_attribute(path_, file, "seed", s.seed);
  write_int_attribute(path_, file, "resumable", s.resumable ? 1 : 0);
  if (s.has_optimizer) write_int_attribute(path_, file, "optimizer_step", s.optimizer_step);
  write_string_attribute(path_, file, "model_config", s.model_config);
  write_string_attribute(path_, file, "parallel_config", s.parallel_config);
  write_string_attribute(path_, file, "train_config", s.train_config);
  if (!s.counters_origin.empty()) write_string_attribute(path_, file, "counters_origin", s.counters_origin);
  // The metadata goes to the disk with the headroom free; a failure here is agreed on before the
  // (collective) close, and the failed file is abandoned.
  release_headroom();
  try {
    if (H5Fflush(file, H5F_SCOPE_LOCAL) < 0) {
      throw Error(path_, "cannot write " + temporary_path_ + with_failure_reason(temporary_path_));
    }
  } catch (const Error& e) {
    fail(e);
  }
  agree();
  const herr_t closed = H5Fclose(file);
  const std::string close_reason = closed < 0 ? with_failure_reason(temporary_path_) : "";
  file_id_ = -1;
  abandon_file();  // the writeback descriptor
  try {
    if (closed < 0) throw Error(path_, "closing " + temporary_path_ + " failed" + close_reason);
    fault_point("before-fsync");
    // Every rank that wrote flushes its own writes (on a shared file system they are its node's).
    fsync_or_throw(temporary_path_, O_RDONLY, path_);
  } catch (const Error& e) {
    fail(e);
  }
  agree();
  int64_t bytes = 0;
  if (temporary_) {
    try {
      fault_point("before-rename");
      bytes = static_cast<int64_t>(std::filesystem::file_size(temporary_path_));
      temporary_->commit();
    } catch (const Error& e) {
      fail(e);
    }
  }
  agree();
  if (in_group()) group_->broadcast(&bytes, 1, DType::i64, 0);
  return bytes;
}

// ---- reader ----

CheckpointReader::CheckpointReader(std::string path) : path_(std::move(path)) {
  const Hdf5QuietErrors quiet;
  if (std::filesystem::is_directory(path_)) throw Error(path_, "is a directory, not a checkpoint file");
  check_input_file(path_);  // "no such file", "permission denied": not "cannot open as HDF5"
  file_id_ = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_id_ < 0) throw Error(path_, "cannot open as HDF5");
  const hid_t file = static_cast<hid_t>(file_id_);
  if (read_string_attribute(file, "mt_format").value_or("") != kFormat) throw Error(path_, "not an mt checkpoint");
  const std::optional<int64_t> version = read_int_attribute(file, "mt_format_version");
  if (!version) throw Error(path_, "attribute mt_format_version missing");
  if (*version != kCheckpointFormatVersion) {
    throw Error(path_, "mt_format_version " + std::to_string(*version) + " is not supported (this mt reads " +
                           std::to_string(kCheckpointFormatVersion) + ")");
  }
  auto integer = [&](const char* name) {
    const std::optional<int64_t> value = read_int_attribute(file, name);
    if (!value) throw Error(path_, std::string("attribute ") + name + " missing or not an integer");
    return *value;
  };
  auto text = [&](const char* name) {
    const std::optional<std::string> value = read_string_attribute(file, name);
    if (!value) throw Error(path_, std::string("attribute ") + name + " missing or not a string");
    return *value;
  };
  CheckpointState& s = state_;
  s.format_version = *version;
  s.iteration = integer("iteration");
  s.consumed_train_samples = integer("consumed_train_samples");
  s.consumed_valid_samples = integer("consumed_valid_samples");
  s.skipped_iters = integer("skipped_iterations");
  s.nan_iters = integer("nan_iterations");
  const std::optional<double> scale = read_double_attribute(file, "loss_scale");
  if (!scale) throw Error(path_, "attribute loss_scale missing or not a number");
  s.loss_scale = *scale;
  s.loss_scale_growth_tracker = integer("loss_scale_growth_tracker");
  s.loss_scale_hysteresis_tracker = integer("loss_scale_hysteresis_tracker");
  const std::optional<uint64_t> seed = read_uint_attribute(file, "seed");
  if (!seed) throw Error(path_, "attribute seed missing or not an integer");
  s.seed = *seed;
  s.resumable = integer("resumable") != 0;
  s.has_optimizer = H5Aexists(file, "optimizer_step") > 0;
  if (s.has_optimizer) s.optimizer_step = integer("optimizer_step");
  s.model_config = text("model_config");
  s.parallel_config = text("parallel_config");
  s.train_config = text("train_config");
  s.counters_origin = read_string_attribute(file, "counters_origin").value_or("");
}

CheckpointReader::~CheckpointReader() {
  const Hdf5QuietErrors quiet;
  if (file_id_ >= 0) H5Fclose(static_cast<hid_t>(file_id_));
}

std::vector<TensorInfo> CheckpointReader::tensors() const {
  const Hdf5QuietErrors quiet;
  std::vector<std::string> names;
  H5Lvisit(static_cast<hid_t>(file_id_), H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names);
  std::vector<TensorInfo> tensors;
  for (const std::string& name : names) {
    Hdf5Handle dataset(H5Dopen2(static_cast<hid_t>(file_id_), name.c_str(), H5P_DEFAULT), H5Dclose);
    Hdf5Handle space(H5Dget_space(dataset.get()), H5Sclose);
    Hdf5Handle type(H5Dget_type(dataset.get()), H5Tclose);
    TensorInfo info;
    info.name = name;
    std::vector<hsize_t> dims(static_cast<size_t>(std::max(0, H5Sget_simple_extent_ndims(space.get()))));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    info.shape.assign(dims.begin(), dims.end());
    info.dtype = stored_dtype_name(type.get());
    info.checksum = read_uint_attribute(dataset.get(), "checksum");
    info.bytes = static_cast<int64_t>(H5Dget_storage_size(dataset.get()));
    tensors.push_back(std::move(info));
  }
  return tensors;
}

bool CheckpointReader::has_tensor(const std::string& name) const {
  const Hdf5QuietErrors quiet;
  // Every group on the way must exist for H5Lexists to be asked about the next.
  size_t slash = 0;
  while ((slash = name.find('/', slash + 1)) != std::string::npos) {
    if (H5Lexists(static_cast<hid_t>(file_id_), name.substr(0, slash).c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return H5Lexists(static_cast<hid_t>(file_id_), name.c_str(), H5P_DEFAULT) > 0;
}

void CheckpointReader::read_box(const std::string& name, const std::vector<int64_t>& global_shape, const Box& box,
                                float* data) const {
  const Hdf5QuietErrors quiet;
  if (!has_tensor(name)) throw Error(path_, "tensor " + name + " missing");
  Hdf5Handle dataset(H5Dopen2(static_cast<hid_t>(file_id_), name.c_str(), H5P_DEFAULT), H5Dclose);
  Hdf5Handle type(H5Dget_type(dataset.get()), H5Tclose);
  if (!dataset.ok() || !readable_float(stored_dtype_name(type.get()))) {
    throw Error(path_, "tensor " + name + " is not float32, bfloat16 or float16");
  }
  Hdf5Handle space(H5Dget_space(dataset.get()), H5Sclose);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(0, H5Sget_simple_extent_ndims(space.get()))));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  const std::vector<int64_t> stored(dims.begin(), dims.end());
  if (stored != global_shape) {
    throw Error(path_, "tensor " + name + " has shape " + shape_text(stored) + ", the model's is " +
                           shape_text(global_shape));
  }
  check_box(path_ + ": tensor " + name, global_shape, box);
  Hdf5Handle memory(select_box(space.get(), box), H5Sclose);
  if (H5Dread(dataset.get(), H5T_NATIVE_FLOAT, memory.get(), space.get(), H5P_DEFAULT, data) < 0) {
    throw Error(path_, "read of tensor " + name + " failed");
  }
}

CheckpointReader::Scan CheckpointReader::scan(const TensorInfo& tensor) const {
  const std::vector<int64_t>& shape = tensor.shape;
  // Whole rows of the first dimension, about 16 M elements at a time.
  int64_t row = 1;
  for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
  const int64_t rows = shape.empty() ? 1 : shape[0];
  const int64_t rows_per_piece = std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(row, 1));
  std::vector<float> buffer;
  Scan result;
  for (int64_t first = 0; first < rows; first += rows_per_piece) {
    Box box;
    if (!shape.empty()) {
      box.offset.assign(shape.size(), 0);
      box.extent = shape;
      box.offset[0] = first;
      box.extent[0] = std::min(rows_per_piece, rows - first);
    }
    buffer.resize(static_cast<size_t>(box.elements()));
    read_box(tensor.name, shape, box, buffer.data());
    result.checksum += slice_checksum(shape, TensorSlice{box, buffer.data()});
    for (float value : buffer) result.nonfinite += std::isfinite(value) ? 0 : 1;
  }
  return result;
}

void CheckpointReader::verify_checksums() const {
  for (const TensorInfo& tensor : tensors()) {
    if (tensor.checksum) check_checksum(tensor, scan(tensor).checksum);
  }
}

void CheckpointReader::check_checksum(const TensorInfo& tensor, uint64_t computed) const {
  if (!tensor.checksum || computed == *tensor.checksum) return;
  throw Error(path_, "tensor " + tensor.name + ": checksum mismatch (stored " + checksum_text(*tensor.checksum) +
                         ", its values give " + checksum_text(computed) +
                         "): the file is damaged (mt-ckpt verify checks every tensor); use an earlier checkpoint");
}

// ---- directories ----

std::string tracker_path(const std::string& directory) {
  return (std::filesystem::path(directory) / kTrackerName).string();
}

std::string checkpoint_path(const std::string& directory, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return (std::filesystem::path(directory) / name / kFileName).string();
}

std::optional<std::string> find_checkpoint(const std::string& path, const std::string& subject) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  if (!std::filesystem::is_directory(path)) return path;
  if (const std::optional<int64_t> iteration = read_tracker(path)) {
    const std::string file = checkpoint_path(path, *iteration);
    if (!std::filesystem::exists(file)) {
      throw Error(subject.empty() ? path : subject,
                  "its tracker " + tracker_path(path) + " names iteration " + std::to_string(*iteration) +
                      ", but " + file + " does not exist");
    }
    return file;
  }
  const std::string in_iteration_directory = (std::filesystem::path(path) / kFileName).string();
  if (std::filesystem::exists(in_iteration_directory)) return in_iteration_directory;
  return std::nullopt;
}

std::optional<int64_t> read_tracker(const std::string& directory) {
  const std::string path = tracker_path(directory);
  if (!std::filesystem::exists(path)) return std::nullopt;
  if (std::filesystem::is_directory(path)) throw Error(path, "is a directory");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text == "release") throw Error(path, "names a release checkpoint, which mt does not write or read");
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) {
    throw Error(path, "does not hold an iteration number");
  }
  return std::stoll(text);
}

void write_tracker(const std::string& directory, int64_t iteration) {
  fault_point("before-tracker");
  const std::string path = tracker_path(directory);
  TemporaryFile temporary(path);
  {
    std::FILE* file = std::fopen(temporary.path().c_str(), "w");
    if (file == nullptr) throw Error(path, "cannot create " + temporary.path() + ": " + std::strerror(errno));
    const bool ok = std::fprintf(file, "%lld", static_cast<long long>(iteration)) > 0 && std::fflush(file) == 0 &&
                    fsync(fileno(file)) == 0;
    const bool closed = std::fclose(file) == 0;
    if (!ok || !closed) throw Error(path, "cannot write " + temporary.path());
  }
  temporary.commit();
}

std::string prepare_checkpoint_directory(const std::string& directory, int64_t iteration) {
  make_directory(directory);
  const std::string path = checkpoint_path(directory, iteration);
  make_directory(std::filesystem::path(path).parent_path().string());
  return path;
}

}  // namespace mt::io

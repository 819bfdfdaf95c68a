// Checkpoint writers compared on the same bytes: GPT-2 124M's tensors (model/layout.h's global
// shapes) three times over (parameters, Adam's two moments; about 1.5 GB of float32), each
// tensor split over the ranks by rows as a TP or distributed-optimizer layout splits it, written
// to one HDF5 file and synced to the disk three ways:
//   gather       every rank sends its rows to rank 0 (MPI_Gatherv), which writes each whole
//                tensor with serial HDF5 calls (the sec2 driver): what mt did before parallel HDF5
//   independent  parallel HDF5 (MPI-IO driver), each rank writes its hyperslab independently:
//                what io::CheckpointWriter does with a group
//   collective   the same with collective transfers (H5FD_MPIO_COLLECTIVE)
// The clock runs from a barrier before the file is created to a barrier after the ranks that
// wrote have fsynced the closed file. One JSON line per writer on stdout. Run by tests/bench/bench_checkpoint.sh
// under mpirun -np 1, 2 and 4; never by CTest (a benchmark: figures, no assertions).
// Usage: mt_bench_checkpoint_writers DIR [gather|independent|collective ...]
#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layout.h"

namespace {

struct Tensor {
  std::string name;
  std::vector<hsize_t> shape;
  hsize_t rows = 0, row_elements = 1;
};

std::vector<Tensor> gpt2_tensors() {
  const mt::model::ParamLayout layout = mt::model::build_layout(mt::model::preset("gpt2-124m"));
  std::vector<Tensor> tensors;
  for (const char* group : {"model", "exp_avg", "exp_avg_sq"}) {
    for (const mt::model::ParamEntry& entry : layout.entries) {
      Tensor t;
      t.name = std::string(group) + "/" + entry.name;
      for (int64_t d : entry.global_shape) t.shape.push_back(static_cast<hsize_t>(d));
      t.rows = t.shape[0];
      for (size_t d = 1; d < t.shape.size(); ++d) t.row_elements *= t.shape[d];
      tensors.push_back(std::move(t));
    }
  }
  return tensors;
}

// Rows [first, first + count) of a tensor that `rank` of `ranks` holds.
void my_rows(const Tensor& t, int rank, int ranks, hsize_t& first, hsize_t& count) {
  first = t.rows * static_cast<hsize_t>(rank) / static_cast<hsize_t>(ranks);
  count = t.rows * static_cast<hsize_t>(rank + 1) / static_cast<hsize_t>(ranks) - first;
}

void check(herr_t status, const char* what) {
  if (status < 0) {
    std::fprintf(stderr, "bench: %s failed\n", what);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

hid_t create_dataset(hid_t file, const Tensor& t) {
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t space = H5Screate_simple(static_cast<int>(t.shape.size()), t.shape.data(), nullptr);
  hid_t dataset = H5Dcreate2(file, t.name.c_str(), H5T_IEEE_F32LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
  check(dataset < 0 ? -1 : 0, "H5Dcreate2");
  H5Sclose(space);
  H5Pclose(lcpl);
  return dataset;
}

// Writes `count` rows starting at `first` from `data` (all rows when count == t.rows).
void write_rows(hid_t dataset, const Tensor& t, hsize_t first, hsize_t count, const float* data, hid_t transfer) {
  std::vector<hsize_t> start(t.shape.size(), 0), extent = t.shape;
  start[0] = first;
  extent[0] = count;
  hid_t file_space = H5Dget_space(dataset);
  hid_t memory_space = H5Screate_simple(static_cast<int>(extent.size()), extent.data(), nullptr);
  if (count == 0) {
    H5Sselect_none(file_space);
    H5Sselect_none(memory_space);
  } else {
    H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, extent.data(), nullptr);
  }
  check(H5Dwrite(dataset, H5T_NATIVE_FLOAT, memory_space, file_space, transfer, data), "H5Dwrite");
  H5Sclose(memory_space);
  H5Sclose(file_space);
}

double write_file(const std::string& path, const std::string& writer, const std::vector<Tensor>& tensors, int rank,
                  int ranks) {
  hsize_t largest = 0;
  for (const Tensor& t : tensors) largest = std::max(largest, t.rows * t.row_elements);
  std::vector<float> mine(largest), whole(rank == 0 ? largest : 0);
  // Random values (as trained weights and moments are): no layer below can compress or share them.
  uint64_t state = 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(rank + 1);
  for (float& value : mine) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    value = static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 - 0.5);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  const bool gather = writer == "gather";
  hid_t file = -1;
  hid_t transfer = H5Pcreate(H5P_DATASET_XFER);
  if (gather) {
    if (rank == 0) file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  } else {
    hid_t access = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_mpio(access, MPI_COMM_WORLD, MPI_INFO_NULL);
    file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access);
    H5Pclose(access);
    H5Pset_dxpl_mpio(transfer, writer == "collective" ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
  }
  for (const Tensor& t : tensors) {
    hsize_t first = 0, count = 0;
    my_rows(t, rank, ranks, first, count);
    if (gather) {
      std::vector<int> counts(static_cast<size_t>(ranks)), displacements(static_cast<size_t>(ranks));
      for (int r = 0; r < ranks; ++r) {
        hsize_t f = 0, c = 0;
        my_rows(t, r, ranks, f, c);
        counts[static_cast<size_t>(r)] = static_cast<int>(c * t.row_elements);
        displacements[static_cast<size_t>(r)] = static_cast<int>(f * t.row_elements);
      }
      MPI_Gatherv(mine.data(), static_cast<int>(count * t.row_elements), MPI_FLOAT, whole.data(), counts.data(),
                  displacements.data(), MPI_FLOAT, 0, MPI_COMM_WORLD);
      if (rank == 0) {
        hid_t dataset = create_dataset(file, t);
        write_rows(dataset, t, 0, t.rows, whole.data(), H5P_DEFAULT);
        H5Dclose(dataset);
      }
    } else {
      hid_t dataset = create_dataset(file, t);  // collective in parallel HDF5: every rank creates it
      write_rows(dataset, t, first, count, mine.data(), transfer);
      H5Dclose(dataset);
    }
  }
  H5Pclose(transfer);
  if (file >= 0) check(H5Fclose(file), "H5Fclose");
  if (rank == 0 || !gather) {  // every rank that wrote syncs, as io::CheckpointWriter does
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0 || fsync(fd) != 0) check(-1, "fsync");
    close(fd);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return MPI_Wtime() - start;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (argc < 2) {
    if (rank == 0) std::fprintf(stderr, "usage: mt_bench_checkpoint_writers DIR [gather|independent|collective ...]\n");
    MPI_Finalize();
    return 2;
  }
  std::vector<std::string> writers(argv + 2, argv + argc);
  if (writers.empty()) writers = {"gather", "independent", "collective"};
  const std::vector<Tensor> tensors = gpt2_tensors();
  double bytes = 0;
  for (const Tensor& t : tensors) bytes += 4.0 * static_cast<double>(t.rows * t.row_elements);
  for (const std::string& writer : writers) {
    const std::string path = std::string(argv[1]) + "/bench-" + writer + ".h5";
    const double seconds = write_file(path, writer, tensors, rank, ranks);
    if (rank == 0) {
      std::printf("{\"writer\":\"%s\",\"ranks\":%d,\"bytes\":%.0f,\"seconds\":%.3f,\"mb_per_s\":%.1f}\n", writer.c_str(),
                  ranks, bytes, seconds, bytes / 1e6 / seconds);
      std::fflush(stdout);
      unlink(path.c_str());
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return 0;
}

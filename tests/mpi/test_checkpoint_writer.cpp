// io::CheckpointWriter with a group of ranks (parallel HDF5, each rank writing its own hyperslabs)
// under mpirun at 2 and 3 ranks: a file written by every rank's slices reads back and checksums
// as the same tensors written by one process; a rank's bad slice, slices of all ranks that leave
// part of a tensor out, an injected fault, and one rank's full disk (issue 28 H1) each throw the
// same error on every rank, leave no file and no temporary, and do not touch the good file
// already at the path.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../unit/error_text.h"
#include "../unit/temp_dir.h"
#include "comm/communicator.h"
#include "tests/mpi/world.h"
#include "io/checkpoint.h"

using namespace mt;

namespace {

auto& g_world = mt::mpi_test::world_holder();
const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new mt::mpi_test::WorldEnvironment);

const std::vector<int64_t> kMatrix{9, 10};  // rows split over the ranks, as a TP shard is
const std::vector<int64_t> kVector{23};     // flat runs, as a distributed-optimizer shard is

std::vector<float> values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// [begin, end) of `n` for `rank` of `ranks`.
std::pair<int64_t, int64_t> part(int64_t n, int rank, int ranks) { return {n * rank / ranks, n * (rank + 1) / ranks}; }

// A directory every rank sees: rank 0's, by name.
class SharedDir {
 public:
  SharedDir() {
    if (g_world->rank() == 0) dir_ = std::make_unique<mt::testing::TempDir>("mt_test_parallel_ckpt");
    std::string path = dir_ ? dir_->path().string() : "";
    comm::broadcast_text(*g_world, path, 0);
    path_ = path;
  }
  ~SharedDir() { g_world->barrier(); }  // nobody removes it while another rank still reads it
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) names.push_back(entry.path().filename().string());
    return names;
  }

 private:
  std::unique_ptr<mt::testing::TempDir> dir_;
  std::filesystem::path path_;
};

struct Shares {
  std::vector<float> matrix = values(90, 1), vector = values(23, 2);
  std::vector<io::TensorSlice> matrix_slices, vector_slices;
};

// This rank's rows of the matrix and its flat run of the vector.
Shares my_shares() {
  Shares s;
  const int rank = g_world->rank(), ranks = g_world->size();
  const auto [first_row, end_row] = part(kMatrix[0], rank, ranks);
  if (end_row > first_row) {
    s.matrix_slices.push_back({io::Box{{first_row, 0}, {end_row - first_row, kMatrix[1]}}, s.matrix.data() + first_row * kMatrix[1]});
  }
  const auto [begin, end] = part(kVector[0], rank, ranks);
  for (const io::Box& box : io::flat_run_boxes(kVector, begin, end)) {
    s.vector_slices.push_back({box, s.vector.data() + box.offset[0]});
  }
  return s;
}

io::CheckpointState state() {
  io::CheckpointState s;
  s.iteration = 5;
  s.model_config = R"({"hidden_size":10})";
  return s;
}

// The same tensors written whole by one process: the reference.
void write_alone(const std::string& path) {
  Shares s;
  io::CheckpointWriter writer(path);
  writer.write_tensor("model/matrix", kMatrix, {{io::Box{{0, 0}, kMatrix}, s.matrix.data()}});
  writer.write_tensor("model/vector", kVector, {{io::Box{{0}, kVector}, s.vector.data()}}, DType::bf16);
  writer.commit(state());
}

TEST(ParallelCheckpointWriter, EveryRanksSlicesMakeTheFileOneProcessWrites) {
  ASSERT_GT(g_world->size(), 1) << "run under mpirun";
  SharedDir dir;
  const Shares s = my_shares();
  {
    io::CheckpointWriter writer(dir.file("parallel.h5"), g_world.get());
    writer.write_tensor("model/matrix", kMatrix, s.matrix_slices);
    writer.write_tensor("model/vector", kVector, s.vector_slices, DType::bf16);
    EXPECT_GT(writer.commit(state()), 0);
  }
  if (g_world->rank() == 0) write_alone(dir.file("alone.h5"));
  g_world->barrier();
  const io::CheckpointReader parallel(dir.file("parallel.h5")), alone(dir.file("alone.h5"));
  EXPECT_EQ(parallel.state().iteration, 5);
  const std::vector<io::TensorInfo> tensors = parallel.tensors(), reference = alone.tensors();
  ASSERT_EQ(tensors.size(), 2u);
  for (size_t t = 0; t < tensors.size(); ++t) {
    EXPECT_EQ(tensors[t].name, reference[t].name);
    EXPECT_EQ(tensors[t].dtype, reference[t].dtype);
    ASSERT_TRUE(tensors[t].checksum.has_value());
    EXPECT_EQ(*tensors[t].checksum, *reference[t].checksum) << tensors[t].name;
    EXPECT_EQ(parallel.scan(tensors[t]).checksum, *tensors[t].checksum) << tensors[t].name;
  }
  std::vector<float> matrix(90), expected(90);
  parallel.read_box("model/matrix", kMatrix, io::Box{{0, 0}, kMatrix}, matrix.data());
  alone.read_box("model/matrix", kMatrix, io::Box{{0, 0}, kMatrix}, expected.data());
  EXPECT_EQ(matrix, expected);
  std::vector<float> vector(23), expected_vector(23);
  parallel.read_box("model/vector", kVector, io::Box{{0}, kVector}, vector.data());
  alone.read_box("model/vector", kVector, io::Box{{0}, kVector}, expected_vector.data());
  EXPECT_EQ(vector, expected_vector);
  EXPECT_EQ(dir.entries().size(), 2u);  // no temporary left
}

// Writes a good file at `path` from every rank, then runs `broken` (a save of the same path that
// fails; with MT_CHECKPOINT_FAULT=`fault` when given) on every rank and checks that each threw
// `expected` and left the good file as it was.
void expect_failed_save(const std::string& expected, const std::function<void(io::CheckpointWriter&, const Shares&)>& broken,
                        const char* fault = nullptr) {
  SharedDir dir;
  const std::string path = dir.file("checkpoint.h5");
  const Shares s = my_shares();
  {
    io::CheckpointWriter writer(path, g_world.get());
    writer.write_tensor("model/matrix", kMatrix, s.matrix_slices);
    writer.write_tensor("model/vector", kVector, s.vector_slices);
    writer.commit(state());
  }
  const uint64_t good = *io::CheckpointReader(path).tensors()[0].checksum;
  g_world->barrier();
  if (fault != nullptr) setenv("MT_CHECKPOINT_FAULT", fault, 1);
  const std::string error = mt::testing::error_text([&] {
    io::CheckpointWriter writer(path, g_world.get());
    broken(writer, s);
    writer.commit(state());
  });
  unsetenv("MT_CHECKPOINT_FAULT");
  EXPECT_NE(error.find(expected), std::string::npos) << "rank " << g_world->rank() << ": " << error;
  // Every rank reports the same error.
  int64_t length = static_cast<int64_t>(error.size()), lengths[2] = {length, -length};
  g_world->all_reduce(lengths, 2, DType::i64, comm::ReduceOp::max);
  EXPECT_EQ(lengths[0], -lengths[1]);
  g_world->barrier();
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"checkpoint.h5"});  // no temporary left
  EXPECT_EQ(*io::CheckpointReader(path).tensors()[0].checksum, good);
}

TEST(ParallelCheckpointWriter, OneRanksBadSliceFailsTheSaveOnEveryRank) {
  expect_failed_save("tensor model/matrix: a slice lies outside the global shape (9, 10)", [](io::CheckpointWriter& writer, const Shares& s) {
    std::vector<io::TensorSlice> slices = s.matrix_slices;
    if (g_world->rank() == g_world->size() - 1) slices[0].box.offset[0] += 1;  // one row past the end
    writer.write_tensor("model/matrix", kMatrix, slices);
    writer.write_tensor("model/vector", kVector, s.vector_slices);
  });
}

TEST(ParallelCheckpointWriter, SlicesThatLeavePartOfATensorOutFailOnEveryRank) {
  expect_failed_save("tensor model/vector: the slices of all ranks hold", [](io::CheckpointWriter& writer, const Shares& s) {
    writer.write_tensor("model/matrix", kMatrix, s.matrix_slices);
    const bool last = g_world->rank() == g_world->size() - 1;
    writer.write_tensor("model/vector", kVector, last ? std::vector<io::TensorSlice>{} : s.vector_slices);
  });
}

TEST(ParallelCheckpointWriter, AFaultAtEachNamedPointFailsOnEveryRank) {
  for (const char* point : {"mid-tensor", "before-fsync", "before-rename"}) {
    expect_failed_save(std::string("injected fault at ") + point, [](io::CheckpointWriter& writer, const Shares& s) {
      writer.write_tensor("model/matrix", kMatrix, s.matrix_slices);
      writer.write_tensor("model/vector", kVector, s.vector_slices);
    }, point);
  }
}

// Issue 28 H1: one rank's write finds the disk full (MT_CHECKPOINT_FAULT=mid-tensor:enospc on the
// last rank only) while the others write on. The ranks agree on the status after the tensor,
// before any collective close (they used to sit in different collectives inside H5Fclose), and
// every rank throws the failing rank's error naming "No space left on device", in seconds.
TEST(ParallelCheckpointWriter, H1OneRanksFullDiskFailsEveryRankWithTheReason) {
  const auto start = std::chrono::steady_clock::now();
  expect_failed_save("No space left on device", [](io::CheckpointWriter& writer, const Shares& s) {
    if (g_world->rank() == g_world->size() - 1) setenv("MT_CHECKPOINT_FAULT", "mid-tensor:enospc", 1);
    writer.write_tensor("model/matrix", kMatrix, s.matrix_slices);
    writer.write_tensor("model/vector", kVector, s.vector_slices);
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
}

}  // namespace

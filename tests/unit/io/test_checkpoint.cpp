// Checkpoint format (io/checkpoint.h): flat runs cut into boxes, a tensor written from slices (two
// TP-like halves, or the flat runs a distributed optimizer owns) reads back and checksums as the
// whole tensor written at once, the checksum sees values and their positions, the root attributes
// round-trip, wrong files are refused with the field or tensor named (one mt::Error, no HDF5 error
// stack on stderr, and the caller's HDF5 error handler left in place), a fault at each named point
// of a save leaves the previous checkpoint and tracker as they were, a full disk (issue 28 C1) fails
// the save naming ENOSPC with no HDF5 id left open, and the tracker's format.
#include <gtest/gtest.h>

#include <hdf5.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <fstream>
#include <numeric>
#include <random>
#include <vector>

#include "../error_text.h"
#include "../temp_dir.h"
#include "core/error.h"
#include "io/checkpoint.h"

using namespace mt;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

io::Box whole(const std::vector<int64_t>& shape) { return io::Box{std::vector<int64_t>(shape.size(), 0), shape}; }

io::CheckpointState sample_state() {
  io::CheckpointState s;
  s.iteration = 12;
  s.consumed_train_samples = 48;
  s.consumed_valid_samples = 16;
  s.skipped_iters = 2;
  s.nan_iters = 1;
  s.loss_scale = 32768.0;
  s.loss_scale_growth_tracker = 7;
  s.loss_scale_hysteresis_tracker = 1;
  s.seed = 4294967295ULL;
  s.has_optimizer = true;
  s.optimizer_step = 10;
  s.model_config = R"({"hidden_size":32})";
  s.parallel_config = R"({"tensor_model_parallel_size":1})";
  s.train_config = R"({"lr":0.01})";
  return s;
}

// One 2-D tensor (6, 10) and a 1-D one (7,), written whole.
void write_small(const std::string& path, const std::vector<float>& a, const std::vector<float>& b,
                 const io::CheckpointState& state = sample_state()) {
  io::CheckpointWriter writer(path);
  writer.write_tensor("model/a.weight", {6, 10}, {io::TensorSlice{whole({6, 10}), a.data()}});
  writer.write_tensor("model/b.bias", {7}, {io::TensorSlice{whole({7}), b.data()}});
  writer.commit(state);
}

// Columns [first, last) of a row-major matrix `width` wide, row-major.
std::vector<float> columns(const std::vector<float>& values, size_t width, size_t first, size_t last) {
  std::vector<float> out;
  for (size_t row = 0; row < values.size() / width; ++row) {
    for (size_t c = first; c < last; ++c) out.push_back(values[row * width + c]);
  }
  return out;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST(CheckpointFormat, FlatRunsAreCutIntoBoxesThatCoverThemInOrder) {
  std::mt19937 rng(1);
  const std::vector<std::vector<int64_t>> shapes{{13}, {5, 7}, {3, 4, 5}, {2, 3, 2, 3}};
  for (const auto& shape : shapes) {
    const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    for (int trial = 0; trial < 200; ++trial) {
      int64_t begin = static_cast<int64_t>(rng() % static_cast<uint32_t>(n + 1));
      int64_t end = static_cast<int64_t>(rng() % static_cast<uint32_t>(n + 1));
      if (begin > end) std::swap(begin, end);
      const std::vector<io::Box> boxes = io::flat_run_boxes(shape, begin, end);
      EXPECT_LE(boxes.size(), 2 * shape.size() - 1);
      // Walk every box in row-major order: the flat indices must be begin, begin + 1, ..., end - 1.
      int64_t expected = begin;
      for (const io::Box& box : boxes) {
        ASSERT_EQ(box.offset.size(), shape.size());
        const int64_t count = box.elements();
        for (int64_t k = 0; k < count; ++k) {
          int64_t rest = k, flat = 0, stride = 1;
          for (size_t d = shape.size(); d-- > 0;) {
            const int64_t coordinate = box.offset[d] + rest % box.extent[d];
            rest /= box.extent[d];
            ASSERT_LT(coordinate, shape[d]);
            flat += coordinate * stride;
            stride *= shape[d];
          }
          ASSERT_EQ(flat, expected++) << "shape rank " << shape.size() << " run [" << begin << ", " << end << ")";
        }
      }
      EXPECT_EQ(expected, end);
    }
  }
}

// The slice path: a tensor written as two row halves (a TP split), or as the flat runs of three
// distributed-optimizer shards, reads back and checksums exactly as written whole.
TEST(CheckpointFormat, ATensorWrittenFromSlicesEqualsItWrittenWhole) {
  mt::testing::TempDir dir("mt_test_ckpt_slices");
  const std::vector<int64_t> shape{6, 10};
  const std::vector<float> values = random_values(60, 2);
  const std::vector<float> bias = random_values(7, 3);
  write_small(dir.file("whole.h5"), values, bias);

  {
    io::CheckpointWriter writer(dir.file("halves.h5"));
    writer.write_tensor("model/a.weight", shape,
                        {io::TensorSlice{io::Box{{3, 0}, {3, 10}}, values.data() + 30},
                         io::TensorSlice{io::Box{{0, 0}, {3, 10}}, values.data()}});
    writer.write_tensor("model/b.bias", {7},
                        {io::TensorSlice{io::Box{{0}, {4}}, bias.data()}, io::TensorSlice{io::Box{{4}, {3}}, bias.data() + 4}});
    writer.commit(sample_state());
  }
  {
    io::CheckpointWriter writer(dir.file("runs.h5"));
    std::vector<io::TensorSlice> slices;
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 17}, {17, 43}, {43, 60}}) {
      const float* data = values.data() + begin;
      for (const io::Box& box : io::flat_run_boxes(shape, begin, end)) {
        slices.push_back(io::TensorSlice{box, data});
        data += box.elements();
      }
    }
    writer.write_tensor("model/a.weight", shape, slices);
    writer.write_tensor("model/b.bias", {7}, {io::TensorSlice{whole({7}), bias.data()}});
    writer.commit(sample_state());
  }
  const io::CheckpointReader reference(dir.file("whole.h5"));
  const std::vector<io::TensorInfo> expected = reference.tensors();
  ASSERT_EQ(expected.size(), 2u);
  EXPECT_EQ(expected[0].name, "model/a.weight");
  EXPECT_EQ(expected[0].dtype, "float32");
  EXPECT_EQ(expected[0].bytes, 240);
  for (const char* name : {"halves.h5", "runs.h5"}) {
    const io::CheckpointReader reader(dir.file(name));
    const std::vector<io::TensorInfo> tensors = reader.tensors();
    ASSERT_EQ(tensors.size(), expected.size()) << name;
    for (size_t t = 0; t < tensors.size(); ++t) {
      EXPECT_EQ(tensors[t].name, expected[t].name);
      EXPECT_EQ(tensors[t].shape, expected[t].shape);
      ASSERT_TRUE(tensors[t].checksum.has_value());
      EXPECT_EQ(*tensors[t].checksum, *expected[t].checksum) << name << " " << tensors[t].name;
      EXPECT_EQ(reader.scan(tensors[t]).checksum, *tensors[t].checksum);
      EXPECT_EQ(reader.scan(tensors[t]).nonfinite, 0);
    }
    std::vector<float> back(60);
    reader.read_box("model/a.weight", shape, whole(shape), back.data());
    EXPECT_EQ(back, values) << name;
    // A box in the middle reads its own values.
    std::vector<float> middle(6);
    reader.read_box("model/a.weight", shape, io::Box{{2, 4}, {2, 3}}, middle.data());
    EXPECT_EQ(middle, (std::vector<float>{values[24], values[25], values[26], values[34], values[35], values[36]}));
  }
  // Slices that leave part of the tensor out are refused, naming it.
  io::CheckpointWriter partial(dir.file("partial.h5"));
  EXPECT_NE(mt::testing::error_text([&] {
              partial.write_tensor("model/a.weight", shape, {io::TensorSlice{io::Box{{0, 0}, {3, 10}}, values.data()}});
            }).find("tensor model/a.weight: the slices hold 30 of its 60 elements"),
            std::string::npos);
}

TEST(CheckpointFormat, TheChecksumSeesEveryValueAndItsPosition) {
  const std::vector<int64_t> shape{4, 5};
  std::vector<float> values = random_values(20, 4);
  const uint64_t base = io::slice_checksum(shape, io::TensorSlice{whole(shape), values.data()});
  std::vector<float> changed = values;
  changed[13] = std::nextafter(changed[13], 1e9f);  // one ulp
  EXPECT_NE(io::slice_checksum(shape, io::TensorSlice{whole(shape), changed.data()}), base);
  std::vector<float> swapped = values;
  std::swap(swapped[3], swapped[4]);
  EXPECT_NE(io::slice_checksum(shape, io::TensorSlice{whole(shape), swapped.data()}), base);
  // The shares of a split add up (mod 2^64) to the whole's checksum.
  const uint64_t top = io::slice_checksum(shape, io::TensorSlice{io::Box{{0, 0}, {4, 2}}, columns(values, 5, 0, 2).data()});
  const uint64_t bottom = io::slice_checksum(shape, io::TensorSlice{io::Box{{0, 2}, {4, 3}}, columns(values, 5, 2, 5).data()});
  EXPECT_EQ(top + bottom, base);
}

TEST(CheckpointFormat, AScanCountsNonFiniteValues) {
  mt::testing::TempDir dir("mt_test_ckpt_scan");
  std::vector<float> a = random_values(60, 12);
  a[7] = std::numeric_limits<float>::quiet_NaN();
  a[59] = -std::numeric_limits<float>::infinity();
  write_small(dir.file("c.h5"), a, random_values(7, 13));
  const io::CheckpointReader reader(dir.file("c.h5"));
  const std::vector<io::TensorInfo> tensors = reader.tensors();
  EXPECT_EQ(reader.scan(tensors[0]).nonfinite, 2);
  EXPECT_EQ(reader.scan(tensors[0]).checksum, *tensors[0].checksum);
  EXPECT_EQ(reader.scan(tensors[1]).nonfinite, 0);
}

TEST(CheckpointFormat, RootAttributesRoundTrip) {
  mt::testing::TempDir dir("mt_test_ckpt_state");
  write_small(dir.file("c.h5"), random_values(60, 5), random_values(7, 6));
  const io::CheckpointReader reader(dir.file("c.h5"));
  const io::CheckpointState& s = reader.state();
  const io::CheckpointState expected = sample_state();
  EXPECT_EQ(s.format_version, io::kCheckpointFormatVersion);
  EXPECT_EQ(s.iteration, expected.iteration);
  EXPECT_EQ(s.consumed_train_samples, expected.consumed_train_samples);
  EXPECT_EQ(s.consumed_valid_samples, expected.consumed_valid_samples);
  EXPECT_EQ(s.skipped_iters, expected.skipped_iters);
  EXPECT_EQ(s.nan_iters, expected.nan_iters);
  EXPECT_EQ(s.loss_scale, expected.loss_scale);
  EXPECT_EQ(s.loss_scale_growth_tracker, expected.loss_scale_growth_tracker);
  EXPECT_EQ(s.loss_scale_hysteresis_tracker, expected.loss_scale_hysteresis_tracker);
  EXPECT_EQ(s.seed, expected.seed);
  EXPECT_TRUE(s.has_optimizer);
  EXPECT_EQ(s.optimizer_step, expected.optimizer_step);
  EXPECT_TRUE(s.resumable);
  EXPECT_EQ(s.model_config, expected.model_config);
  EXPECT_EQ(s.parallel_config, expected.parallel_config);
  EXPECT_EQ(s.train_config, expected.train_config);
  io::CheckpointState parameters_only = expected;
  parameters_only.has_optimizer = false;
  parameters_only.resumable = false;
  write_small(dir.file("p.h5"), random_values(60, 5), random_values(7, 6), parameters_only);
  const io::CheckpointReader params(dir.file("p.h5"));
  EXPECT_FALSE(params.state().has_optimizer);
  EXPECT_FALSE(params.state().resumable);
}

TEST(CheckpointFormat, WrongFilesAreRefusedNamingTheFieldOrTensor) {
  mt::testing::TempDir dir("mt_test_ckpt_refuse");
  const std::string path = dir.file("c.h5");
  write_small(path, random_values(60, 7), random_values(7, 8));
  const io::CheckpointReader reader(path);
  std::vector<float> buffer(60);
  EXPECT_NE(mt::testing::error_text([&] { reader.read_box("model/missing.weight", {6, 10}, whole({6, 10}), buffer.data()); })
                .find("tensor model/missing.weight missing"),
            std::string::npos);
  EXPECT_NE(mt::testing::error_text([&] { reader.read_box("optimizer/exp_avg/a.weight", {6, 10}, whole({6, 10}), buffer.data()); })
                .find("tensor optimizer/exp_avg/a.weight missing"),
            std::string::npos);
  EXPECT_NE(mt::testing::error_text([&] { reader.read_box("model/a.weight", {10, 6}, whole({10, 6}), buffer.data()); })
                .find("tensor model/a.weight has shape (6, 10), the model's is (10, 6)"),
            std::string::npos);

  // Hand-made files: another dtype, another format version, not a checkpoint at all.
  auto edit = [&](const std::string& copy, const std::function<void(hid_t)>& change) {
    std::filesystem::copy_file(path, copy);
    const hid_t file = H5Fopen(copy.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    change(file);
    H5Fclose(file);
  };
  const std::string doubles = dir.file("doubles.h5");
  edit(doubles, [](hid_t file) {
    const hsize_t dims[1] = {7};
    H5Ldelete(file, "model/b.bias", H5P_DEFAULT);
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    H5Dclose(H5Dcreate2(file, "model/b.bias", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Sclose(space);
  });
  EXPECT_NE(mt::testing::error_text([&] { io::CheckpointReader(doubles).read_box("model/b.bias", {7}, whole({7}), buffer.data()); })
                .find("tensor model/b.bias is not float32"),
            std::string::npos);
  const std::string future = dir.file("future.h5");
  edit(future, [](hid_t file) {
    const int64_t version = 3;
    const hid_t attribute = H5Aopen(file, "mt_format_version", H5P_DEFAULT);
    H5Awrite(attribute, H5T_NATIVE_INT64, &version);
    H5Aclose(attribute);
  });
  EXPECT_NE(mt::testing::error_text([&] { io::CheckpointReader{future}; }).find("mt_format_version 3 is not supported"),
            std::string::npos);
  const std::string no_iteration = dir.file("no_iteration.h5");
  edit(no_iteration, [](hid_t file) { H5Adelete(file, "iteration"); });
  EXPECT_NE(mt::testing::error_text([&] { io::CheckpointReader{no_iteration}; }).find("attribute iteration missing"), std::string::npos);
  const std::string text = dir.file("text.h5");
  std::ofstream(text) << "not hdf5";
  EXPECT_NE(mt::testing::error_text([&] { io::CheckpointReader{text}; }).find("cannot open as HDF5"), std::string::npos);
  EXPECT_NE(mt::testing::error_text([&] { io::CheckpointReader{dir.path().string()}; }).find("is a directory"), std::string::npos);
}

// HDF5's error printing is kept quiet only inside mt's calls: a failed read prints nothing but
// the mt::Error, and the handler the caller had (HDF5's default printer here) is in place after
// every call, successful or not.
TEST(CheckpointFormat, HdfErrorsAreQuietInsideMtCallsOnly) {
  mt::testing::TempDir dir("mt_test_ckpt_quiet");
  H5E_auto2_t before = nullptr;
  void* before_data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &before, &before_data);
  ASSERT_NE(before, nullptr) << "HDF5's default handler prints errors";
  const std::string path = dir.file("c.h5");
  write_small(path, random_values(60, 1), random_values(7, 2));
  {
    std::ofstream(dir.file("not.h5")) << "not an HDF5 file";
    ::testing::internal::CaptureStderr();
    EXPECT_THROW(io::CheckpointReader(dir.file("not.h5")), Error);
    io::CheckpointReader reader(path);
    std::vector<float> values(60);
    EXPECT_THROW(reader.read_box("model/missing.weight", {6, 10}, whole({6, 10}), values.data()), Error);
    reader.read_box("model/a.weight", {6, 10}, whole({6, 10}), values.data());
    EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  }
  H5E_auto2_t after = nullptr;
  void* after_data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &after, &after_data);
  EXPECT_EQ(after, before);
  EXPECT_EQ(after_data, before_data);
}

TEST(CheckpointFormat, TheTrackerHoldsAnIterationAndNothingElse) {
  mt::testing::TempDir dir("mt_test_ckpt_tracker");
  const std::string d = dir.path().string();
  EXPECT_EQ(io::read_tracker(d), std::nullopt);
  io::write_tracker(d, 1234);
  EXPECT_EQ(file_text(io::tracker_path(d)), "1234");
  EXPECT_EQ(io::read_tracker(d), 1234);
  EXPECT_EQ(io::checkpoint_path(d, 5), d + "/iter_0000005/checkpoint.h5");
  std::ofstream(io::tracker_path(d)) << "release\n";
  EXPECT_NE(mt::testing::error_text([&] { io::read_tracker(d); }).find("release"), std::string::npos);
  std::ofstream(io::tracker_path(d)) << "12x";
  EXPECT_NE(mt::testing::error_text([&] { io::read_tracker(d); }).find("does not hold an iteration number"), std::string::npos);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"latest_checkpointed_iteration.txt"}) << "no temporaries left";
}

// Issue 28 U3: a checkpoint named in any of its three forms (the --save directory through its
// tracker, an iteration directory, the file itself) is the same file; a directory holding neither is
// no checkpoint, and a tracker naming a missing file is an error said of the caller's subject.
TEST(CheckpointFormat, FindCheckpointTakesTheSaveDirectoryAnIterationDirectoryAndTheFile) {
  mt::testing::TempDir dir("mt_test_ckpt_find");
  const std::string d = dir.path().string();
  EXPECT_EQ(io::find_checkpoint(d), std::nullopt);
  EXPECT_EQ(io::find_checkpoint(d + "/nonexistent"), std::nullopt);
  const std::string file = io::prepare_checkpoint_directory(d, 20);
  std::ofstream(file) << "stands for a checkpoint";
  EXPECT_EQ(io::find_checkpoint(d), std::nullopt) << "no tracker yet";
  io::write_tracker(d, 20);
  EXPECT_EQ(io::find_checkpoint(d), file);
  EXPECT_EQ(io::find_checkpoint(d + "/iter_0000020"), d + "/iter_0000020/checkpoint.h5");
  EXPECT_EQ(io::find_checkpoint(file), file);
  io::write_tracker(d, 30);
  const std::string error = mt::testing::error_text([&] { io::find_checkpoint(d, "--load " + d); });
  EXPECT_EQ(error.rfind("--load " + d + ": its tracker", 0), 0u) << error;
  EXPECT_NE(error.find("iter_0000030/checkpoint.h5 does not exist"), std::string::npos) << error;
}

// Issue 28 C1: a save whose writes find the disk full (MT_CHECKPOINT_FAULT=mid-tensor:enospc sends
// HDF5's writes to /dev/full from the middle of the second tensor on) throws one error naming "No
// space left on device", leaves no temporary (nor the headroom file) and no HDF5 object open: a
// failed close used to leave the file's id registered, and HDF5's exit handler closed it again
// (SIGSEGV after the run). The previous checkpoint stays; the next save succeeds.
TEST(CheckpointFormat, C1AFullDiskFailsTheSaveWithItsReasonAndLeavesNoHdf5IdOpen) {
  mt::testing::TempDir dir("mt_test_ckpt_enospc");
  const std::string d = dir.path().string();
  const std::vector<float> a = random_values(60, 9), b = random_values(7, 10);
  const std::string good = io::prepare_checkpoint_directory(d, 5);
  write_small(good, a, b);
  const std::string good_bytes = file_text(good);
  const ssize_t open_before = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);

  ::setenv("MT_CHECKPOINT_FAULT", "mid-tensor:enospc", 1);
  const std::string later = io::prepare_checkpoint_directory(d, 10);
  const std::string error = mt::testing::error_text([&] { write_small(later, a, b); });
  ::unsetenv("MT_CHECKPOINT_FAULT");
  EXPECT_NE(error.find("No space left on device"), std::string::npos) << error;
  EXPECT_NE(error.find("model/b.bias"), std::string::npos) << "names the tensor whose write failed: " << error;
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), open_before) << "an HDF5 id of the failed file is left";
  EXPECT_FALSE(std::filesystem::exists(later));
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << entry.path();
  }
  EXPECT_TRUE(file_text(good) == good_bytes);
  write_small(later, a, b);
  EXPECT_EQ(io::CheckpointReader(later).state().iteration, sample_state().iteration);
}

// A save that fails at any named point (MT_CHECKPOINT_FAULT) throws, leaves no temporary, and the
// previous checkpoint and the tracker pointing at it are untouched.
TEST(CheckpointFormat, AFaultAtAnyPointOfASaveKeepsThePreviousCheckpoint) {
  mt::testing::TempDir dir("mt_test_ckpt_fault");
  const std::string d = dir.path().string();
  const std::vector<float> a = random_values(60, 9), b = random_values(7, 10);
  const std::string good = io::prepare_checkpoint_directory(d, 5);
  write_small(good, a, b);
  io::write_tracker(d, 5);
  const std::string good_bytes = file_text(good);

  for (const char* point : {"mid-tensor", "before-fsync", "before-rename", "before-tracker"}) {
    ::setenv("MT_CHECKPOINT_FAULT", point, 1);
    const std::vector<float> other = random_values(60, 11);
    // The same iteration (a rewrite over the good file) and a later one; a rewrite that fails only
    // at the tracker has replaced the file with a complete one, so that case is the later one only.
    const bool at_tracker = std::string(point) == "before-tracker";
    for (int64_t iteration : {int64_t{5}, int64_t{10}}) {
      if (at_tracker && iteration == 5) continue;
      const std::string error = mt::testing::error_text([&] {
        const std::string path = io::prepare_checkpoint_directory(d, iteration);
        write_small(path, other, b);
        io::write_tracker(d, iteration);
      });
      EXPECT_NE(error.find(std::string("injected fault at ") + point), std::string::npos) << error;
      EXPECT_EQ(io::read_tracker(d), 5) << point;
      EXPECT_TRUE(file_text(good) == good_bytes) << point << ": the good checkpoint was modified";
      for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path())) {
        EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos)
            << point << ": temporary left behind: " << entry.path();
      }
    }
    // Only a fault before the tracker leaves the later checkpoint itself complete (not named).
    EXPECT_EQ(std::filesystem::exists(io::checkpoint_path(d, 10)), at_tracker) << point;
    std::filesystem::remove_all(dir.path() / "iter_0000010");
  }
  ::unsetenv("MT_CHECKPOINT_FAULT");
  const io::CheckpointReader reader(good);
  std::vector<float> back(60);
  reader.read_box("model/a.weight", {6, 10}, whole({6, 10}), back.data());
  EXPECT_EQ(back, a);
}

// Tests for lib/data/megatron_indices.{h,cpp}: numpy's RandomState, split bounds, GPTDataset and
// blending indices. Expected values come from tests/data/megatron_index_cases.h5, written by
// tests/data/make_index_cases.py with the numpy oracle tests/data/megatron_oracle.py, plus a
// few cases worked out by hand. Every array is compared value by value and dtype by dtype.
#include "data/megatron_indices.h"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/hdf5_attributes.h"

namespace mt::data {
namespace {

// MT_MEGATRON_INDEX_CASES points the suite at another file from make_index_cases.py (a larger
// run by hand); the committed fixture otherwise.
std::string cases_path() {
  const char* path = std::getenv("MT_MEGATRON_INDEX_CASES");
  return path && *path ? path : std::string(MT_SOURCE_DIR) + "/tests/data/megatron_index_cases.h5";
}

// One HDF5 dataset read into int64 / uint64 / double storage with its numpy dtype name.
struct Array {
  std::string dtype;
  std::vector<hsize_t> dims;
  std::vector<int64_t> i64;
  std::vector<uint64_t> u64;
  std::vector<double> f64;
  size_t size() const { return dtype == "float64" ? f64.size() : dtype == "uint64" ? u64.size() : i64.size(); }
};

// An HDF5 handle on the fixture: a failed open fails the test instead of passing -1 along.
class H5Object : public mt::io::Hdf5Handle {
 public:
  H5Object(hid_t id, herr_t (*close)(hid_t)) : mt::io::Hdf5Handle(id, close) {
    if (!ok()) throw std::runtime_error("HDF5 call failed");
  }
  hid_t id() const { return get(); }
};

std::string dtype_name(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) return "float" + std::to_string(8 * size);
  const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
  return std::string(is_signed ? "int" : "uint") + std::to_string(8 * size);
}

bool exists(hid_t group, const std::string& name) { return H5Lexists(group, name.c_str(), H5P_DEFAULT) > 0; }

Array read_array(hid_t group, const std::string& name) {
  H5Object dataset(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose);
  H5Object type(H5Dget_type(dataset.id()), H5Tclose);
  H5Object space(H5Dget_space(dataset.id()), H5Sclose);
  Array array;
  array.dtype = dtype_name(type.id());
  const int rank = H5Sget_simple_extent_ndims(space.id());
  array.dims.resize(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.id(), array.dims.data(), nullptr);
  const auto count = static_cast<size_t>(H5Sget_simple_extent_npoints(space.id()));
  herr_t status;
  if (array.dtype == "float64") {
    array.f64.resize(count);
    status = H5Dread(dataset.id(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, array.f64.data());
  } else if (array.dtype == "uint64") {
    array.u64.resize(count);
    status = H5Dread(dataset.id(), H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, array.u64.data());
  } else {
    array.i64.resize(count);
    status = H5Dread(dataset.id(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, array.i64.data());
  }
  if (status < 0) throw std::runtime_error("cannot read " + name);
  return array;
}

int64_t read_attr(hid_t object, const std::string& name) {
  H5Object attr(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose);
  int64_t value = 0;
  if (H5Aread(attr.id(), H5T_NATIVE_INT64, &value) < 0) throw std::runtime_error("cannot read attribute " + name);
  return value;
}

std::vector<int64_t> read_attr_vector(hid_t object, const std::string& name) {
  H5Object attr(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose);
  H5Object space(H5Aget_space(attr.id()), H5Sclose);
  std::vector<int64_t> values(static_cast<size_t>(H5Sget_simple_extent_npoints(space.id())));
  H5Aread(attr.id(), H5T_NATIVE_INT64, values.data());
  return values;
}

std::string read_string(hid_t group, const std::string& name) {
  const Array bytes = read_array(group, name);
  return std::string(bytes.i64.begin(), bytes.i64.end());
}

std::vector<int32_t> to_int32(const Array& array) { return std::vector<int32_t>(array.i64.begin(), array.i64.end()); }

template <class T>
std::vector<int64_t> widen(const std::vector<T>& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

template <class... T>
std::vector<int64_t> widen(const std::variant<T...>& values) {
  return std::visit([](const auto& v) { return widen(v); }, values);
}

class Fixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    file_ = H5Fopen(cases_path().c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file_, 0) << cases_path() << " (regenerate with tests/data/make_index_cases.py)";
  }
  static void TearDownTestSuite() { H5Fclose(file_); }
  static hid_t file_;
};
hid_t Fixture::file_ = -1;

std::string case_name(int64_t k) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "case_%03lld", static_cast<long long>(k));
  return buffer;
}

// ---- numpy RandomState ---------------------------------------------------------------------

TEST(NumpyRandomState, FirstOutputsOfSeed1234) {
  // numpy.random.RandomState(1234).randint(0, 2**32, size=4, dtype=numpy.uint64)
  NumpyRandomState random(1234);
  EXPECT_EQ(random.next_uint32(), 822569775u);
  EXPECT_EQ(random.next_uint32(), 2137449171u);
  EXPECT_EQ(random.next_uint32(), 2671936806u);
  EXPECT_EQ(random.next_uint32(), 3512589365u);
}

TEST(NumpyRandomState, ShuffleOfTenWithSeed0) {
  // x = numpy.arange(10); numpy.random.RandomState(0).shuffle(x)
  std::vector<int32_t> x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  NumpyRandomState random(0);
  random.shuffle(std::span<int32_t>(x));
  EXPECT_EQ(x, (std::vector<int32_t>{2, 8, 4, 9, 1, 6, 7, 3, 0, 5}));
}

TEST_F(Fixture, RandomStateMatchesNumpy) {
  H5Object group(H5Gopen2(file_, "rng", H5P_DEFAULT), H5Gclose);
  const int64_t count = read_attr(group.id(), "count");
  ASSERT_GT(count, 0);
  for (int64_t k = 0; k < count; ++k) {
    H5Object c(H5Gopen2(group.id(), case_name(k).c_str(), H5P_DEFAULT), H5Gclose);
    const auto seed = static_cast<uint32_t>(read_attr(c.id(), "seed"));
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Array raw = read_array(c.id(), "raw32");
    NumpyRandomState random(seed);
    for (size_t i = 0; i < raw.size(); ++i) ASSERT_EQ(random.next_uint32(), static_cast<uint64_t>(raw.i64[i])) << i;

    const Array maxima = read_array(c.id(), "interval_max");
    const Array values = read_array(c.id(), "interval");
    NumpyRandomState bounded(seed);
    for (size_t i = 0; i < maxima.size(); ++i) EXPECT_EQ(bounded.interval(maxima.u64[i]), values.u64[i]) << i;

    const std::vector<int64_t> sizes = read_attr_vector(c.id(), "shuffle_sizes");
    NumpyRandomState shuffler(seed);
    for (size_t j = 0; j < sizes.size(); ++j) {
      std::vector<int64_t> x(static_cast<size_t>(sizes[j]));
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int64_t>(i);
      shuffler.shuffle(std::span<int64_t>(x));
      EXPECT_EQ(x, read_array(c.id(), "shuffle_" + std::to_string(j)).i64) << "shuffle " << j;
    }
  }
}

// ---- splits --------------------------------------------------------------------------------

TEST(Split, ParseAndMatrix) {
  const auto split = parse_split("969,30,1");
  EXPECT_DOUBLE_EQ(split[0], 0.969);
  EXPECT_DOUBLE_EQ(split[1], 0.030);
  EXPECT_DOUBLE_EQ(split[2], 0.001);
  EXPECT_EQ(parse_split("99/1")[2], 0.0);
  const auto matrix = split_matrix(parse_split("98,0,2"));
  EXPECT_TRUE(matrix[0].has_value());
  EXPECT_FALSE(matrix[1].has_value());
  EXPECT_TRUE(matrix[2].has_value());
}

TEST(Split, HandCheckedBounds) {
  auto r = split_ranges("969,30,1", 1000);
  EXPECT_EQ(r[0], (SequenceRange{0, 969}));
  EXPECT_EQ(r[1], (SequenceRange{969, 999}));
  EXPECT_EQ(r[2], (SequenceRange{999, 1000}));
  // 9.69 -> 10 and 9.99 -> 10: valid and test are present but empty.
  r = split_ranges("969,30,1", 10);
  EXPECT_EQ(r[0], (SequenceRange{0, 10}));
  EXPECT_EQ(r[1]->size(), 0);
  EXPECT_EQ(r[2]->size(), 0);
  // Python's round: half to even (2.5 -> 2, 3.5 -> 4).
  EXPECT_EQ(split_ranges("1,1", 5)[0], (SequenceRange{0, 2}));
  EXPECT_EQ(split_ranges("1,1", 7)[0], (SequenceRange{0, 4}));
  EXPECT_FALSE(split_ranges("1,1", 7)[2].has_value());
}

TEST(Split, Errors) {
  EXPECT_THROW(parse_split("0,0,0"), UsageError);
  EXPECT_THROW(parse_split(""), UsageError);
  EXPECT_THROW(parse_split("1,2,3,4"), UsageError);
  EXPECT_THROW(parse_split("1.2.3,1"), UsageError);
  EXPECT_THROW(split_ranges("1,1,1", int64_t{1} << 32), Error);
}

namespace {
const std::string kSplitHint = " (expected up to three proportions for train, valid, test, such as 969,30,1)";

std::string split_error(const std::string& split) {
  try {
    parse_split(split);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "accepted";
}
}  // namespace

// Issue 11 case 12: strings Megatron's regex reads as other numbers are refused, not guessed;
// case 15: the message says what is wrong with the string given.
TEST(Issue11Case12, SplitStringsThatAreNotProportionsAreRefused) {
  EXPECT_EQ(split_error("-1,2,3"), "--split: '-1,2,3': '-1' is negative" + kSplitHint);
  EXPECT_EQ(split_error("nan,1,1"), "--split: 'nan,1,1': 'nan' is not a number" + kSplitHint);
  EXPECT_EQ(split_error("inf,1,1"), "--split: 'inf,1,1': 'inf' is not a number" + kSplitHint);
  EXPECT_EQ(split_error("1,,1"), "--split: '1,,1': part 2 is empty" + kSplitHint);
  EXPECT_EQ(split_error("1,2,"), "--split: '1,2,': part 3 is empty" + kSplitHint);
  EXPECT_EQ(split_error("+1,2"), "--split: '+1,2': '+1' is not a number" + kSplitHint);
  EXPECT_EQ(split_error("1.2.3,1"), "--split: '1.2.3,1': '1.2.3' is not a number" + kSplitHint);
  EXPECT_EQ(split_error(""), "--split: '': no proportions" + kSplitHint);
  EXPECT_EQ(split_error("1,2/3"), "--split: '1,2/3': mixes ',' and '/'" + kSplitHint);
  const std::array<double, 3> expected = {0.8, 0.1, 0.1};
  for (const char* good : {"80,10,10", "80, 10, 10", " 80 ,10,10 ", "80/10/10", "80 10 10", "8.0,1,1.", "80,10,10"}) {
    EXPECT_EQ(parse_split(good), expected) << good;
  }
  EXPECT_EQ(parse_split("1"), (std::array<double, 3>{1.0, 0.0, 0.0}));
  EXPECT_EQ(parse_split(".5,.5"), (std::array<double, 3>{0.5, 0.5, 0.0}));
}

TEST(Issue11Case15, SplitErrorsSayWhatIsWrong) {
  EXPECT_EQ(split_error("a,b,c"), "--split: 'a,b,c': 'a' is not a number" + kSplitHint);
  EXPECT_EQ(split_error("1e3,1,1"), "--split: '1e3,1,1': '1e3' has an exponent; write the number out" + kSplitHint);
  EXPECT_EQ(split_error("1,2,3,4"), "--split: '1,2,3,4': 4 parts, at most three" + kSplitHint);
  EXPECT_EQ(split_error("0,0,0"), "--split: '0,0,0': the parts sum to zero" + kSplitHint);
}

TEST_F(Fixture, SplitBoundsMatchMegatron) {
  H5Object group(H5Gopen2(file_, "split", H5P_DEFAULT), H5Gclose);
  const int64_t count = read_attr(group.id(), "count");
  ASSERT_GT(count, 0);
  for (int64_t k = 0; k < count; ++k) {
    H5Object c(H5Gopen2(group.id(), case_name(k).c_str(), H5P_DEFAULT), H5Gclose);
    const std::string split = read_string(c.id(), "split");
    const int64_t n = read_attr(c.id(), "num_elements");
    const Array expected = read_array(c.id(), "ranges");
    const auto ranges = split_ranges(split, n);
    for (size_t i = 0; i < 3; ++i) {
      SCOPED_TRACE(split + " n=" + std::to_string(n) + " split " + std::to_string(i));
      if (expected.i64[2 * i] < 0) {
        EXPECT_FALSE(ranges[i].has_value());
      } else {
        ASSERT_TRUE(ranges[i].has_value());
        EXPECT_EQ(ranges[i]->begin, expected.i64[2 * i]);
        EXPECT_EQ(ranges[i]->end, expected.i64[2 * i + 1]);
      }
    }
  }
}

// ---- GPTDataset ----------------------------------------------------------------------------

TEST(GptIndices, HandCheckedSampleIndex) {
  // Two sequences of 5 tokens, samples of 4 + 1 tokens: (10 - 1) / 4 = 2 samples, the second
  // starting at the last token of the first sequence; equal lengths make the shuffle irrelevant.
  const std::vector<int32_t> lengths = {5, 5};
  GptIndexConfig config;
  config.seq_length = 4;
  config.seed = 1234;
  const GptIndices out = build_gpt_indices(lengths, {0, 2}, config);
  EXPECT_EQ(out.num_epochs, 1);
  EXPECT_EQ(out.num_tokens_per_epoch, 10);
  EXPECT_EQ(out.sample_index_dtype(), "int32");
  EXPECT_EQ(out.shuffle_index_dtype(), "uint32");
  EXPECT_EQ(widen(out.sample_index), (std::vector<int64_t>{0, 0, 0, 4, 1, 3}));
  EXPECT_EQ(out.num_samples(), 2);
  std::vector<int32_t> sorted = out.document_index;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int32_t>{0, 1}));
}

TEST(GptIndices, EpochsAndSeparateFinalEpoch) {
  // 100 sequences of 10 tokens, 1000 tokens per epoch, seq 10: 99 samples per epoch. 150
  // samples need 1501 tokens: 2 epochs; the final epoch gives 150 - 99 = 51 < int(0.8 * 99).
  const std::vector<int32_t> lengths(100, 10);
  GptIndexConfig config;
  config.seq_length = 10;
  config.num_samples = 150;
  const GptIndices out = build_gpt_indices(lengths, {0, 100}, config);
  EXPECT_EQ(out.num_epochs, 2);
  EXPECT_TRUE(out.separate_final_epoch);
  EXPECT_EQ(out.num_samples_sans_final_epoch, 99);
  EXPECT_EQ(out.document_index.size(), 200u);
  EXPECT_EQ(out.num_samples(), 199);
  for (int64_t i = 0; i < 99; ++i) EXPECT_LT(out.shuffled(i), 99);
  for (int64_t i = 99; i < 199; ++i) EXPECT_GE(out.shuffled(i), 99);
  // Each half of the document index is one epoch.
  std::vector<int32_t> last(out.document_index.begin() + 100, out.document_index.end());
  std::sort(last.begin(), last.end());
  for (int32_t i = 0; i < 100; ++i) EXPECT_EQ(last[static_cast<size_t>(i)], i);
}

TEST(GptIndices, Errors) {
  const std::vector<int32_t> lengths = {5, 0, 7};
  GptIndexConfig config;
  config.seq_length = 4;
  EXPECT_THROW(build_gpt_indices(lengths, {1, 1}, config), Error);  // empty split
  EXPECT_THROW(build_gpt_indices(lengths, {1, 2}, config), Error);  // no token
  EXPECT_THROW(build_gpt_indices(lengths, {2, 4}, config), Error);  // outside the dataset
  config.seq_length = 1;
  EXPECT_THROW(build_gpt_indices(lengths, {0, 3}, config), UsageError);
  config.seq_length = 4;
  config.seed = -1;
  EXPECT_THROW(build_gpt_indices(lengths, {0, 3}, config), UsageError);
  config.seed = int64_t{1} << 32;
  EXPECT_THROW(build_gpt_indices(lengths, {0, 3}, config), UsageError);
}

TEST_F(Fixture, GptIndicesMatchMegatron) {
  H5Object group(H5Gopen2(file_, "gpt", H5P_DEFAULT), H5Gclose);
  const int64_t count = read_attr(group.id(), "count");
  ASSERT_GE(count, 200);
  int64_t compared = 0, errors = 0;
  for (int64_t k = 0; k < count; ++k) {
    const std::string name = case_name(k);
    SCOPED_TRACE(name);
    H5Object c(H5Gopen2(group.id(), name.c_str(), H5P_DEFAULT), H5Gclose);
    const std::vector<int32_t> lengths = to_int32(read_array(c.id(), "sequence_lengths"));
    const std::string split = read_string(c.id(), "split");
    const auto split_id = static_cast<size_t>(read_attr(c.id(), "split_id"));
    GptIndexConfig config;
    config.seq_length = read_attr(c.id(), "seq_length");
    config.seed = read_attr(c.id(), "seed");
    const int64_t num_samples = read_attr(c.id(), "num_samples");
    if (num_samples >= 0) config.num_samples = num_samples;
    config.add_extra_token_to_sequence = read_attr(c.id(), "add_extra") != 0;
    config.drop_last_partial_sequence = read_attr(c.id(), "drop_last") != 0;
    const auto ranges = split_ranges(split, static_cast<int64_t>(lengths.size()));
    ASSERT_TRUE(ranges[split_id].has_value());
    if (read_attr(c.id(), "expect_error") != 0) {
      EXPECT_THROW(build_gpt_indices(lengths, *ranges[split_id], config), Error);
      ++errors;
      continue;
    }
    EXPECT_EQ(ranges[split_id]->begin, read_attr(c.id(), "begin"));
    EXPECT_EQ(ranges[split_id]->end, read_attr(c.id(), "end"));
    const GptIndices out = build_gpt_indices(lengths, *ranges[split_id], config);
    EXPECT_EQ(out.num_tokens_per_epoch, read_attr(c.id(), "num_tokens_per_epoch"));
    EXPECT_EQ(out.num_epochs, read_attr(c.id(), "num_epochs"));
    EXPECT_EQ(out.separate_final_epoch, read_attr(c.id(), "separate_final_epoch") != 0);
    EXPECT_EQ(out.num_samples_sans_final_epoch, read_attr(c.id(), "num_samples_sans_final_epoch"));

    const Array document_index = read_array(c.id(), "document_index");
    EXPECT_EQ(document_index.dtype, "int32");
    EXPECT_EQ(widen(out.document_index), document_index.i64);
    const Array sample_index = read_array(c.id(), "sample_index");
    ASSERT_EQ(sample_index.dims.size(), 2u);
    EXPECT_EQ(sample_index.dims[1], 2u);
    EXPECT_EQ(out.sample_index_dtype(), sample_index.dtype);
    EXPECT_EQ(widen(out.sample_index), sample_index.i64);
    EXPECT_EQ(out.num_samples(), static_cast<int64_t>(sample_index.dims[0]) - 1);
    const Array shuffle_index = read_array(c.id(), "shuffle_index");
    EXPECT_EQ(out.shuffle_index_dtype(), shuffle_index.dtype);
    EXPECT_EQ(widen(out.shuffle_index), shuffle_index.i64);
    ++compared;
  }
  std::printf("[          ] %lld GPT cases compared, %lld error cases\n", static_cast<long long>(compared),
              static_cast<long long>(errors));
}

// ---- blends --------------------------------------------------------------------------------

TEST(Blend, HandChecked) {
  // weights 1:3, size 8: targets ceil(2) + ceil(6) = 8; the greedy rule gives dataset 1 first
  // (error 0.75 > 0.25 at position max(0, 1) = 1).
  const std::vector<double> weights = {1, 3};
  EXPECT_EQ(blend_size(weights, 8), 8);
  EXPECT_EQ(blend_dataset_num_samples(weights, 8), (std::vector<int64_t>{3, 7}));  // ceil(2 * 1.005), ceil(6 * 1.005)
  const std::vector<int64_t> lengths = {3, 7};
  const BlendingIndices out = build_blend(std::span<const double>(weights), 8, lengths);
  EXPECT_EQ(out.dataset_index, (std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(out.dataset_sample_index, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 5}));
}

TEST(Blend, Errors) {
  const std::vector<double> zero = {0, 0};
  const std::vector<double> some_zero = {1, 0};
  const std::vector<int64_t> lengths = {10, 10};
  EXPECT_THROW(blend_dataset_num_samples(zero, 10), UsageError);
  EXPECT_THROW(blend_dataset_num_samples(some_zero, 10), UsageError);
  EXPECT_THROW(build_blend(std::span<const double>(zero), 10, lengths), UsageError);
  const std::vector<double> ones = {1, 1};
  EXPECT_THROW(build_blend(std::span<const double>(ones), std::nullopt, lengths), UsageError);
  const std::vector<int64_t> short_lengths = {2, 10};
  EXPECT_THROW(build_blend(std::span<const double>(ones), 10, short_lengths), Error);  // oversampled
  const std::vector<int64_t> empty_dataset = {0, 10};
  EXPECT_THROW(build_blend(std::nullopt, std::nullopt, empty_dataset), Error);
}

TEST(Blend, NumpySum) {
  // numpy.sum(numpy.arange(1, 10) * 0.1) == 4.5 (pairwise: 8 accumulators), while adding left
  // to right gives 4.500000000000001.
  std::vector<double> values(9);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i + 1) * 0.1;
  double sequential = 0;
  for (double v : values) sequential += v;
  EXPECT_EQ(numpy_sum(values), 4.5);
  EXPECT_EQ(sequential, 4.500000000000001);
}

TEST_F(Fixture, BlendsMatchMegatron) {
  H5Object group(H5Gopen2(file_, "blend", H5P_DEFAULT), H5Gclose);
  const int64_t count = read_attr(group.id(), "count");
  ASSERT_GT(count, 0);
  for (int64_t k = 0; k < count; ++k) {
    const std::string name = case_name(k);
    SCOPED_TRACE(name);
    H5Object c(H5Gopen2(group.id(), name.c_str(), H5P_DEFAULT), H5Gclose);
    std::optional<std::vector<double>> weights;
    if (exists(c.id(), "weights")) weights = read_array(c.id(), "weights").f64;
    const std::vector<int64_t> lengths = read_array(c.id(), "dataset_lengths").i64;
    const int64_t size_attr = read_attr(c.id(), "size");
    const std::optional<int64_t> size = size_attr >= 0 ? std::optional<int64_t>(size_attr) : std::nullopt;
    std::optional<std::span<const double>> weight_span;
    if (weights) weight_span = std::span<const double>(*weights);
    if (read_attr(c.id(), "expect_error") != 0) {
      EXPECT_THROW(build_blend(weight_span, size, lengths), Error);
      continue;
    }
    if (exists(c.id(), "num_samples")) {
      EXPECT_EQ(blend_dataset_num_samples(*weights, *size), read_array(c.id(), "num_samples").i64);
    }
    const BlendingIndices out = build_blend(weight_span, size, lengths);
    const Array dataset_index = read_array(c.id(), "dataset_index");
    const Array dataset_sample_index = read_array(c.id(), "dataset_sample_index");
    EXPECT_EQ(dataset_index.dtype, "int16");
    EXPECT_EQ(dataset_sample_index.dtype, "int64");
    EXPECT_EQ(widen(out.dataset_index), dataset_index.i64);
    EXPECT_EQ(out.dataset_sample_index, dataset_sample_index.i64);
  }
}

TEST_F(Fixture, WholeBlendsMatchMegatron) {
  H5Object group(H5Gopen2(file_, "blend_e2e", H5P_DEFAULT), H5Gclose);
  const int64_t count = read_attr(group.id(), "count");
  ASSERT_GT(count, 0);
  for (int64_t k = 0; k < count; ++k) {
    const std::string name = case_name(k);
    SCOPED_TRACE(name);
    H5Object c(H5Gopen2(group.id(), name.c_str(), H5P_DEFAULT), H5Gclose);
    const std::vector<double> weights = read_array(c.id(), "weights").f64;
    const int64_t size = read_attr(c.id(), "size");
    const std::string split = read_string(c.id(), "split");
    const std::vector<int64_t> num_samples = blend_dataset_num_samples(weights, size);
    std::vector<int64_t> lengths;
    for (size_t d = 0; d < weights.size(); ++d) {
      const std::string suffix = std::string("_").append(std::to_string(d));
      const std::vector<int32_t> sequence_lengths = to_int32(read_array(c.id(), "sequence_lengths" + suffix));
      GptIndexConfig config;
      config.seq_length = read_attr(c.id(), "seq_length");
      config.seed = read_attr(c.id(), "seed");
      config.add_extra_token_to_sequence = read_attr(c.id(), "add_extra") != 0;
      config.num_samples = num_samples[d];
      const auto range = split_ranges(split, static_cast<int64_t>(sequence_lengths.size()))[0];
      const GptIndices out = build_gpt_indices(sequence_lengths, *range, config);
      EXPECT_EQ(widen(out.document_index), read_array(c.id(), "document_index" + suffix).i64);
      EXPECT_EQ(widen(out.sample_index), read_array(c.id(), "sample_index" + suffix).i64);
      EXPECT_EQ(widen(out.shuffle_index), read_array(c.id(), "shuffle_index" + suffix).i64);
      lengths.push_back(out.num_samples());
    }
    const BlendingIndices out = build_blend(std::span<const double>(weights), size, lengths);
    EXPECT_EQ(widen(out.dataset_index), read_array(c.id(), "dataset_index").i64);
    EXPECT_EQ(out.dataset_sample_index, read_array(c.id(), "dataset_sample_index").i64);
  }
}

// Index build for 10 million sequences and 10 billion tokens (the lead's benchmark); run by hand:
// build-*/bin/mt_test_megatron_indices --gtest_also_run_disabled_tests --gtest_filter='*Benchmark*'
TEST(GptIndices, DISABLED_Benchmark10MDocs10BTokens) {
  const int64_t documents = 10'000'000;
  std::vector<int32_t> lengths(static_cast<size_t>(documents));
  uint64_t state = 88172645463325252ULL;
  int64_t tokens = 0;
  for (auto& length : lengths) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    length = static_cast<int32_t>(1 + state % 1999);  // mean 1000
    tokens += length;
  }
  const auto ranges = split_ranges("969,30,1", documents);
  GptIndexConfig config;
  config.seq_length = 2048;
  config.num_samples = static_cast<int64_t>(static_cast<double>(tokens) * 0.969 / 2048 * 1.5);  // 2 epochs
  const auto start = std::chrono::steady_clock::now();
  const GptIndices out = build_gpt_indices(lengths, *ranges[0], config);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[          ] %lld tokens, train split: %lld epochs, %zu document index, %lld samples: %.2f s\n",
              static_cast<long long>(tokens), static_cast<long long>(out.num_epochs), out.document_index.size(),
              static_cast<long long>(out.num_samples()), seconds);
}

}  // namespace
}  // namespace mt::data

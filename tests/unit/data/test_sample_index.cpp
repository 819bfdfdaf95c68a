// The sample-index file (lib/data/sample_index.h): MD5 against RFC 1321's vectors, a write/read
// round trip of single and blended splits keeping Megatron's dtypes, the stale-parameter refusal
// naming what differs, no temporary left behind, and corrupt files refused with mt::Error.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/sample_index.h"
#include "data/token_dataset.h"

using namespace mt;
using namespace mt::data;
namespace fs = std::filesystem;

namespace {

class TempDir : public mt::testing::TempDir {
 public:
  TempDir() : mt::testing::TempDir("mt_sample_index") {}
};

// `documents` documents of one sequence each, lengths 5..20, tokens counting, EOD 0 at the end.
void write_dataset(const std::string& prefix, int documents, int first_token, TokenDatasetFormat format) {
  TokenDatasetMetadata metadata;
  metadata.eod_id = 0;
  TokenDatasetWriter writer = TokenDatasetWriter::create(prefix, format, 64, metadata);
  for (int d = 0; d < documents; ++d) {
    std::vector<int32_t> tokens;
    const int length = 5 + (d * 7) % 16;
    for (int t = 0; t + 1 < length; ++t) tokens.push_back(1 + (first_token + d + t) % 63);
    tokens.push_back(0);
    writer.add_sequence(tokens);
    writer.end_document();
  }
  writer.finish();
}

DataConfig config_for(const std::vector<std::string>& words) {
  DataConfig config;
  config.blend = parse_blend(words, "--data-path");
  config.split = "80,10,10";
  config.seq_length = 8;
  config.seed = 1234;
  config.num_samples = {40, 8, 4};
  return config;
}

template <typename T>
std::vector<int64_t> widen(const std::vector<T>& values) {
  return std::vector<int64_t>(values.begin(), values.end());
}

std::vector<int64_t> sample_rows(const GptIndices& x) {
  return std::visit([](const auto& v) { return widen(v); }, x.sample_index);
}
std::vector<int64_t> shuffle_rows(const GptIndices& x) {
  return std::visit([](const auto& v) { return widen(v); }, x.shuffle_index);
}

void expect_same(const SampleIndex& a, const SampleIndex& b) {
  EXPECT_EQ(a.parameters, b.parameters);
  EXPECT_EQ(a.datasets, b.datasets);
  for (size_t s = 0; s < 3; ++s) {
    const IndexSplit& x = a.splits[s];
    const IndexSplit& y = b.splits[s];
    ASSERT_EQ(x.present, y.present);
    EXPECT_EQ(x.blended, y.blended);
    EXPECT_EQ(x.num_samples, y.num_samples);
    EXPECT_EQ(x.size(), y.size());
    EXPECT_EQ(x.dataset_index, y.dataset_index);
    EXPECT_EQ(x.dataset_sample_index, y.dataset_sample_index);
    ASSERT_EQ(x.components.size(), y.components.size());
    for (size_t k = 0; k < x.components.size(); ++k) {
      const IndexComponent& c = x.components[k];
      const IndexComponent& d = y.components[k];
      EXPECT_EQ(c.dataset, d.dataset);
      EXPECT_EQ(c.sequence_begin, d.sequence_begin);
      EXPECT_EQ(c.sequence_end, d.sequence_end);
      EXPECT_EQ(c.num_samples, d.num_samples);
      EXPECT_EQ(c.indices.document_index, d.indices.document_index);
      EXPECT_EQ(sample_rows(c.indices), sample_rows(d.indices));
      EXPECT_EQ(shuffle_rows(c.indices), shuffle_rows(d.indices));
      EXPECT_EQ(c.indices.sample_index_dtype(), d.indices.sample_index_dtype());
      EXPECT_EQ(c.indices.shuffle_index_dtype(), d.indices.shuffle_index_dtype());
      EXPECT_EQ(c.indices.num_epochs, d.indices.num_epochs);
      EXPECT_EQ(c.indices.separate_final_epoch, d.indices.separate_final_epoch);
      EXPECT_EQ(c.indices.num_tokens_per_epoch, d.indices.num_tokens_per_epoch);
    }
  }
}

// Overwrites one element of an integer dataset in place.
void poke_dataset(const std::string& path, const std::string& name, int64_t value) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  ASSERT_GE(dataset, 0);
  const hid_t space = H5Dget_space(dataset);
  const hsize_t start[2] = {0, 0}, count[2] = {1, 1};
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
  const hid_t memory = H5Screate_simple(1, count, nullptr);
  ASSERT_GE(H5Dwrite(dataset, H5T_NATIVE_INT64, memory, space, H5P_DEFAULT, &value), 0);
  H5Sclose(memory);
  H5Sclose(space);
  H5Dclose(dataset);
  H5Fclose(file);
}

}  // namespace

TEST(Md5, Rfc1321Vectors) {
  EXPECT_EQ(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex("a"), "0cc175b9c0f1b6a831c399e269772661");
  EXPECT_EQ(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(md5_hex("message digest"), "f96b697d7cb7938d525a2f31aaf161d0");
  EXPECT_EQ(md5_hex("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
            "57edf4a22be3c955ac49da2e2107b67a");
}

TEST(SampleIndexFile, RoundTripSingleAndBlend) {
  TempDir dir;
  write_dataset(dir.file("a"), 60, 0, TokenDatasetFormat::hdf5);
  write_dataset(dir.file("b"), 40, 17, TokenDatasetFormat::megatron);
  for (const auto& words :
       {std::vector<std::string>{dir.file("a")}, std::vector<std::string>{"0.3", dir.file("a"), "0.7", dir.file("b")},
        std::vector<std::string>{"1", dir.file("b")}}) {
    const DataConfig config = config_for(words);
    const auto datasets = open_datasets(config);
    const SampleIndex built = build_sample_index(config, datasets);
    const std::string path = dir.file("index.h5");
    fs::remove(path);
    write_sample_index(path, built);
    const SampleIndex read = read_sample_index(path);
    expect_same(built, read);
    EXPECT_NO_THROW(check_sample_index(path, read, index_parameters(config), dataset_fingerprints(config, datasets)));
    for (const IndexSplit& split : read.splits) {
      ASSERT_TRUE(split.present);
      EXPECT_EQ(split.blended, words.size() > 1);  // a weighted single prefix is a blend of one
      EXPECT_GE(split.size(), split.num_samples);
      for (const auto& c : split.components) {
        EXPECT_EQ(c.indices.sample_index_dtype(), "int32");
        EXPECT_EQ(c.indices.shuffle_index_dtype(), "uint32");
      }
    }
  }
  // Only the final file: the temporary was renamed.
  for (const auto& name : dir.entries()) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
}

TEST(SampleIndexFile, StaleParametersAreRefusedNamingTheDifference) {
  TempDir dir;
  write_dataset(dir.file("a"), 60, 0, TokenDatasetFormat::hdf5);
  DataConfig config = config_for({dir.file("a")});
  const auto datasets = open_datasets(config);
  const std::string path = dir.file("index.h5");
  write_sample_index(path, build_sample_index(config, datasets));
  const SampleIndex read = read_sample_index(path);

  DataConfig other = config;
  other.seq_length = 12;
  try {
    check_sample_index(path, read, index_parameters(other), dataset_fingerprints(other, datasets));
    FAIL() << "a different seq_length must be refused";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("stale sample index"), std::string::npos) << message;
    EXPECT_NE(message.find("seq_length: file 8, asked 12"), std::string::npos) << message;
  }
  other = config;
  other.seed = 99;
  EXPECT_THROW(check_sample_index(path, read, index_parameters(other), dataset_fingerprints(other, datasets)), Error);

  // The same prefix with other data behind it: the fingerprint differs.
  write_dataset(dir.file("a"), 61, 0, TokenDatasetFormat::hdf5);
  const auto changed = open_datasets(config);
  try {
    check_sample_index(path, read, index_parameters(config), dataset_fingerprints(config, changed));
    FAIL() << "changed data must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("datasets[0].sequences: file 60, asked 61"), std::string::npos) << e.what();
  }
  // load_or_build_index refuses it too, and leaves it in place.
  EXPECT_THROW(load_or_build_index(config, changed, path, true), Error);
  EXPECT_TRUE(fs::exists(path));
}

TEST(SampleIndexFile, CorruptFilesAreRefused) {
  TempDir dir;
  H5E_auto2_t handler_before = nullptr;
  void* data_before = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &handler_before, &data_before);
  write_dataset(dir.file("a"), 60, 0, TokenDatasetFormat::hdf5);
  const DataConfig config = config_for({"0.5", dir.file("a"), "0.5", dir.file("a")});
  const auto datasets = open_datasets(config);
  const std::string path = dir.file("index.h5");
  write_sample_index(path, build_sample_index(config, datasets));

  auto expect_refused = [&](const std::string& file, const std::string& fragment) {
    try {
      read_sample_index(file);
      FAIL() << file << " must be refused (" << fragment << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_refused(dir.file("missing.h5"), "no such file");
  expect_refused(dir.file("a.h5"), "not an mt sample index");  // a token dataset, not an index

  fs::copy_file(path, dir.file("truncated.h5"));
  fs::resize_file(dir.file("truncated.h5"), fs::file_size(path) / 2);
  EXPECT_THROW(read_sample_index(dir.file("truncated.h5")), Error);

  fs::copy_file(path, dir.file("shuffle.h5"));
  poke_dataset(dir.file("shuffle.h5"), "/train/component_0/shuffle_index", 1 << 30);
  expect_refused(dir.file("shuffle.h5"), "past the samples");

  fs::copy_file(path, dir.file("document.h5"));
  poke_dataset(dir.file("document.h5"), "/valid/component_1/document_index", 0);  // sequence 0 is in train
  expect_refused(dir.file("document.h5"), "outside [");

  fs::copy_file(path, dir.file("blend.h5"));
  poke_dataset(dir.file("blend.h5"), "/train/dataset_index", 7);
  expect_refused(dir.file("blend.h5"), "points past its component");

  // Writing and reading datasets and indices, and refusing bad ones, leave the caller's HDF5
  // error handler in place (mt quiets HDF5's printing only inside its own calls).
  H5E_auto2_t handler_after = nullptr;
  void* data_after = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &handler_after, &data_after);
  EXPECT_NE(handler_before, nullptr);
  EXPECT_EQ(handler_after, handler_before);
  EXPECT_EQ(data_after, data_before);
}

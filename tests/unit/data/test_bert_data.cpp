// Tests for lib/data/bert_samples.{h,cpp}, lib/data/bert_masking.{h,cpp} and
// lib/data/bert_dataset.{h,cpp}: Megatron's BERT sample index and masked samples. Expected values
// come from tests/data/megatron_bert_cases.h5, written by tests/data/make_bert_cases.py with the
// numpy oracle tests/data/megatron_bert_oracle.py (/cases) and copied from Megatron-Core's own
// BERTMaskedWordPieceDataset (tests/data/megatron_core_bert.py, /megatron_core); plus cases worked
// out by hand and bad input.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "core/error.h"
#include "data/bert_dataset.h"
#include "data/bert_masking.h"
#include "data/bert_samples.h"
#include "io/hdf5_attributes.h"

namespace mt::data {
namespace {

std::string cases_path() { return std::string(MT_SOURCE_DIR) + "/tests/data/megatron_bert_cases.h5"; }

// An HDF5 handle on the fixture: a failed open fails the test instead of passing -1 along.
class H5Object : public mt::io::Hdf5Handle {
 public:
  H5Object(hid_t id, herr_t (*close)(hid_t)) : mt::io::Hdf5Handle(id, close) {
    if (!ok()) throw std::runtime_error("HDF5 call failed");
  }
  hid_t id() const { return get(); }
};

bool exists(hid_t group, const std::string& name) { return H5Lexists(group, name.c_str(), H5P_DEFAULT) > 0; }

template <class T>
std::vector<T> read_array(hid_t group, const std::string& name, hid_t memory_type) {
  H5Object dataset(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose);
  H5Object space(H5Dget_space(dataset.id()), H5Sclose);
  std::vector<T> values(static_cast<size_t>(H5Sget_simple_extent_npoints(space.id())));
  if (!values.empty() && H5Dread(dataset.id(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
    throw std::runtime_error("cannot read " + name);
  return values;
}
std::vector<int64_t> read_i64(hid_t group, const std::string& name) {
  return read_array<int64_t>(group, name, H5T_NATIVE_INT64);
}

template <class T>
T read_attr(hid_t object, const std::string& name, hid_t memory_type) {
  H5Object attr(H5Aopen(object, name.c_str(), H5P_DEFAULT), H5Aclose);
  T value{};
  if (H5Aread(attr.id(), memory_type, &value) < 0) throw std::runtime_error("cannot read attribute " + name);
  return value;
}
int64_t attr_i64(hid_t object, const std::string& name) { return read_attr<int64_t>(object, name, H5T_NATIVE_INT64); }
double attr_f64(hid_t object, const std::string& name) { return read_attr<double>(object, name, H5T_NATIVE_DOUBLE); }

std::string case_name(int64_t k) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "case_%03lld", static_cast<long long>(k));
  return buffer;
}

// The fixture's sentence dataset.
struct SentenceData {
  std::vector<int32_t> tokens;
  std::vector<int32_t> sentence_lengths;
  std::vector<int64_t> document_indices;
  std::vector<int64_t> offsets;  // (sentences + 1,)
  BertVocabulary vocabulary;
  std::span<const int32_t> sentence(int64_t i) const {
    return std::span<const int32_t>(tokens).subspan(static_cast<size_t>(offsets[static_cast<size_t>(i)]),
                                                    static_cast<size_t>(sentence_lengths[static_cast<size_t>(i)]));
  }
};

class BertFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    file_ = H5Fopen(cases_path().c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(file_, 0) << cases_path() << " (regenerate with tests/data/make_bert_cases.py)";
    H5Object group(H5Gopen2(file_, "dataset", H5P_DEFAULT), H5Gclose);
    data_.tokens = read_array<int32_t>(group.id(), "tokens", H5T_NATIVE_INT32);
    data_.sentence_lengths = read_array<int32_t>(group.id(), "sentence_lengths", H5T_NATIVE_INT32);
    data_.document_indices = read_i64(group.id(), "document_indices");
    data_.offsets.assign(1, 0);
    for (int32_t length : data_.sentence_lengths) data_.offsets.push_back(data_.offsets.back() + length);
    data_.vocabulary.is_subword = read_array<uint8_t>(group.id(), "is_subword", H5T_NATIVE_UINT8);
    data_.vocabulary.cls = attr_i64(group.id(), "cls");
    data_.vocabulary.sep = attr_i64(group.id(), "sep");
    data_.vocabulary.mask = attr_i64(group.id(), "mask");
    ASSERT_EQ(data_.vocabulary.vocab_size(), attr_i64(group.id(), "vocab_size"));
  }
  static void TearDownTestSuite() { H5Fclose(file_); }

  // Every case of `group_name`: the whole sample index, then each stored sample's arrays.
  // Returns the number of cases compared.
  static int check_cases(const std::string& group_name);

  static hid_t file_;
  static SentenceData data_;
};
hid_t BertFixture::file_ = -1;
SentenceData BertFixture::data_;

// The first position where two arrays differ, for a message that pins down the failure.
std::string first_difference(const std::vector<int64_t>& actual, const std::vector<int64_t>& expected) {
  if (actual.size() != expected.size())
    return "size " + std::to_string(actual.size()) + " != " + std::to_string(expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    if (actual[i] != expected[i])
      return "position " + std::to_string(i) + ": " + std::to_string(actual[i]) + " != " + std::to_string(expected[i]);
  return "";
}

int BertFixture::check_cases(const std::string& group_name) {
  H5Object cases(H5Gopen2(file_, group_name.c_str(), H5P_DEFAULT), H5Gclose);
  H5G_info_t info{};
  if (H5Gget_info(cases.id(), &info) < 0) throw std::runtime_error("cannot list " + group_name);
  int compared = 0;
  for (int64_t k = 0; k < static_cast<int64_t>(info.nlinks); ++k) {
    H5Object group(H5Gopen2(cases.id(), case_name(k).c_str(), H5P_DEFAULT), H5Gclose);
    const hid_t g = group.id();
    SCOPED_TRACE(group_name + "/" + case_name(k));
    BertSampleIndexConfig index_config;
    index_config.seq_length = attr_i64(g, "seq_length");
    index_config.seed = attr_i64(g, "seed");
    index_config.short_seq_prob = attr_f64(g, "short_seq_prob");
    index_config.binary_head = attr_i64(g, "binary_head") != 0;
    index_config.num_samples = attr_i64(g, "num_samples");
    const SequenceRange documents{attr_i64(g, "split_begin"), attr_i64(g, "split_end")};
    // The split range itself: Megatron's split over documents.
    const std::string split = [&] {
      const auto bytes = read_array<uint8_t>(g, "split", H5T_NATIVE_UINT8);
      return std::string(bytes.begin(), bytes.end());
    }();
    const auto ranges = split_ranges(split, static_cast<int64_t>(data_.document_indices.size()) - 1);
    EXPECT_EQ(ranges[static_cast<size_t>(attr_i64(g, "split_id"))], documents);

    const auto index = build_bert_sample_index(data_.document_indices, data_.sentence_lengths, documents, index_config);
    const auto expected_index = read_i64(g, "sample_index");
    std::vector<int64_t> actual_index;
    for (const auto& row : index)
      actual_index.insert(actual_index.end(), {row.first_sentence, row.end_sentence, row.target_length});
    EXPECT_EQ(first_difference(actual_index, expected_index), "") << "sample index";
    if (actual_index != expected_index) continue;

    BertMaskingConfig masking;
    masking.seq_length = index_config.seq_length;
    masking.seed = index_config.seed;
    masking.binary_head = index_config.binary_head;
    masking.mask_prob = attr_f64(g, "mask_prob");
    BertVocabulary vocabulary = data_.vocabulary;
    vocabulary.pad = attr_i64(g, "pad_id");
    const auto seq = static_cast<size_t>(masking.seq_length);
    const auto text = read_i64(g, "text"), types = read_i64(g, "types"), labels = read_i64(g, "labels");
    const auto padding = read_i64(g, "padding_mask"), loss = read_i64(g, "loss_mask");
    const auto is_random = read_i64(g, "is_random"), truncated = read_i64(g, "truncated");
    const size_t checked = is_random.size();
    EXPECT_GE(checked, std::min<size_t>(index.size(), 40));
    const auto slice = [&](const std::vector<int64_t>& all, size_t i) {
      return std::vector<int64_t>(all.begin() + static_cast<std::ptrdiff_t>(i * seq),
                                  all.begin() + static_cast<std::ptrdiff_t>((i + 1) * seq));
    };
    int mismatched = 0;
    for (size_t i = 0; i < checked && mismatched < 3; ++i) {
      const BertSample sample = make_bert_sample([&](int64_t s) { return data_.sentence(s); }, index[i],
                                                 static_cast<int64_t>(i), vocabulary, masking);
      const std::string where = "sample " + std::to_string(i) + " ";
      const std::pair<const char*, std::string> checks[] = {
          {"text", first_difference(sample.tokens, slice(text, i))},
          {"types", first_difference(sample.types, slice(types, i))},
          {"labels", first_difference(sample.labels, slice(labels, i))},
          {"padding_mask", first_difference(sample.padding_mask, slice(padding, i))},
          {"loss_mask", first_difference(sample.loss_mask, slice(loss, i))}};
      bool ok = true;
      for (const auto& [name, difference] : checks) {
        EXPECT_EQ(difference, "") << where << name;
        ok = ok && difference.empty();
      }
      EXPECT_EQ(sample.is_random, is_random[i] != 0) << where << "is_random";
      EXPECT_EQ(sample.truncated, truncated[i] != 0) << where << "truncated";
      if (!ok) ++mismatched;
    }
    ++compared;
  }
  return compared;
}

TEST_F(BertFixture, SampleIndexAndSamplesEqualTheNumpyOracle) { EXPECT_EQ(check_cases("cases"), 8); }

TEST_F(BertFixture, SampleIndexAndSamplesEqualMegatronCore) {
  ASSERT_TRUE(exists(file_, "megatron_core")) << "regenerate with tests/data/megatron_core_bert.py";
  EXPECT_EQ(check_cases("megatron_core"), 8);
}

TEST_F(BertFixture, NgramDistributionEqualsNumpyBitForBit) {
  H5Object group(H5Gopen2(file_, "ngram_cdf", H5P_DEFAULT), H5Gclose);
  for (int32_t max_ngram = 1; max_ngram <= 6; ++max_ngram) {
    const auto expected =
        read_array<double>(group.id(), "max_" + std::to_string(max_ngram), H5T_NATIVE_DOUBLE);
    EXPECT_EQ(bert_ngram_cdf(max_ngram), expected) << "max_ngram " << max_ngram;
  }
}

// The fixture's sentences written as an mt token dataset (one sequence per sentence) and read back
// through BertDataset give case 0's samples: the path a trainer takes.
TEST_F(BertFixture, BertDatasetOverATokenDatasetGivesTheOracleSamples) {
  mt::testing::TempDir directory("mt_test_bert");
  const std::string prefix = (directory.path() / "sentences").string();
  auto writer = TokenDatasetWriter::create(prefix, TokenDatasetFormat::hdf5, data_.vocabulary.vocab_size());
  for (size_t d = 0; d + 1 < data_.document_indices.size(); ++d) {
    for (int64_t s = data_.document_indices[d]; s < data_.document_indices[d + 1]; ++s)
      writer.add_sequence(data_.sentence(s));
    writer.end_document();
  }
  writer.finish();
  const TokenDataset dataset = TokenDataset::open(prefix);
  H5Object group(H5Gopen2(file_, "cases/case_000", H5P_DEFAULT), H5Gclose);
  BertDatasetConfig config;
  config.index.seq_length = attr_i64(group.id(), "seq_length");
  config.index.seed = attr_i64(group.id(), "seed");
  config.index.short_seq_prob = attr_f64(group.id(), "short_seq_prob");
  config.index.num_samples = attr_i64(group.id(), "num_samples");
  config.mask_prob = attr_f64(group.id(), "mask_prob");
  BertVocabulary vocabulary = data_.vocabulary;
  vocabulary.pad = attr_i64(group.id(), "pad_id");
  const BertDataset bert(dataset, "80,15,5", Split::train, vocabulary, config);
  EXPECT_EQ(bert.size() * 3, static_cast<int64_t>(read_i64(group.id(), "sample_index").size()));
  const auto text = read_i64(group.id(), "text"), labels = read_i64(group.id(), "labels");
  const auto seq = static_cast<size_t>(config.index.seq_length);
  for (size_t i = 0; i < 30; ++i) {
    const BertSample sample = bert.sample(static_cast<int64_t>(i));
    EXPECT_EQ(sample.tokens, std::vector<int64_t>(text.begin() + i * seq, text.begin() + (i + 1) * seq)) << i;
    EXPECT_EQ(sample.labels, std::vector<int64_t>(labels.begin() + i * seq, labels.begin() + (i + 1) * seq)) << i;
  }
  EXPECT_THROW(bert.sample(bert.size()), Error);
  EXPECT_THROW(BertDataset(dataset, "1,0,0", Split::valid, vocabulary, config), UsageError);
}

// The fixture exercises what the header promises: skipped documents, short targets, swaps,
// truncation, padding, random replacement ids.
TEST_F(BertFixture, FixtureCoversTheRules) {
  // Document 17 holds a 513-token sentence among 3, document 40 is one 600-token sentence.
  EXPECT_EQ(data_.document_indices[18] - data_.document_indices[17], 3);
  BertSampleIndexConfig config;
  config.seq_length = 64;
  config.num_samples = 1;
  config.binary_head = false;
  const auto index = build_bert_sample_index(data_.document_indices, data_.sentence_lengths, {0, 96}, config);
  bool long_single = false;
  for (const auto& row : index) {
    EXPECT_FALSE(row.first_sentence >= data_.document_indices[17] && row.first_sentence < data_.document_indices[18]);
    long_single = long_single || row.first_sentence == data_.document_indices[40];
  }
  EXPECT_TRUE(long_single) << "a one-sentence document is not checked for long sentences";
  // Case 0's samples: swaps and truncation both ways, and every outcome of the 80/10/10 rule.
  H5Object group(H5Gopen2(file_, "cases/case_000", H5P_DEFAULT), H5Gclose);
  const auto is_random = read_i64(group.id(), "is_random"), truncated = read_i64(group.id(), "truncated");
  const auto text = read_i64(group.id(), "text"), labels = read_i64(group.id(), "labels");
  const auto loss = read_i64(group.id(), "loss_mask"), padding = read_i64(group.id(), "padding_mask");
  const auto count = [](const std::vector<int64_t>& v, int64_t value) { return std::count(v.begin(), v.end(), value); };
  EXPECT_GT(count(is_random, 1), 0);
  EXPECT_GT(count(is_random, 0), 0);
  EXPECT_GT(count(truncated, 1), 0);
  EXPECT_GT(count(truncated, 0), 0);
  EXPECT_GT(count(padding, 0), 0);
  int64_t masked = 0, kept = 0, replaced = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (loss[i] == 0) continue;
    if (text[i] == data_.vocabulary.mask) ++masked;
    else if (text[i] == labels[i]) ++kept;
    else ++replaced;
  }
  EXPECT_GT(masked, 4 * (kept + replaced) / 2);
  EXPECT_GT(kept, 0);
  EXPECT_GT(replaced, 0);
}

// ---- by hand --------------------------------------------------------------------------------

TEST(BertMapping, DocumentsSkippedAndRunsCut) {
  // Documents: [5, 5, 5] | [7] | [600, 3] | [4, 4] ; no short sequences, max length 8.
  const std::vector<int32_t> lengths{5, 5, 5, 7, 600, 3, 4, 4};
  const std::vector<int64_t> bounds{0, 3, 4, 6, 8};
  const auto maps = build_bert_mapping(bounds, lengths, 1, 100, 8, 0.0, 1, 2);
  // Document 0: 5 < 8 after one sentence; 10 >= 8 but only one sentence left -> run to the end.
  // Document 1: one sentence, under the minimum. Document 2: a sentence over 512. Document 3: [6, 8).
  ASSERT_EQ(maps.size(), 2u);
  const std::vector<BertSampleRange> expected_rows{{0, 3, 8}, {6, 8, 8}};
  for (const auto& row : expected_rows)
    EXPECT_NE(std::find(maps.begin(), maps.end(), row), maps.end()) << row.first_sentence;
  // Without the binary head the one-sentence document counts; document 2 still has a long sentence.
  EXPECT_EQ(build_bert_mapping(bounds, lengths, 1, 100, 8, 0.0, 1, 1).size(), 3u);
  // A long sentence alone is not checked.
  EXPECT_EQ(build_bert_mapping(std::vector<int64_t>{0, 1}, std::vector<int32_t>{600}, 1, 1, 8, 0.0, 1, 1).size(), 1u);
}

TEST(BertMapping, EpochsRepeatUntilEnoughSamples) {
  const std::vector<int32_t> lengths{5, 5, 5, 5};
  const std::vector<int64_t> bounds{0, 2, 4};  // two samples per epoch
  EXPECT_EQ(build_bert_mapping(bounds, lengths, 1000, 5, 8, 0.0, 3, 2).size(), 6u);
  EXPECT_EQ(build_bert_mapping(bounds, lengths, 1000, 0, 8, 0.0, 3, 2).size(), 0u);
}

TEST(BertMapping, BadInputIsRefused) {
  const std::vector<int32_t> lengths{5, 5};
  const std::vector<int64_t> bounds{0, 2};
  EXPECT_THROW(build_bert_mapping(bounds, lengths, 1, 1, 8, 0.1, 0, 2), UsageError);           // seed 0
  EXPECT_THROW(build_bert_mapping(bounds, lengths, 1, 1, 8, 0.1, 2147483647, 2), UsageError);  // seed + 1
  EXPECT_THROW(build_bert_mapping(bounds, lengths, 1, 1, 8, 1.5, 1, 2), UsageError);
  EXPECT_THROW(build_bert_mapping(bounds, lengths, 1, 1, 8, 1e-12, 1, 2), UsageError);  // 1 / p beyond int32
  EXPECT_THROW(build_bert_mapping(bounds, lengths, 1, 1, 1, 0.1, 1, 2), UsageError);
  EXPECT_THROW(build_bert_mapping(std::vector<int64_t>{0, 3}, lengths, 1, 1, 8, 0.1, 1, 2), Error);
  EXPECT_THROW(build_bert_mapping(std::vector<int64_t>{0, 2, 1}, lengths, 1, 1, 8, 0.1, 1, 2), Error);
  // No document yields a sample: Megatron loops over 2^31 epochs.
  EXPECT_THROW(build_bert_mapping(bounds, lengths, 1000, 5, 8, 0.1, 1, 3), Error);
  BertSampleIndexConfig config;
  config.num_samples = 4;
  EXPECT_THROW(build_bert_sample_index(bounds, lengths, {1, 1}, config), Error);  // an empty split
  EXPECT_THROW(build_bert_sample_index(bounds, lengths, {0, 2}, config), Error);  // past the documents
  config.seq_length = 4;
  EXPECT_THROW(build_bert_sample_index(bounds, lengths, {0, 1}, config), UsageError);
}

BertVocabulary small_vocabulary() {
  BertVocabulary vocabulary;
  vocabulary.is_subword.assign(20, 0);
  vocabulary.is_subword[10] = vocabulary.is_subword[11] = 1;
  vocabulary.cls = 2;
  vocabulary.sep = 3;
  vocabulary.mask = 4;
  vocabulary.pad = 0;
  return vocabulary;
}

TEST(BertSample, LayoutOfAShortSampleWithoutTheBinaryHead) {
  const std::vector<int32_t> sentence{5, 10, 6};
  BertMaskingConfig config;
  config.seq_length = 8;
  config.binary_head = false;
  const BertSample sample = make_bert_sample([&](int64_t) { return std::span<const int32_t>(sentence); },
                                             {0, 1, 8}, 0, small_vocabulary(), config);
  // [CLS] 5 10 6 [SEP] pad pad pad. Budget min(0.15 * 8, max(1, round(0.15 * 5))) = 1 token: the
  // two-piece word 5 ##10 never fits, the word 6 (position 3) is masked whatever the shuffle.
  EXPECT_EQ(sample.types, (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(sample.padding_mask, (std::vector<int64_t>{1, 1, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(sample.loss_mask, (std::vector<int64_t>{0, 0, 0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(sample.labels, (std::vector<int64_t>{-1, -1, -1, 6, -1, -1, -1, -1}));
  EXPECT_EQ(sample.tokens[0], 2);
  EXPECT_EQ(sample.tokens[4], 3);
  EXPECT_FALSE(sample.is_random);
  EXPECT_FALSE(sample.truncated);
  // With the target 5 the budget is 0.15 * 5 = 0.75 < 1 token: nothing is masked (Megatron's min).
  const BertSample unmasked = make_bert_sample([&](int64_t) { return std::span<const int32_t>(sentence); },
                                               {0, 1, 5}, 0, small_vocabulary(), config);
  EXPECT_EQ(unmasked.loss_mask, std::vector<int64_t>(8, 0));
  EXPECT_EQ(unmasked.tokens, (std::vector<int64_t>{2, 5, 10, 6, 3, 0, 0, 0}));
}

TEST(BertSample, BadInputIsRefused) {
  const std::vector<int32_t> sentence{5, 6, 7};
  const std::vector<int32_t> outside{5, 25};
  const auto one = [&](int64_t) { return std::span<const int32_t>(sentence); };
  BertMaskingConfig config;
  config.seq_length = 16;
  const BertVocabulary vocabulary = small_vocabulary();
  EXPECT_THROW(make_bert_sample(one, {0, 1, 5}, 0, vocabulary, config), Error);  // binary head, one sentence
  EXPECT_THROW(make_bert_sample(one, {0, 2, 17}, 0, vocabulary, config), Error);  // target over seq_length
  EXPECT_THROW(make_bert_sample([&](int64_t) { return std::span<const int32_t>(outside); }, {0, 2, 8}, 0,
                                vocabulary, config),
               Error);
  config.mask_prob = 1.0;
  EXPECT_THROW(make_bert_sample(one, {0, 2, 8}, 0, vocabulary, config), UsageError);
  config.mask_prob = 0.15;
  BertVocabulary no_mask = vocabulary;
  no_mask.mask = 20;
  EXPECT_THROW(make_bert_sample(one, {0, 2, 8}, 0, no_mask, config), UsageError);
}

}  // namespace
}  // namespace mt::data

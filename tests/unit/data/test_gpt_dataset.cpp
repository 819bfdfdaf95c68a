// The GPT loader (lib/data/gpt_dataset.h): Megatron's masks and positions against hand-computed
// cases, samples against an independent reading of the index (the epoch's document stream cut
// at the sample_index positions), blends routed to their components in Megatron's proportions,
// MegatronPretrainingSampler's rank slices and exact resume, Megatron's sample counts, the
// on-disk cache (built once, then reused), and bad input refused before anything is written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/token_dataset.h"

using namespace mt;
using namespace mt::data;
namespace fs = std::filesystem;

namespace {

class TempDir : public mt::testing::TempDir {
 public:
  TempDir() : mt::testing::TempDir("mt_gpt_dataset") {}
};

constexpr int32_t kEod = 0;

// Documents of one sequence each, lengths 3..14, distinct tokens per dataset, EOD at the end.
std::vector<std::vector<int32_t>> make_documents(int documents, int salt) {
  std::vector<std::vector<int32_t>> out;
  for (int d = 0; d < documents; ++d) {
    std::vector<int32_t> tokens;
    const int length = 3 + (d * 5 + salt) % 12;
    for (int t = 0; t + 1 < length; ++t) tokens.push_back(1 + (salt * 31 + d * 3 + t) % 250);
    tokens.push_back(kEod);
    out.push_back(tokens);
  }
  return out;
}

void write_dataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& documents,
                   TokenDatasetFormat format = TokenDatasetFormat::hdf5) {
  TokenDatasetMetadata metadata;
  metadata.eod_id = kEod;
  TokenDatasetWriter writer = TokenDatasetWriter::create(prefix, format, 256, metadata);
  for (const auto& document : documents) {
    writer.add_sequence(document);
    writer.end_document();
  }
  writer.finish();
}

DataConfig config_for(const std::vector<std::string>& words, int64_t seq_length = 8) {
  DataConfig config;
  config.blend = parse_blend(words, "--data-path");
  config.split = "90,5,5";
  config.seq_length = seq_length;
  config.num_samples = {60, 10, 10};
  return config;
}

std::unique_ptr<GptSampleSource> open_source(const DataConfig& config, LoaderOptions options = {}) {
  auto datasets = open_datasets(config);
  SampleIndex index = build_sample_index(config, datasets);
  return std::make_unique<GptSampleSource>(std::move(datasets), std::move(index), "memory", config.seq_length, options);
}

std::vector<int32_t> text_of(const SampleSource& source, Split split, int64_t index, int64_t seq_length) {
  std::vector<int32_t> text(static_cast<size_t>(seq_length) + 1);
  source.sample(split, index, text.data());
  return text;
}

}  // namespace

TEST(LtorMasks, HandComputedCase) {
  // Megatron's _get_ltor_masks_and_position_ids on tokens [5, EOD, 7, 8, EOD, 9].
  const std::vector<int32_t> tokens = {5, kEod, 7, 8, kEod, 9};
  std::vector<float> mask(6);
  std::vector<int32_t> positions(6), doc_start(6);
  auto run = [&](LoaderOptions options) {
    ltor_masks_and_positions(tokens, kEod, options, mask.data(), positions.data(), doc_start.data());
  };
  run({});
  EXPECT_EQ(mask, (std::vector<float>{1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(doc_start, (std::vector<int32_t>{0, 0, 0, 0, 0, 0}));
  run({.eod_mask_loss = true});
  EXPECT_EQ(mask, (std::vector<float>{1, 0, 1, 1, 0, 1}));
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  run({.reset_position_ids = true});
  EXPECT_EQ(mask, (std::vector<float>{1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 0, 1, 2, 0}));
  EXPECT_EQ(doc_start, (std::vector<int32_t>{0, 0, 0, 0, 0, 0}));
  // attention_mask[(i+1):, :(i+1)] = 0 for each EOD i: token t sees [doc_start[t], t].
  run({.reset_attention_mask = true});
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(doc_start, (std::vector<int32_t>{0, 0, 2, 2, 2, 5}));
  run({.eod_mask_loss = true, .reset_position_ids = true, .reset_attention_mask = true});
  EXPECT_EQ(mask, (std::vector<float>{1, 0, 1, 1, 0, 1}));
  EXPECT_EQ(positions, (std::vector<int32_t>{0, 1, 0, 1, 2, 0}));
  EXPECT_EQ(doc_start, (std::vector<int32_t>{0, 0, 2, 2, 2, 5}));
}

TEST(GptSampleSource, SamplesFollowTheIndexIntoTheDocumentStream) {
  TempDir dir;
  const auto documents = make_documents(80, 1);
  write_dataset(dir.file("a"), documents, TokenDatasetFormat::megatron);
  const DataConfig config = config_for({dir.file("a")});
  const auto source = open_source(config);
  for (int s = 0; s < 3; ++s) {
    const Split split = static_cast<Split>(s);
    const IndexComponent& c = source->index().splits[static_cast<size_t>(s)].components.at(0);
    // The concatenation of the documents in document_index order, and where each one starts.
    std::vector<int32_t> stream;
    std::vector<int64_t> starts;
    for (const int32_t sequence : c.indices.document_index) {
      starts.push_back(static_cast<int64_t>(stream.size()));
      const auto& doc = documents[static_cast<size_t>(sequence)];
      stream.insert(stream.end(), doc.begin(), doc.end());
    }
    ASSERT_GE(source->split_size(split), config.num_samples[static_cast<size_t>(s)]);
    for (int64_t i = 0; i < source->split_size(split); ++i) {
      const int64_t row = c.indices.shuffled(i);
      const auto [position, offset] = c.indices.sample(row);
      const int64_t begin = starts[static_cast<size_t>(position)] + offset;
      const std::vector<int32_t> expected(stream.begin() + begin, stream.begin() + begin + config.seq_length + 1);
      ASSERT_EQ(text_of(*source, split, i, config.seq_length), expected) << "split " << s << " sample " << i;
    }
  }
}

TEST(GptSampleSource, RowsCarryMegatronsMasksAndShiftedLabels) {
  TempDir dir;
  write_dataset(dir.file("a"), make_documents(80, 2));
  const DataConfig config = config_for({dir.file("a")}, 16);
  const auto plain = open_source(config);
  const auto masked =
      open_source(config, {.eod_mask_loss = true, .reset_position_ids = true, .reset_attention_mask = true});
  EXPECT_FALSE(plain->document_attention());
  EXPECT_TRUE(masked->document_attention());
  const int seq = 16;
  std::vector<int32_t> tokens(seq), labels(seq), positions(seq), doc_start(seq);
  std::vector<float> mask(seq);
  int eods = 0;
  for (int64_t i = 0; i < 20; ++i) {
    const auto text = text_of(*masked, Split::train, i, seq);
    masked->rows(Split::train, i, seq, {tokens.data(), labels.data(), mask.data(), positions.data(), doc_start.data()});
    int32_t first = 0;
    for (int t = 0; t < seq; ++t) {
      EXPECT_EQ(tokens[t], text[static_cast<size_t>(t)]);
      EXPECT_EQ(labels[t], text[static_cast<size_t>(t) + 1]);
      EXPECT_EQ(mask[t], tokens[t] == kEod ? 0.0f : 1.0f);
      EXPECT_EQ(positions[t], t - first);
      EXPECT_EQ(doc_start[t], first);
      if (tokens[t] == kEod) {
        first = t + 1;
        ++eods;
      }
    }
    plain->rows(Split::train, i, seq, {tokens.data(), labels.data(), mask.data(), positions.data(), doc_start.data()});
    for (int t = 0; t < seq; ++t) {
      EXPECT_EQ(mask[t], 1.0f);
      EXPECT_EQ(positions[t], t);
      EXPECT_EQ(doc_start[t], 0);
    }
  }
  EXPECT_GT(eods, 10);  // the case exercises document boundaries
}

TEST(GptSampleSource, BlendRoutesSamplesToComponentsInProportion) {
  TempDir dir;
  write_dataset(dir.file("a"), make_documents(200, 3));
  write_dataset(dir.file("b"), make_documents(200, 4), TokenDatasetFormat::megatron);
  DataConfig config = config_for({"0.25", dir.file("a"), "0.75", dir.file("b")});
  config.num_samples = {400, 20, 20};
  const auto blend = open_source(config);
  const IndexSplit& train = blend->index().splits[0];
  ASSERT_TRUE(train.blended);
  ASSERT_EQ(train.components.size(), 2u);
  int64_t from_a = 0;
  for (int64_t i = 0; i < train.size(); ++i) from_a += blend->locate(Split::train, i).first == 0 ? 1 : 0;
  EXPECT_NEAR(static_cast<double>(from_a) / static_cast<double>(train.size()), 0.25, 0.01);

  // A blended sample is the component's own sample: compare with each prefix alone, built with
  // the component's sample count (the same GPTDataset).
  for (int k = 0; k < 2; ++k) {
    DataConfig alone = config_for({k == 0 ? dir.file("a") : dir.file("b")});
    alone.num_samples = {train.components[static_cast<size_t>(k)].num_samples, 0, 0};
    const auto single = open_source(alone);
    for (int64_t i = 0; i < 50; ++i) {
      const auto [component, inner] = blend->locate(Split::train, i);
      if (component != k) continue;
      EXPECT_EQ(text_of(*blend, Split::train, i, 8), text_of(*single, Split::train, inner, 8));
    }
  }
}

TEST(Sampler, RankSlicesCoverEachGroupOnce) {
  // MegatronPretrainingSampler: micro-batch m of rank r = consumed + m*mbs*D + r*mbs, mbs samples.
  const int mbs = 2, world = 3;
  const int64_t consumed = 8, total = 100;
  std::set<int64_t> seen;
  for (int64_t m = 0; m < 4; ++m) {
    for (int r = 0; r < world; ++r) {
      const int64_t first = pretraining_sampler_first(total, consumed, mbs, r, world, m);
      EXPECT_EQ(first, consumed + m * mbs * world + r * mbs);
      for (int b = 0; b < mbs; ++b) EXPECT_TRUE(seen.insert(first + b).second);
    }
  }
  EXPECT_EQ(*seen.begin(), consumed);
  EXPECT_EQ(*seen.rbegin(), consumed + 4 * mbs * world - 1);
  // drop_last: the group [98, 104) does not fit in 100 samples.
  EXPECT_EQ(pretraining_sampler_first(total, 92, mbs, 2, world, 0), 96);
  EXPECT_THROW(pretraining_sampler_first(total, 98, mbs, 0, world, 0), Error);
  EXPECT_THROW(pretraining_sampler_first(total, 0, mbs, 3, world, 0), UsageError);
  EXPECT_EQ(pretraining_sampler_first(-1, 1000000, mbs, 1, world, 5), 1000000 + 30 + 2);  // unbounded
}

TEST(Sampler, ResumeReadsTheTailOfARunFromZero) {
  TempDir dir;
  write_dataset(dir.file("a"), make_documents(120, 5));
  const auto source = open_source(config_for({dir.file("a")}));
  const int mbs = 2, world = 2, rank = 1;
  const int64_t global = 8;  // 2 micro-batches per step per rank
  auto run = [&](int64_t consumed, int steps) {
    std::vector<std::vector<int32_t>> samples;
    for (int step = 0; step < steps; ++step) {
      for (int64_t m = 0; m < global / (mbs * world); ++m) {
        const int64_t first =
            pretraining_sampler_first(source->split_size(Split::train), consumed, mbs, rank, world, m);
        for (int b = 0; b < mbs; ++b) samples.push_back(text_of(*source, Split::train, first + b, 8));
      }
      consumed += global;
    }
    return samples;
  };
  const auto from_zero = run(0, 6);
  const auto resumed = run(2 * global, 4);
  ASSERT_EQ(resumed.size(), from_zero.size() - 2 * global / world);
  EXPECT_TRUE(std::equal(resumed.begin(), resumed.end(), from_zero.end() - static_cast<ptrdiff_t>(resumed.size())));
}

TEST(MegatronCounts, TrainingPyFormulas) {
  // train_iters 100, gbs 8, eval every 30 for 5: valid (100 // 30 + 1) * 5 * 8, test 5 * 8.
  EXPECT_EQ(megatron_num_samples(100, 0, 8, 30, 5), (std::array<int64_t, 3>{800, 160, 40}));
  // train_samples 1000, gbs 8: iters 125.
  EXPECT_EQ(megatron_num_samples(0, 1000, 8, 30, 5), (std::array<int64_t, 3>{1000, 200, 40}));
  EXPECT_EQ(megatron_num_samples(10, 0, 4, 100, 0), (std::array<int64_t, 3>{40, 0, 0}));
  EXPECT_THROW(megatron_num_samples(10, 10, 4, 1, 1), UsageError);
}

TEST(ParseBlend, MegatronsListRules) {
  Blend one = parse_blend({"x"}, "--data-path");
  EXPECT_EQ(one.prefixes, std::vector<std::string>{"x"});
  EXPECT_FALSE(one.weights);
  Blend two = parse_blend({"x", "y"}, "--data-path");
  EXPECT_EQ(two.prefixes, (std::vector<std::string>{"x", "y"}));
  EXPECT_FALSE(two.weights);
  Blend weighted = parse_blend({"0.3", "x", "0.7", "y"}, "--data-path");
  EXPECT_EQ(weighted.prefixes, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(*weighted.weights, (std::vector<double>{0.3, 0.7}));
  EXPECT_THROW(parse_blend({"0", "x", "0", "y"}, "--data-path"), UsageError);  // weights sum to zero
  EXPECT_THROW(parse_blend({"-1", "x", "2", "y"}, "--data-path"), UsageError);
  // Probe case U13: a negative and a zero weight get the same rule, naming the weight.
  for (const char* bad : {"-1", "0"}) {
    try {
      parse_blend({"1", "x", bad, "y"}, "--data-path");
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("--data-path: every blend weight must be positive and finite (got ") + bad + ")");
    }
  }
  EXPECT_THROW(parse_blend({"0.3", "x", "y", "z"}, "--data-path"), UsageError);
  EXPECT_THROW(parse_blend({}, "--data-path"), UsageError);
}

TEST(SampleIndexCache, BuiltOnceThenReusedUnderTheMd5Name) {
  TempDir dir;
  write_dataset(dir.file("a"), make_documents(80, 6));
  const DataConfig config = config_for({dir.file("a")});
  EXPECT_EQ(index_file_name(config), md5_hex(index_parameters(config).dump()) + "-mt-sample-index.h5");
  EXPECT_EQ(default_cache_dir(config), dir.file("a") + "/cache/GPTDataset_indices");
  const auto datasets = open_datasets(config);
  const std::string path = dir.file("cache/sub/" + index_file_name(config));
  bool built = false;
  EXPECT_THROW(load_or_build_index(config, datasets, path, false), Error);
  load_or_build_index(config, datasets, path, true, &built);
  EXPECT_TRUE(built);
  load_or_build_index(config, datasets, path, true, &built);
  EXPECT_FALSE(built);
  DataConfig other = config;
  other.seed = 7;
  EXPECT_NE(index_file_name(other), index_file_name(config));
}

TEST(SampleIndexBuild, BadInputIsRefusedBeforeWriting) {
  TempDir dir;
  write_dataset(dir.file("a"), make_documents(20, 7));
  const size_t before = dir.entry_count();
  auto refuses = [&](DataConfig config, const std::string& fragment) {
    try {
      const auto datasets = open_datasets(config);
      load_or_build_index(config, datasets, dir.file("out/index.h5"), true);
      FAIL() << "expected: " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  DataConfig config = config_for({dir.file("a")});
  config.split = "98,1,1";  // 20 sequences: valid [20, 20) is empty
  refuses(config, "the valid split of");
  config = config_for({dir.file("a")}, 500);
  refuses(config, "--seq-length 500: longer than the train split");
  config = config_for({dir.file("a")});
  config.split = "0,0,0";
  refuses(config, "split");
  config = config_for({dir.file("a")});
  config.seq_length = 1;
  refuses(config, "--seq-length");
  config = config_for({dir.file("missing")});
  refuses(config, "missing");
  EXPECT_EQ(dir.entry_count(), before);  // nothing written

  // A split of weight 0 is absent (as in Megatron), not an error.
  config = config_for({dir.file("a")});
  config.split = "100,0,0";
  const auto source = open_source(config);
  EXPECT_EQ(source->split_size(Split::valid), 0);
  EXPECT_GE(source->split_size(Split::train), 60);
  // EOD flags need an end-of-document id: Megatron .bin/.idx records none.
  write_dataset(dir.file("m"), make_documents(80, 8), TokenDatasetFormat::megatron);
  const auto datasets = open_datasets(config_for({dir.file("m")}));
  EXPECT_NO_THROW(loader_eod_id(datasets, {}));
  EXPECT_THROW(loader_eod_id(datasets, {.eod_mask_loss = true}), UsageError);
}

// mt-shard: build Megatron-exact sample indices (train/valid/test splits, weighted blends, epochs,
// seeded shuffles) over token datasets into one HDF5 file, and inspect them (datasets, splits,
// blend shares, length histogram, the samples a data-parallel rank reads); print Megatron's BERT
// samples and masks of a pre-split sentence dataset (bert-samples, for debugging BERT data).
// Tested by tests/tools/mt-shard.bats, tests/tools/mt-shard-bert.bats and tests/tools/conventions.bats.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_runtime.h"
#include "core/error.h"
#include "core/log.h"
#include "data/bert_dataset.h"
#include "tools/common/bert_vocabulary.h"
#include "data/gpt_dataset.h"
#include "text/tokenizer.h"
#include "tools/common/flags.h"
#include "tools/common/tool_main.h"

namespace {

using mt::tools::Record;

struct BuildOptions {
  mt::tools::DataPathFlags paths;
  int64_t seq_length = 0;
  int64_t seed = 1234;
  int64_t train_samples = 0, train_iters = 0, global_batch_size = 1, eval_interval = 1000, eval_iters = 100;
  std::string output;
};

struct InspectOptions {
  std::string index;
  int64_t show_samples = 0;
  std::string show_split = "train";
  int64_t consumed_samples = 0;
  int micro_batch_size = 1, data_parallel_size = 1, data_parallel_rank = 0;
  mt::text::TokenizerOptions tokenizer;  // decodes the shown samples when a type is given
};

struct BertOptions {
  std::string data_path;
  std::string split = "969, 30, 1";
  std::string show_split = "train";
  int64_t seq_length = 512;
  int64_t seed = 1234;
  int64_t num_samples = 0;
  double short_seq_prob = 0.1;
  double mask_prob = 0.15;
  bool no_binary_head = false;
  int64_t show_samples = 4;
  int64_t first_sample = 0;
  mt::text::TokenizerOptions tokenizer;
};

struct Options {
  BuildOptions build;
  InspectOptions inspect;
  BertOptions bert;
  CLI::App* build_command = nullptr;
  CLI::App* inspect_command = nullptr;
  CLI::App* bert_command = nullptr;
};

mt::data::DataConfig data_config(const BuildOptions& o) {
  mt::data::DataConfig data;
  mt::tools::apply_data_path_flags(o.paths, data);
  data.seq_length = o.seq_length;
  data.seed = o.seed;
  data.num_samples = mt::data::megatron_num_samples(o.train_iters, o.train_samples, o.global_batch_size,
                                                    o.eval_interval, o.eval_iters);
  mt::data::validate_data_config(data);
  return data;
}

int run_build(mt::tools::ToolCli& cli, const BuildOptions& o) {
  if (!o.output.empty() && !o.paths.data_cache_path.empty())
    throw mt::UsageError("--output", "conflicts with --data-cache-path");
  const mt::data::DataConfig data = data_config(o);
  std::vector<mt::data::TokenDataset> datasets = mt::data::open_datasets(data);
  const std::string path =
      !o.output.empty()
          ? o.output
          : (std::filesystem::path(o.paths.data_cache_path.empty() ? mt::data::default_cache_dir(data)
                                                                  : o.paths.data_cache_path) /
             mt::data::index_file_name(data))
                .string();
  const auto start = std::chrono::steady_clock::now();
  // Under MPI rank 0 builds while the others wait, then every rank checks the file.
  const std::unique_ptr<mt::comm::Communicator> world = mt::comm::make_world_communicator();
  const bool rank0 = world->rank() == 0;
  bool built = false;
  mt::data::SampleIndex index;
  if (rank0) index = mt::data::load_or_build_index(data, datasets, path, true, &built);
  world->barrier();
  if (!rank0) index = mt::data::load_or_build_index(data, datasets, path, false);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (rank0)
    mt::log::info(std::string("mt-shard: ") + (built ? "built " : "up to date, kept ") + path +
                  " for samples (train, valid, test) = (" + std::to_string(data.num_samples[0]) + ", " +
                  std::to_string(data.num_samples[1]) + ", " + std::to_string(data.num_samples[2]) + ")");

  mt::tools::RecordWriter writer(cli.output_format(), stdout, rank0);
  writer.write_run(mt::tools::run_record(cli));
  Record record{{"record", "index"},
                {"path", path},
                {"built", built},
                {"seconds", seconds},
                {"parameters_md5", mt::data::md5_hex(index.parameters.dump())}};
  for (size_t s = 0; s < 3; ++s) {
    const auto& split = index.splits[s];
    record[std::string(mt::data::split_name(static_cast<mt::data::Split>(s))) + "_samples"] =
        split.present ? Record(split.size()) : Record(nullptr);
  }
  writer.write(record);
  writer.finish();
  return 0;
}

// Power-of-two bins of sequence lengths: [0, 1), [1, 2), [2, 4), ...
void write_histogram(mt::tools::RecordWriter& writer, const std::string& prefix, std::span<const int32_t> lengths) {
  std::vector<int64_t> bins;
  for (const int32_t length : lengths) {
    size_t bin = 0;
    while (bin < 40 && (int64_t{1} << bin) <= length) ++bin;
    if (bins.size() <= bin) bins.resize(bin + 1, 0);
    ++bins[bin];
  }
  for (size_t bin = 0; bin < bins.size(); ++bin) {
    if (bins[bin] == 0) continue;
    const int64_t low = bin == 0 ? 0 : int64_t{1} << (bin - 1);
    const int64_t high = int64_t{1} << bin;
    writer.write(Record{{"record", "histogram"},
                        {"prefix", prefix},
                        {"length_from", low},
                        {"length_to", high},
                        {"sequences", bins[bin]}});
  }
}

int run_inspect(mt::tools::ToolCli& cli, const InspectOptions& o) {
  mt::data::SampleIndex index = mt::data::read_sample_index(o.index);
  // The datasets the index was built over, checked against what it recorded.
  std::vector<mt::data::TokenDataset> datasets;
  for (const auto& entry : index.datasets) {
    mt::data::TokenDataset dataset = mt::data::TokenDataset::open(entry.value("prefix", std::string()));
    if (dataset.sequence_count() != entry.value("sequences", int64_t{-1}) ||
        dataset.token_count() != entry.value("tokens", int64_t{-1})) {
      throw mt::Error(o.index, "stale: " + dataset.path() + " changed since the index was built");
    }
    datasets.push_back(std::move(dataset));
  }

  mt::tools::RecordWriter writer(cli.output_format(), stdout, mt::comm::MpiRuntime::rank() == 0);
  writer.write_run(mt::tools::run_record(cli));
  writer.write(Record{{"record", "parameters"},
                      {"path", o.index},
                      {"seq_length", index.parameters.value("seq_length", int64_t{0})},
                      {"seed", index.parameters.value("seed", int64_t{0})},
                      {"split", index.parameters.value("split", std::string())},
                      {"parameters_md5", mt::data::md5_hex(index.parameters.dump())}});
  for (size_t d = 0; d < datasets.size(); ++d) {
    const auto& dataset = datasets[d];
    writer.write(Record{{"record", "dataset"},
                        {"dataset", d},
                        {"prefix", index.datasets[d].value("prefix", std::string())},
                        {"format", dataset.format() == mt::data::TokenDatasetFormat::hdf5 ? "hdf5" : "megatron"},
                        {"dtype", std::string(mt::dtype_name(dataset.dtype()))},
                        {"documents", dataset.document_count()},
                        {"sequences", dataset.sequence_count()},
                        {"tokens", dataset.token_count()},
                        {"vocab_size", dataset.vocab_size()},
                        {"eod_id", dataset.metadata().eod_id}});
  }
  for (size_t s = 0; s < 3; ++s) {
    const auto& split = index.splits[s];
    if (!split.present) continue;
    const std::string name(mt::data::split_name(static_cast<mt::data::Split>(s)));
    int64_t sequences = 0, documents = 0, tokens = 0, epochs = 0;
    for (const auto& c : split.components) {
      const auto document_indices = datasets[static_cast<size_t>(c.dataset)].document_indices();
      sequences += c.sequence_end - c.sequence_begin;
      for (size_t i = 0; i + 1 < document_indices.size(); ++i) {
        documents += document_indices[i] >= c.sequence_begin && document_indices[i] < c.sequence_end ? 1 : 0;
      }
      tokens += c.indices.num_tokens_per_epoch;
      epochs = std::max(epochs, c.indices.num_epochs);
    }
    writer.write(Record{{"record", "split"},
                        {"split", name},
                        {"requested", split.num_samples},
                        {"samples", split.size()},
                        {"blended", split.blended},
                        {"documents", documents},
                        {"sequences", sequences},
                        {"tokens", tokens},
                        {"epochs", epochs}});
    std::vector<int64_t> drawn(split.components.size(), 0);
    if (split.blended) {
      for (const int16_t k : split.dataset_index) ++drawn[static_cast<size_t>(k)];
    } else {
      drawn[0] = split.size();
    }
    const auto& blend = index.parameters[index.parameters["data_path"].is_null() ? name + "_data_path" : "data_path"];
    for (size_t k = 0; k < split.components.size(); ++k) {
      const auto& c = split.components[k];
      double weight = 1.0;
      if (blend.is_object() && blend["weights"].is_array()) {
        double sum = 0;
        for (const auto& w : blend["weights"]) sum += w.get<double>();
        weight = blend["weights"][k].get<double>() / sum;
      }
      writer.write(
          Record{{"record", "blend"},
                 {"split", name},
                 {"component", k},
                 {"prefix", index.datasets[static_cast<size_t>(c.dataset)].value("prefix", std::string())},
                 {"weight", weight},
                 {"share", split.size() > 0 ? static_cast<double>(drawn[k]) / static_cast<double>(split.size()) : 0.0},
                 {"samples", drawn[k]},
                 {"component_samples", c.size()},
                 {"epochs", c.indices.num_epochs},
                 {"sequence_begin", c.sequence_begin},
                 {"sequence_end", c.sequence_end}});
    }
  }
  for (size_t d = 0; d < datasets.size(); ++d) {
    write_histogram(writer, index.datasets[d].value("prefix", std::string()), datasets[d].sequence_lengths());
  }

  if (o.show_samples > 0) {
    const auto split = o.show_split == "train"   ? mt::data::Split::train
                       : o.show_split == "valid" ? mt::data::Split::valid
                                                 : mt::data::Split::test;
    const int64_t seq_length = index.parameters.value("seq_length", int64_t{0});
    std::unique_ptr<mt::text::Tokenizer> tokenizer;
    if (!o.tokenizer.type.empty()) {
      tokenizer = mt::text::Tokenizer::load(o.tokenizer);
      for (const auto& dataset : datasets) {
        const std::string& recorded = dataset.metadata().tokenizer_hash;
        if (!recorded.empty() && recorded != tokenizer->hash()) {
          mt::log::warn("mt-shard: " + dataset.path() + " was tokenized by " + dataset.metadata().tokenizer + " (" +
                        recorded + "), not by " + tokenizer->name() + " (" + tokenizer->hash() + ")");
        }
      }
    }
    mt::data::GptSampleSource source(std::move(datasets), std::move(index), o.index, seq_length, {});
    const int64_t total = source.split_size(split);
    std::vector<int32_t> tokens(static_cast<size_t>(seq_length) + 1);  // (seq + 1,)
    for (int64_t i = 0; i < o.show_samples; ++i) {
      const int64_t micro_batch = i / o.micro_batch_size;
      const int64_t sample =
          mt::data::pretraining_sampler_first(total, o.consumed_samples, o.micro_batch_size, o.data_parallel_rank,
                                              o.data_parallel_size, micro_batch) +
          i % o.micro_batch_size;
      source.sample(split, sample, tokens.data());
      const auto [component, inner] = source.locate(split, sample);
      Record record{{"record", "sample"},     {"split", o.show_split},         {"micro_batch", micro_batch},
                    {"sample", sample},       {"component", component},        {"component_sample", inner},
                    {"tokens", tokens}};
      if (tokenizer) {
        const auto real = std::find(tokens.begin(), tokens.end(), -1);  // -1 pads past the data
        record["text"] = tokenizer->decode(std::span<const int32_t>(tokens.data(), real - tokens.begin()));
      }
      writer.write(record);
    }
  }
  writer.finish();
  return 0;
}

// mt-shard bert-samples: the split's BERT sample index, then samples first..first+N-1 as JSONL.
int run_bert_samples(mt::tools::ToolCli& cli, const BertOptions& o) {
  if (o.num_samples < 1) throw mt::UsageError("--num-samples", "must be >= 1 (the split's sample count)");
  const auto tokenizer = mt::text::Tokenizer::load(o.tokenizer);
  const mt::data::BertVocabulary vocabulary = mt::tools::bert_vocabulary(*tokenizer);
  const mt::data::TokenDataset dataset = mt::data::TokenDataset::open(o.data_path);
  const mt::data::Split split = o.show_split == "train"   ? mt::data::Split::train
                                : o.show_split == "valid" ? mt::data::Split::valid
                                                          : mt::data::Split::test;
  mt::data::BertDatasetConfig config;
  config.index.seq_length = o.seq_length;
  config.index.seed = o.seed;
  config.index.short_seq_prob = o.short_seq_prob;
  config.index.binary_head = !o.no_binary_head;
  config.index.num_samples = o.num_samples;
  config.mask_prob = o.mask_prob;
  const mt::data::BertDataset bert(dataset, o.split, split, vocabulary, config);

  mt::tools::RecordWriter writer(cli.output_format(), stdout, mt::comm::MpiRuntime::rank() == 0);
  writer.write_run(mt::tools::run_record(cli));
  writer.write(Record{{"record", "bert_index"},
                      {"split", o.show_split},
                      {"document_begin", bert.documents().begin},
                      {"document_end", bert.documents().end},
                      {"samples", bert.size()},
                      {"vocab_size", vocabulary.vocab_size()}});
  const int64_t end = std::min(bert.size(), o.first_sample + o.show_samples);
  for (int64_t i = o.first_sample; i < end; ++i) {
    const auto& row = bert.index()[static_cast<size_t>(i)];
    const mt::data::BertSample sample = bert.sample(i);
    writer.write(Record{{"record", "bert_sample"},
                        {"split", o.show_split},
                        {"sample", i},
                        {"first_sentence", row.first_sentence},
                        {"end_sentence", row.end_sentence},
                        {"target_length", row.target_length},
                        {"is_random", sample.is_random},
                        {"truncated", sample.truncated},
                        {"tokens", sample.tokens},
                        {"types", sample.types},
                        {"labels", sample.labels},
                        {"loss_mask", sample.loss_mask},
                        {"padding_mask", sample.padding_mask}});
  }
  writer.finish();
  return 0;
}

// `mt-shard --help` shows every command's flags, not only the command names.
class ExpandedHelp : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Normal && app->get_parent() == nullptr) mode = CLI::AppFormatMode::All;
    return CLI::Formatter::make_help(app, std::move(name), mode);
  }
};

void define_bert_samples(mt::tools::ToolCli& cli, Options& o) {
  BertOptions& b = o.bert;
  CLI::App* bert = cli.app().add_subcommand(
      "bert-samples",
      "Print Megatron-Core's BERT samples of a pre-split sentence dataset (one sequence per sentence): the sample\n"
      "index (sentence runs, short targets, documents split), then each sample's masked tokens, types, labels,\n"
      "loss and padding masks and sentence-order label, as BERTMaskedWordPieceDataset gives them");
  o.bert_command = bert;
  using mt::tools::FlagSpec;
  static const FlagSpec data_path =
      mt::tools::text_flag("--data-path", "Sentence token dataset prefix (one; .h5 or .bin/.idx)");
  mt::tools::add_flag(*bert, data_path, b.data_path)->required();
  mt::tools::add_flag(*bert, "--split", b.split, "Train/valid/test proportions, split over documents (BERT)")
      ->capture_default_str();
  static const FlagSpec show_split =
      mt::tools::text_flag("--show-split", "Split whose samples are shown", {"train", "valid", "test"});
  mt::tools::add_flag(*bert, show_split, b.show_split)->capture_default_str();
  mt::tools::add_flag(*bert, "--seq-length", b.seq_length, "Tokens per sample, [CLS] and [SEP]s included")
      ->capture_default_str();
  mt::tools::add_flag(*bert, "--seed", b.seed, "Megatron's --seed (sample index and masks)")->capture_default_str();
  static const FlagSpec num_samples = mt::tools::integer_flag(
      "--num-samples", "The split's sample count (Megatron's train/valid/test samples): whole epochs up to it",
      mt::tools::at_least(1));
  mt::tools::add_flag(*bert, num_samples, b.num_samples)->required();
  static const FlagSpec short_seq_prob = mt::tools::real_flag(
      "--short-seq-prob", "Probability of a shorter target length", mt::tools::between(0, 1));
  static const FlagSpec mask_prob =
      mt::tools::real_flag("--mask-prob", "Share of tokens masked", mt::tools::between(0, 1, true));
  mt::tools::add_flag(*bert, short_seq_prob, b.short_seq_prob)->capture_default_str();
  mt::tools::add_flag(*bert, mask_prob, b.mask_prob)->capture_default_str();
  static const FlagSpec no_binary_head = mt::tools::toggle_flag(
      "--bert-no-binary-head", "No sentence-order head: one segment per sample, one sentence suffices");
  mt::tools::add_flag(*bert, no_binary_head, b.no_binary_head);
  static const FlagSpec show_samples =
      mt::tools::integer_flag("--show-samples", "Samples printed", mt::tools::at_least(0));
  static const FlagSpec first_sample =
      mt::tools::integer_flag("--first-sample", "Index of the first printed sample", mt::tools::at_least(0));
  mt::tools::add_flag(*bert, show_samples, b.show_samples)->capture_default_str();
  mt::tools::add_flag(*bert, first_sample, b.first_sample)->capture_default_str();
  mt::tools::add_tokenizer_flags(*bert, b.tokenizer, true, "The WordPiece vocabulary (## pieces, special ids)");
  cli.add_output_format(*bert);
}

void define(mt::tools::ToolCli& cli, Options& o) {
  CLI::App& app = cli.app();
  app.formatter(std::make_shared<ExpandedHelp>());
  app.require_subcommand(0, 1);  // none is a usage error in run(), after unknown flags are reported
  app.footer(
      "Example: mt-shard build --data-path 0.3 web 0.7 books --split 969,30,1 --seq-length 1024 --train-iters 5000\n"
      "  --global-batch-size 256 --eval-interval 500 --eval-iters 10 --data-cache-path cache; then\n"
      "  mt-shard inspect cache/<md5>-mt-sample-index.h5 --show-samples 4 --json\n"
      "Indices follow Megatron-Core's GPTDataset/BlendedDataset exactly (numpy RandomState shuffles, epochs, the\n"
      "separate last epoch, blend surplus); mt-train run with the same data flags finds the same file by the md5\n"
      "of its parameters, and any reader refuses an index built for other parameters or data.");

  BuildOptions& b = o.build;
  CLI::App* build =
      app.add_subcommand("build", "Build the train/valid/test sample index of token datasets into one HDF5 file");
  o.build_command = build;
  mt::tools::add_data_path_flags(*build, b.paths);
  mt::tools::add_flag(*build, "--seq-length", b.seq_length, "Tokens per sample (each sample reads seq-length + 1)")
      ->required();
  mt::tools::add_flag(*build, "--seed", b.seed, "Seed of the shuffles (numpy RandomState)")->capture_default_str();
  mt::tools::add_flag(*build, "--train-samples", b.train_samples, "Training samples (or --train-iters)");
  mt::tools::add_flag(*build, "--train-iters", b.train_iters,
                      "Training iterations: train samples = iters x global batch");
  mt::tools::add_flag(*build, "--global-batch-size", b.global_batch_size, "Samples per iteration")
      ->capture_default_str();
  mt::tools::add_flag(*build, "--eval-interval", b.eval_interval,
                      "Iterations between evaluations: valid samples = (iters / interval + 1) x eval-iters x gbs")
      ->capture_default_str();
  mt::tools::add_flag(*build, "--eval-iters", b.eval_iters,
                      "Batches per evaluation (and test samples = eval-iters x gbs)")
      ->capture_default_str();
  static const mt::tools::FlagSpec output =
      mt::tools::text_flag("--output", "Index file to write (default: the cache directory's md5-named file)");
  mt::tools::add_flag(*build, output, b.output);
  cli.add_output_format(*build);

  InspectOptions& i = o.inspect;
  CLI::App* inspect = app.add_subcommand("inspect",
                                         "Describe a sample index: datasets, splits, blend shares, "
                                         "length histogram, and the samples a data-parallel rank reads");
  o.inspect_command = inspect;
  inspect->add_option("index", i.index, "Sample index file (HDF5)")->required();
  using mt::tools::FlagSpec;
  using mt::tools::integer_flag;
  using mt::tools::text_flag;
  static const FlagSpec show_samples =
      integer_flag("--show-samples", "Print the tokens of this many samples", mt::tools::at_least(0));
  static const FlagSpec show_split =
      text_flag("--show-split", "Split of the shown samples", {"train", "valid", "test"});
  static const FlagSpec consumed =
      integer_flag("--consumed-samples", "Samples consumed before the shown ones (resume)", mt::tools::at_least(0));
  static const FlagSpec dp_size =
      integer_flag("--data-parallel-size", "Data-parallel ranks of the sampler", mt::tools::at_least(1));
  static const FlagSpec dp_rank =
      integer_flag("--data-parallel-rank", "The rank whose samples are shown", mt::tools::at_least(0));
  mt::tools::add_flag(*inspect, show_samples, i.show_samples)->capture_default_str();
  mt::tools::add_flag(*inspect, show_split, i.show_split)->capture_default_str();
  mt::tools::add_flag(*inspect, consumed, i.consumed_samples)->capture_default_str();
  mt::tools::add_flag(*inspect, "--micro-batch-size", i.micro_batch_size, "Micro-batch size of the sampler")
      ->capture_default_str();
  mt::tools::add_flag(*inspect, dp_size, i.data_parallel_size)->capture_default_str();
  mt::tools::add_flag(*inspect, dp_rank, i.data_parallel_rank)->capture_default_str();
  mt::tools::add_tokenizer_flags(*inspect, i.tokenizer, false, "Decoding the shown samples");
  cli.add_output_format(*inspect);
  define_bert_samples(cli, o);
}

int run(mt::tools::ToolCli& cli, Options& o) {
  if (o.build_command->parsed()) return run_build(cli, o.build);
  if (o.bert_command->parsed()) return run_bert_samples(cli, o.bert);
  if (!o.inspect_command->parsed())
    throw mt::UsageError("subcommand", "build, inspect or bert-samples is required (see mt-shard --help)");
  const InspectOptions& i = o.inspect;
  if (i.data_parallel_rank >= i.data_parallel_size) {
    throw mt::UsageError("--data-parallel-rank " + std::to_string(i.data_parallel_rank),
                         "must be below --data-parallel-size " + std::to_string(i.data_parallel_size));
  }
  const bool tokenizer_flags = o.inspect_command->count("--vocab-file") + o.inspect_command->count("--merge-file") +
                                   o.inspect_command->count("--tokenizer-model") +
                                   o.inspect_command->count("--tiktoken-num-special-tokens") > 0;
  if ((tokenizer_flags || !i.tokenizer.type.empty()) && (i.tokenizer.type.empty() || i.show_samples == 0)) {
    throw mt::UsageError("--tokenizer-type", "decodes shown samples: give it with --show-samples N");
  }
  return run_inspect(cli, o.inspect);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  return mt::tools::tool_main(
      argc, argv, "mt-shard",
      "Split, blend and shuffle token datasets into Megatron-exact sample indices (HDF5); inspect them.",
      [&](mt::tools::ToolCli& cli) { define(cli, options); },
      [&](mt::tools::ToolCli& cli) { return run(cli, options); });
}

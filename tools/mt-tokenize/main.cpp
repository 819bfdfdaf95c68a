// mt-tokenize: exact byte-level BPE over JSONL or text. The default command is Megatron's
// tools/preprocess_data.py (JSONL in, HDF5 and/or Megatron .bin/.idx token datasets out, a
// summary record on stdout); `encode` and `decode` turn text into ids and back for debugging
// and shell pipes; `train` learns a byte-level BPE vocabulary in GPT-2's two-file format.
// Tested by tests/tools/mt-tokenize.bats, tests/tools/mt-tokenize-partitions.bats and
// tests/tools/conventions.bats.
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/input_file.h"
#include "text/bpe_trainer.h"
#include "text/pretokenize.h"
#include "text/preprocess.h"
#include "text/sentencepiece_tokenizer.h"
#include "text/tokenizer.h"
#include "tools/common/flags.h"
#include "tools/common/tool_main.h"

namespace {

using mt::tools::Record;

struct TokenizeOptions {
  mt::text::TokenizerOptions tokenizer;
  std::vector<std::string> inputs;
  std::vector<std::string> json_keys{"text"};
  std::string output_prefix;
  std::string output_format = "hdf5";
  int workers = 1;
  bool append_eod = false, allow_special = false, skip_bad_lines = false, split_sentences = false, keep_newlines = false;
  int64_t max_line_bytes = int64_t{64} << 20;
  int64_t log_interval = 100000;
  int partitions = 1;
  bool keep_sequential_samples = false;
  // Megatron-Core's SentencePiece wrapper options: only their defaults are implemented.
  bool sentencepiece_legacy = false, sentencepiece_ignore_extra_whitespaces = true;
  // encode / decode
  bool raw = false;
  std::string ids_format = "text";
  // train
  int64_t vocab_size = 0;
  int64_t min_frequency = 2;
  std::string output_dir;
  std::string pattern = "gpt2";
};

// mt-tokenize's own flags (Megatron's preprocess_data spellings where it has them).
namespace flag {
using mt::tools::FlagSpec;
using mt::tools::integer_flag;
using mt::tools::list_flag;
using mt::tools::text_flag;
const FlagSpec input = list_flag("--input", "Input files, read one after another ('-' = stdin); with --partitions one glob pattern");
const FlagSpec workers =
    integer_flag("--workers", "Tokenizing threads; output is identical for every count", mt::tools::at_least(1));
const FlagSpec max_line_bytes = integer_flag("--max-line-bytes", "Longest input line accepted", mt::tools::at_least(1));
const FlagSpec partitions =
    integer_flag("--partitions",
                 "Megatron's input partitions: --input is a glob whose lines are dealt round robin to N "
                 "partitions and written in partition order (Megatron's bytes); under MPI the ranks tokenize "
                 "the chunks they claim from rank 0 and write their tokens where rank 0 places them "
                 "(on a filesystem they share; a rank without it sends them to rank 0); no partition "
                 "files are written, and per-partition outputs only as temporaries appended to the outputs",
                 mt::tools::at_least(1));
const FlagSpec log_interval =
    integer_flag("--log-interval", "Progress line on stderr every N documents (0: none)", mt::tools::at_least(0));
const FlagSpec output_format =
    text_flag("--output-format", "hdf5, megatron (.bin/.idx) or both", {"hdf5", "megatron", "both"});
const FlagSpec ids_format =
    text_flag("--format", "Ids as space-separated text or a JSON array per line", {"text", "jsonl"});
const FlagSpec vocab_size =
    integer_flag("--vocab-size", "Vocabulary size, special token included", mt::tools::between(1, 2147483648.0L));
const FlagSpec min_frequency =
    integer_flag("--min-frequency", "Least count of a pair to merge", mt::tools::at_least(0));
const FlagSpec pattern = text_flag("--pattern", "Pre-tokenizer", {"gpt2", "cl100k"});
}  // namespace flag

void add_input_options(CLI::App& app, TokenizeOptions& options, const std::string& default_input) {
  mt::tools::add_flag(app, flag::input, options.inputs)->expected(1, -1)->default_str(default_input);
  mt::tools::add_flag(app, flag::workers, options.workers)->capture_default_str();
  app.add_flag("--allow-special", options.allow_special,
               "Turn special-token text (e.g. <|endoftext|>) into its id; by default it is ordinary text");
  mt::tools::add_flag(app, flag::max_line_bytes, options.max_line_bytes)->capture_default_str();
}

// Megatron-Core's two SentencePiece wrapper flags. Their defaults (no legacy special-token
// splitting; extra whitespace as the model's normalizer treats it) are what mt does; any other value
// is refused by name, as --allow-special is for a SentencePiece model (control-piece text stays text).
void add_sentencepiece_flags(CLI::App& app, TokenizeOptions& options) {
  app.add_flag("--tokenizer-sentencepiece-legacy", options.sentencepiece_legacy,
               "SentencePiece: Megatron-Core's legacy special-token splitting (refused: not implemented)");
  app.add_flag("--tokenizer-sentencepiece-ignore-extra-whitespaces{true}", options.sentencepiece_ignore_extra_whitespaces,
               "SentencePiece: the default (true) only; =false is refused (not implemented)");
}

void check_sentencepiece_flags(const TokenizeOptions& options) {
  if (options.sentencepiece_legacy) {
    throw mt::UsageError("--tokenizer-sentencepiece-legacy", "is not supported (Megatron-Core's default, off, is)");
  }
  if (!options.sentencepiece_ignore_extra_whitespaces) {
    throw mt::UsageError("--tokenizer-sentencepiece-ignore-extra-whitespaces",
                         "false is not supported (Megatron-Core's default, true, is)");
  }
  if (options.allow_special && mt::text::is_sentencepiece_type(options.tokenizer.type)) {
    throw mt::UsageError("--allow-special", "does not apply to " + options.tokenizer.type +
                                                ": sentencepiece never turns control-piece text into ids");
  }
}

mt::text::LineInputOptions line_input(const TokenizeOptions& options) {
  mt::text::LineInputOptions input;
  input.inputs = options.inputs;
  input.max_line_bytes = static_cast<size_t>(options.max_line_bytes);
  return input;
}

double megabytes_per_second(int64_t bytes, double seconds) { return seconds > 0 ? bytes / 1e6 / seconds : 0; }

Record summary_record(const mt::text::PreprocessStats& stats, const TokenizeOptions& options, const std::string& tokenizer) {
  Record record;
  record["record"] = "summary";
  record["tokenizer"] = tokenizer;
  record["workers"] = options.workers;
  record["documents"] = stats.documents;
  record["empty_documents"] = stats.empty_documents;
  record["sequences"] = stats.sequences;
  record["tokens"] = stats.tokens;
  record["bytes"] = stats.input_bytes;
  record["text_bytes"] = stats.text_bytes;
  record["seconds"] = stats.seconds;
  record["mb_per_s"] = megabytes_per_second(stats.input_bytes, stats.seconds);
  record["replaced"] = stats.replaced;
  record["bad_lines"] = stats.bad_lines;
  record["blank_lines"] = stats.blank_lines;
  record["outputs"] = stats.outputs;
  return record;
}

using TokenizerLoad = std::future<std::unique_ptr<mt::text::Tokenizer>>;

// A progress line on stderr every `interval` documents (Megatron's --log-interval).
mt::text::PreprocessProgress progress_every(int64_t interval) {
  auto next = std::make_shared<int64_t>(interval);
  return [next, interval](const mt::text::PreprocessStats& stats) {
    if (interval <= 0 || stats.documents < *next) return;
    *next = (stats.documents / interval + 1) * interval;
    std::fprintf(stderr, "mt-tokenize: processed %lld documents (%.2f MB/s, %lld tokens)\n",
                 static_cast<long long>(stats.documents), megabytes_per_second(stats.input_bytes, stats.seconds),
                 static_cast<long long>(stats.tokens));
  };
}

// `early_load`: the tokenizer, loading since the flags were parsed (see main).
int run_preprocess(mt::tools::ToolCli& cli, const TokenizeOptions& options, TokenizerLoad& early_load) {
  if (options.split_sentences || options.keep_newlines) {
    throw mt::UsageError(options.split_sentences ? "--split-sentences" : "--keep-newlines",
                         "sentence splitting is not implemented in mt-tokenize yet; give pre-split sentences as a JSON list");
  }
  const std::unique_ptr<mt::text::Tokenizer> tokenizer = early_load.get();
  mt::text::PreprocessOptions preprocess;
  preprocess.input = line_input(options);
  preprocess.json_keys = options.json_keys;
  preprocess.output_prefix = options.output_prefix;
  preprocess.output_format = mt::data::parse_token_dataset_format(options.output_format);
  preprocess.workers = options.workers;
  preprocess.append_eod = options.append_eod;
  preprocess.allow_special = options.allow_special;
  preprocess.skip_bad_lines = options.skip_bad_lines;
  // --partitions tests its messages between batches and sleeps while it waits (text/preprocess.h):
  // MPI's progress thread would only wake a thousand times a second on the cores that tokenize.
  const std::unique_ptr<mt::comm::Communicator> world = mt::comm::make_world_communicator(/*progress_thread=*/false);
  mt::text::PreprocessStats stats;
  if (options.partitions > 1) {
    mt::text::PartitionOptions partitions;
    partitions.partitions = options.partitions;
    partitions.keep_sequential = options.keep_sequential_samples;
    stats = mt::text::preprocess_partitions(*tokenizer, preprocess, partitions, *world, progress_every(options.log_interval));
  } else {
    if (world->size() > 1) throw mt::UsageError("--partitions", "several MPI ranks need --partitions 2 or more");
    stats = mt::text::preprocess_jsonl(*tokenizer, preprocess, progress_every(options.log_interval));
  }
  if (world->rank() != 0) return 0;
  if (stats.partition_files_reused) {
    std::fprintf(stderr, "mt-tokenize: note: read the partition files %s ... an earlier run left instead of the input "
                 "(as Megatron does); delete them to deal the input again\n",
                 mt::text::partition_file_name(options.inputs[0], 0).c_str());
  }
  mt::tools::RecordWriter writer(cli.output_format());
  writer.write_run(mt::tools::run_record(cli));
  Record summary = summary_record(stats, options, tokenizer->name());
  summary["partitions"] = options.partitions;
  summary["ranks"] = world->size();
  if (options.partitions > 1) summary["inputs"] = stats.partitioned_inputs;
  writer.write(summary);
  if (stats.bad_lines > 0) {
    std::fprintf(stderr, "mt-tokenize: warning: skipped %lld bad lines (malformed, or longer than --max-line-bytes)\n",
                 static_cast<long long>(stats.bad_lines));
  }
  return 0;
}

// Buffered stdout for id and text streams (flushed per document when stdout is a terminal).
class StreamOut {
 public:
  StreamOut() : interactive_(isatty(STDOUT_FILENO)) { buffer_.reserve(1 << 20); }
  ~StreamOut() { flush(); }
  std::string& buffer() { return buffer_; }
  // Flushes when stdout is a terminal or a megabyte is waiting.
  void end_record() {
    if (interactive_ || buffer_.size() >= (1 << 20)) flush();
  }
  void flush() {
    if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), stdout) != buffer_.size()) {
      throw mt::Error("stdout", "write failed");
    }
    buffer_.clear();
    if (interactive_) std::fflush(stdout);
  }

 private:
  bool interactive_;
  std::string buffer_;
};

int run_encode(const TokenizeOptions& options) {
  if (options.json_keys.size() != 1) throw mt::UsageError("--json-keys", "encode takes exactly one key");
  auto tokenizer = mt::text::Tokenizer::load(options.tokenizer);
  mt::text::EncodeOptions encode;
  encode.input = line_input(options);
  encode.json_key = options.json_keys[0];
  encode.raw = options.raw;
  encode.workers = options.workers;
  encode.allow_special = options.allow_special;
  encode.skip_bad_lines = options.skip_bad_lines;
  const bool as_json = options.ids_format == "jsonl";
  StreamOut out;
  bool document_open = false, first_id = true;
  const auto stats = mt::text::encode_stream(*tokenizer, encode, [&](std::span<const int32_t> ids, bool end_of_document) {
    std::string& text = out.buffer();
    if (!document_open && as_json) text.push_back('[');
    document_open = true;
    const size_t old_size = text.size();
    text.resize(old_size + ids.size() * 12);  // a separator and up to 11 characters per id
    char* cursor = text.data() + old_size;
    char* const end = text.data() + text.size();
    for (int32_t id : ids) {
      if (!first_id) *cursor++ = as_json ? ',' : ' ';
      cursor = std::to_chars(cursor, end, id).ptr;
      first_id = false;
    }
    text.resize(static_cast<size_t>(cursor - text.data()));
    if (!end_of_document) {
      out.end_record();  // flushes a long document's ids in pieces
      return;
    }
    if (as_json) text.push_back(']');
    text.push_back('\n');
    document_open = false;
    first_id = true;
    out.end_record();
  });
  out.flush();
  std::fprintf(stderr, "mt-tokenize encode: %lld documents, %lld tokens, %lld bytes, %.2f MB/s, %lld replaced\n",
               static_cast<long long>(stats.documents), static_cast<long long>(stats.tokens),
               static_cast<long long>(stats.text_bytes), megabytes_per_second(stats.text_bytes, stats.seconds),
               static_cast<long long>(stats.replaced));
  return 0;
}

// One line of ids: space-separated integers or a JSON array.
std::vector<int32_t> parse_ids(const std::string& line, const std::string& where) {
  std::vector<int32_t> ids;
  size_t start = line.find_first_not_of(" \t\r");
  if (start != std::string::npos && line[start] == '[') {
    nlohmann::json array;
    try {
      array = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw mt::Error(where, "not a JSON array of ids");
    }
    if (!array.is_array()) throw mt::Error(where, "not a JSON array of ids");
    for (const auto& value : array) {
      if (!value.is_number_integer()) throw mt::Error(where, "ids must be integers");
      ids.push_back(value.get<int32_t>());
    }
    return ids;
  }
  const char* p = line.c_str();
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == '\r') ++p;
    if (!*p) break;
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(p, &end, 10);
    if (end == p || errno || value < INT32_MIN || value > INT32_MAX || (*end && *end != ' ' && *end != '\t' && *end != '\r')) {
      throw mt::Error(where, "not a list of integer ids");
    }
    ids.push_back(static_cast<int32_t>(value));
    p = end;
  }
  return ids;
}

int run_decode(const TokenizeOptions& options) {
  auto tokenizer = mt::text::Tokenizer::load(options.tokenizer);
  StreamOut out;
  for (const std::string& input : options.inputs) {
    std::FILE* file = input == "-" ? stdin : mt::open_input_file(input, "--input");
    std::string line;
    int64_t line_number = 0;
    char* buffer = nullptr;
    size_t capacity = 0;
    ssize_t length;
    while ((length = getline(&buffer, &capacity, file)) >= 0) {
      ++line_number;
      line.assign(buffer, static_cast<size_t>(length));
      if (!line.empty() && line.back() == '\n') line.pop_back();
      const std::string where = input + ":" + std::to_string(line_number);
      std::string text;
      try {
        text = tokenizer->decode(parse_ids(line, where));
      } catch (const mt::Error& e) {
        std::free(buffer);
        if (file != stdin) std::fclose(file);
        if (std::string(e.what()).starts_with(where)) throw;
        throw mt::Error(where, e.what());
      }
      if (options.raw) {
        out.buffer() += text;
      } else {
        out.buffer() += nlohmann::json{{"text", text}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        out.buffer().push_back('\n');
      }
      out.end_record();
    }
    std::free(buffer);
    if (file != stdin) std::fclose(file);
  }
  out.flush();
  return 0;
}

int run_train(mt::tools::ToolCli& cli, const TokenizeOptions& options) {
  if (options.json_keys.size() != 1) throw mt::UsageError("--json-keys", "train takes exactly one key");
  mt::text::BpeTrainerOptions trainer_options;
  trainer_options.vocab_size = options.vocab_size;
  trainer_options.min_frequency = options.min_frequency;
  trainer_options.pattern = options.pattern == "cl100k" ? mt::text::PretokenizePattern::cl100k : mt::text::PretokenizePattern::gpt2;
  mt::text::BpeTrainer trainer(trainer_options);
  const auto start = std::chrono::steady_clock::now();
  const auto read = mt::text::read_texts(line_input(options), options.raw, options.json_keys[0], options.skip_bad_lines,
                                         [&](std::string_view text) { trainer.add_text(text); });
  const mt::text::BpeVocabulary vocabulary = trainer.train();
  std::filesystem::create_directories(options.output_dir);
  const std::string vocab_file = options.output_dir + "/encoder.json", merge_file = options.output_dir + "/vocab.bpe";
  mt::text::write_gpt2_files(vocabulary, vocab_file, merge_file);
  mt::tools::RecordWriter writer(cli.output_format());
  writer.write_run(mt::tools::run_record(cli));
  Record record;
  record["record"] = "summary";
  record["documents"] = read.documents;
  record["text_bytes"] = read.text_bytes;
  record["replaced"] = read.replaced;
  record["bad_lines"] = read.bad_lines;
  record["blank_lines"] = read.blank_lines;
  record["vocab_size"] = static_cast<int64_t>(vocabulary.tokens.size());
  record["merges"] = static_cast<int64_t>(vocabulary.merges.size());
  record["exhausted"] = vocabulary.exhausted;
  record["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  record["vocab_file"] = vocab_file;
  record["merge_file"] = merge_file;
  writer.write(record);
  if (vocabulary.exhausted) {
    std::fprintf(stderr, "mt-tokenize train: warning: no pair left with count >= --min-frequency; vocabulary has %zu tokens\n",
                 vocabulary.tokens.size());
  }
  return 0;
}

int run_merge(mt::tools::ToolCli& cli, const TokenizeOptions& options) {
  const auto outputs = mt::data::merge_token_datasets(
      options.inputs, options.output_prefix, mt::data::parse_token_dataset_format(options.output_format), options.vocab_size);
  const auto merged = mt::data::TokenDataset::open(outputs.front());
  mt::tools::RecordWriter writer(cli.output_format());
  writer.write_run(mt::tools::run_record(cli));
  Record record;
  record["record"] = "summary";
  record["inputs"] = options.inputs;
  record["documents"] = merged.document_count();
  record["sequences"] = merged.sequence_count();
  record["tokens"] = merged.token_count();
  record["outputs"] = outputs;
  writer.write(record);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  TokenizeOptions options;
  CLI::App* encode = nullptr;
  CLI::App* decode = nullptr;
  CLI::App* train = nullptr;
  CLI::App* merge = nullptr;
  TokenizerLoad tokenizer_load;
  return mt::tools::tool_main(
      argc, argv, "mt-tokenize",
      "Exact byte-level BPE (GPT-2, tiktoken, Hugging Face) over JSONL or text. Without a subcommand: Megatron's "
      "preprocess_data (JSONL in, <prefix>_<key>_document.h5 and/or .bin/.idx out, a summary record on stdout).",
      [&](mt::tools::ToolCli& cli) {
        CLI::App& app = cli.app();
        app.require_subcommand(0, 1);
        mt::tools::add_tokenizer_flags(app, options.tokenizer, false);
        mt::tools::add_tokenizer_encoding_flags(app, options.tokenizer);
        add_input_options(app, options, "");
        add_sentencepiece_flags(app, options);
        app.add_option("--json-keys", options.json_keys, "Keys whose values are tokenized, one dataset each")
            ->expected(1, -1)
            ->default_str("text");
        app.add_option("--output-prefix", options.output_prefix, "Output path prefix: <prefix>_<key>_document.{h5,bin,idx}");
        mt::tools::add_flag(app, flag::output_format, options.output_format)->capture_default_str();
        app.add_flag("--append-eod", options.append_eod, "Append the end-of-document id to every document with tokens");
        app.add_flag("--skip-bad-lines", options.skip_bad_lines, "Count and skip malformed lines instead of failing");
        app.add_flag("--split-sentences", options.split_sentences, "Reserved (Megatron's NLTK splitting): refused until implemented");
        app.add_flag("--keep-newlines", options.keep_newlines, "Reserved with --split-sentences: refused until implemented");
        mt::tools::add_flag(app, flag::partitions, options.partitions)->capture_default_str();
        app.add_flag("--keep-sequential-samples", options.keep_sequential_samples,
                     "With --partitions: contiguous blocks of lines instead of round robin (output equals one process)");
        mt::tools::add_flag(app, flag::log_interval, options.log_interval)->capture_default_str();
        cli.add_output_format(app);

        encode = app.add_subcommand("encode", "Text to ids: one line of ids per document (JSONL line, or the whole --raw input)");
        mt::tools::add_tokenizer_flags(*encode, options.tokenizer, true);
        mt::tools::add_tokenizer_encoding_flags(*encode, options.tokenizer);
        add_input_options(*encode, options, "-");
        add_sentencepiece_flags(*encode, options);
        encode->add_flag("--raw", options.raw, "The input is plain text, one document");
        encode->add_option("--json-keys", options.json_keys, "The key to tokenize (one)")->default_str("text");
        encode->add_flag("--skip-bad-lines", options.skip_bad_lines, "Skip malformed lines instead of failing");
        mt::tools::add_flag(*encode, flag::ids_format, options.ids_format)->capture_default_str();

        decode = app.add_subcommand("decode", "Ids to text: each input line of ids (text or a JSON array) to {\"text\": ...}");
        mt::tools::add_tokenizer_flags(*decode, options.tokenizer, true);
        decode->add_option("--input", options.inputs, "Files of ids ('-' = stdin)")->expected(1, -1)->default_str("-");
        decode->add_flag("--raw", options.raw, "Write the decoded text only, documents back to back");

        train = app.add_subcommand("train", "Learn a byte-level BPE vocabulary; writes <dir>/encoder.json and <dir>/vocab.bpe");
        train->add_option("--input", options.inputs, "Training text: JSONL (--json-keys) or plain text (--raw)")
            ->expected(1, -1)
            ->required();
        train->add_flag("--raw", options.raw, "The inputs are plain text");
        train->add_option("--json-keys", options.json_keys, "The key holding the text (one)")->default_str("text");
        train->add_flag("--skip-bad-lines", options.skip_bad_lines, "Skip malformed lines instead of failing");
        mt::tools::add_flag(*train, flag::vocab_size, options.vocab_size)->required();
        mt::tools::add_flag(*train, flag::min_frequency, options.min_frequency)->capture_default_str();
        mt::tools::add_flag(*train, flag::pattern, options.pattern)->capture_default_str();
        train->add_option("--output-dir", options.output_dir, "Directory for encoder.json and vocab.bpe")->required();
        cli.add_output_format(*train);

        merge = app.add_subcommand("merge", "Concatenate token datasets (Megatron's merge_datasets.py): tokenizing "
                                            "files apart and merging equals tokenizing them in one run");
        merge->add_option("--input", options.inputs, "Token datasets (prefixes, .h5, .bin or .idx), in order")
            ->expected(1, -1)
            ->required();
        merge->add_option("--output-prefix", options.output_prefix, "Output: <prefix>.h5 and/or .bin/.idx")->required();
        mt::tools::add_flag(*merge, flag::output_format, options.output_format)->capture_default_str();
        mt::tools::add_flag(*merge, flag::vocab_size, options.vocab_size,
                            "Needed when every input is .bin/.idx (they record none)");
        cli.add_output_format(*merge);
        // Preprocessing loads its tokenizer (0.25 s for GPT-2's) on a thread of its own as soon as
        // the flags are parsed, while tool_main starts MPI: MPI_Init mostly waits (0.3 s of a
        // 2-rank mpirun here, 0.06 s of it on a core), so a partitioned run's ranks load meanwhile.
        // Started whenever no subcommand is given, the only way to run_preprocess, which takes it;
        // a load whose flags the run then refuses (no --tokenizer-type, say) is never asked for.
        app.final_callback([&] {
          if (encode->parsed() || decode->parsed() || train->parsed() || merge->parsed()) return;
          tokenizer_load = std::async(std::launch::async, [&] { return mt::text::Tokenizer::load(options.tokenizer); });
        });
      },
      [&](mt::tools::ToolCli& cli) -> int {
        if ((encode->parsed() || decode->parsed()) && options.inputs.empty()) options.inputs = {"-"};
        check_sentencepiece_flags(options);
        if (encode->parsed()) return run_encode(options);
        if (decode->parsed()) return run_decode(options);
        if (train->parsed()) return run_train(cli, options);
        if (merge->parsed()) return run_merge(cli, options);
        if (options.tokenizer.type.empty()) throw mt::UsageError("--tokenizer-type", "is required");
        if (options.inputs.empty()) throw mt::UsageError("--input", "is required");
        if (options.output_prefix.empty()) throw mt::UsageError("--output-prefix", "is required");
        return run_preprocess(cli, options, tokenizer_load);
      });
}

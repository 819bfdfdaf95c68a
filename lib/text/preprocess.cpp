// Corpus tokenization: Megatron's preprocess_data and the streaming encoder (see preprocess.h).
// Tested in tests/unit/text/test_preprocess.cpp, tests/tools/mt-tokenize.bats and
// tests/tools/mt-tokenize-partitions.bats.
#include "text/preprocess.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/clock.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/ordered_pipeline.h"
#include "text/jsonl.h"
#include "text/record_queue.h"
#include "text/unicode.h"

namespace mt::text {
namespace {

// Whole lines of one input file, or (too_long) no bytes for the one line first_line, which
// was longer than max_line_bytes and was read past without being kept. The lines are the file's
// lines first_line, first_line + line_stride, ... (a stride above 1 for the lines of a file dealt
// round robin to partitions), counted from the line starting at byte lines_from of the file (a
// partitioned run's share of a file: the lines before it are counted only for an error message).
struct LineBatch {
  std::string bytes;
  std::string file;
  int64_t first_line = 1;
  int64_t line_stride = 1;
  bool too_long = false;
  int64_t lines_from = 0;
};

constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

// Reads the inputs one after another in batches of whole lines.
class LineReader {
 public:
  explicit LineReader(const LineInputOptions& options) : options_(options) {
    if (options_.inputs.empty()) throw UsageError("--input", "no input given");
    if (options_.batch_bytes == 0 || options_.max_line_bytes == 0) throw UsageError("--max-line-bytes", "must be positive");
    for (const std::string& input : options_.inputs) {  // fail before any work on a missing file
      if (input != "-") check_input_file(input, "--input");
    }
  }
  ~LineReader() { close(); }

  // Fills `batch` with whole lines of the current input (a UTF-8 byte order mark at the start of
  // an input is dropped), or with one too_long line; false when every input is exhausted.
  bool next(LineBatch& batch) {
    while (file_ || open_next()) {
      batch.file = name_;
      batch.first_line = line_;
      batch.too_long = false;
      std::string& bytes = batch.bytes;
      bytes.swap(carry_);
      carry_.clear();
      size_t last_newline = bytes.rfind('\n');
      bool at_eof = false;
      while (last_newline == std::string::npos || bytes.size() < options_.batch_bytes) {
        if (last_newline == std::string::npos && bytes.size() > options_.max_line_bytes) {
          skip_rest_of_line(bytes);
          batch.too_long = true;
          ++line_;
          return true;
        }
        const size_t old_size = bytes.size();
        const size_t chunk = read_chunk_bytes();
        // A line longer than a batch grows up to max_line_bytes: one allocation, not doublings.
        if (last_newline == std::string::npos && old_size + chunk > options_.batch_bytes) {
          bytes.reserve(std::max(bytes.capacity(), options_.max_line_bytes + chunk + 1));
        }
        bytes.resize(old_size + chunk);
        size_t got = std::fread(bytes.data() + old_size, 1, chunk, file_);
        bytes.resize(old_size + got);
        input_bytes_ += static_cast<int64_t>(got);
        if (got < chunk && std::ferror(file_)) throw Error("--input " + name_, "read failed");
        if (at_file_start_) {
          at_file_start_ = false;
          if (std::string_view(bytes).substr(old_size).starts_with(kUtf8Bom)) {
            bytes.erase(old_size, kUtf8Bom.size());
            got -= kUtf8Bom.size();
          }
        }
        if (got > 0) {
          const void* found = memrchr(bytes.data() + old_size, '\n', got);
          if (found) last_newline = static_cast<size_t>(static_cast<const char*>(found) - bytes.data());
        }
        if (got < chunk) {
          at_eof = true;
          break;
        }
      }
      if (at_eof) {
        close();
        if (!bytes.empty() && bytes.back() != '\n') bytes.push_back('\n');  // the unterminated last line
      } else {
        carry_.assign(bytes, last_newline + 1);
        bytes.resize(last_newline + 1);
      }
      line_ += std::count(bytes.begin(), bytes.end(), '\n');
      if (!bytes.empty()) return true;
    }
    return false;
  }

  int64_t input_bytes() const { return input_bytes_; }

  // Everything left as one valid UTF-8 text (raw text mode); counts replacements in `stats`.
  std::string read_all_text(PreprocessStats& stats) {
    std::string text = read_all();
    if (!is_valid_utf8(text)) {
      std::string sanitized;
      stats.replaced += static_cast<int64_t>(sanitize_utf8(text, sanitized));
      text.swap(sanitized);
    }
    stats.text_bytes += static_cast<int64_t>(text.size());
    stats.documents += 1;
    return text;
  }

 private:
  // Everything left, as one string.
  std::string read_all() {
    std::string all;
    while (file_ || open_next()) {
      struct stat info {};
      if (fstat(fileno(file_), &info) == 0 && S_ISREG(info.st_mode)) all.reserve(all.size() + info.st_size);
      const size_t chunk = size_t{1} << 20;
      size_t got;
      do {
        const size_t old_size = all.size();
        all.resize(old_size + chunk);
        got = std::fread(all.data() + old_size, 1, chunk, file_);
        all.resize(old_size + got);
        input_bytes_ += static_cast<int64_t>(got);
      } while (got == chunk);
      if (std::ferror(file_)) throw Error("--input " + name_, "read failed");
      close();
    }
    return all;
  }

  size_t read_chunk_bytes() const { return std::max<size_t>(options_.batch_bytes / 2, size_t{1} << 16); }

  // Reads past the rest of an over-long line whose head is in `scratch`, keeping only what
  // follows its newline (in carry_); memory stays one chunk whatever the line's length.
  void skip_rest_of_line(std::string& scratch) {
    const size_t chunk = read_chunk_bytes();
    while (file_) {
      scratch.resize(chunk);
      const size_t got = std::fread(scratch.data(), 1, chunk, file_);
      input_bytes_ += static_cast<int64_t>(got);
      if (got < chunk && std::ferror(file_)) throw Error("--input " + name_, "read failed");
      const void* newline = std::memchr(scratch.data(), '\n', got);
      if (newline != nullptr) {
        const size_t end = static_cast<size_t>(static_cast<const char*>(newline) - scratch.data()) + 1;
        carry_.assign(scratch, end, got - end);
        break;
      }
      if (got < chunk) close();  // the line ends the file
    }
    scratch.clear();
    scratch.shrink_to_fit();
  }

  bool open_next() {
    if (next_input_ >= options_.inputs.size()) return false;
    name_ = options_.inputs[next_input_++];
    file_ = name_ == "-" ? stdin : open_input_file(name_, "--input");
    line_ = 1;
    at_file_start_ = true;
    return true;
  }
  void close() {
    if (file_ && file_ != stdin) std::fclose(file_);
    file_ = nullptr;
  }

  const LineInputOptions& options_;
  size_t next_input_ = 0;
  std::FILE* file_ = nullptr;
  std::string name_;
  int64_t line_ = 1;
  std::string carry_;
  int64_t input_bytes_ = 0;
  bool at_file_start_ = false;
};

// One JSONL line parser per worker thread, handed out from a pool.
class ParserPool {
 public:
  explicit ParserPool(std::vector<std::string> keys) : keys_(std::move(keys)) { JsonlLineParser check(keys_); }
  std::unique_ptr<JsonlLineParser> acquire() {
    std::lock_guard lock(mutex_);
    if (free_.empty()) return std::make_unique<JsonlLineParser>(keys_);
    auto parser = std::move(free_.back());
    free_.pop_back();
    return parser;
  }
  void release(std::unique_ptr<JsonlLineParser> parser) {
    std::lock_guard lock(mutex_);
    free_.push_back(std::move(parser));
  }

 private:
  std::vector<std::string> keys_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<JsonlLineParser>> free_;
};

// The tokens of one key over the documents of a batch.
struct KeyOutput {
  std::vector<int32_t> tokens;
  std::vector<int32_t> sequence_lengths;
  std::vector<int32_t> sequences_per_document;
};

// A KeyOutput's arrays, wherever they are held (a batch, or a spooled record).
struct KeyOutputView {
  std::span<const int32_t> tokens, sequence_lengths, sequences_per_document;
  KeyOutputView(std::span<const int32_t> t, std::span<const int32_t> l, std::span<const int32_t> d)
      : tokens(t), sequence_lengths(l), sequences_per_document(d) {}
  KeyOutputView(const KeyOutput& out)  // NOLINT(google-explicit-constructor): a view of it
      : KeyOutputView(out.tokens, out.sequence_lengths, out.sequences_per_document) {}
};

// A line that is not a document: malformed, too long, a value of the wrong type.
struct BadLine {
  std::string file;
  int64_t line = 0;
  std::string reason;
  std::string message() const { return file + ":" + std::to_string(line) + ": " + reason; }
};

struct TokenizedBatch {
  LineBatch lines;
  std::vector<KeyOutput> keys;   // one per json key
  PreprocessStats stats;         // documents, empty, sequences, tokens, text bytes, replaced, bad lines
  std::optional<BadLine> error;  // the first bad line (not skipping)
};

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

std::string too_long_message(size_t max_line_bytes) {
  return "longer than --max-line-bytes: " + std::to_string(max_line_bytes);
}

// Calls line_fn(line, line_number) for each JSONL line of the batch (without '\n'); blank lines
// (spaces, tabs, CR only) are skipped and counted in stats.blank_lines. Stops early when line_fn
// returns false.
template <class LineFn>
void for_each_line(const LineBatch& batch, PreprocessStats& stats, LineFn&& line_fn) {
  std::string_view bytes = batch.bytes;
  int64_t line_number = batch.first_line;
  size_t start = 0;
  while (start < bytes.size()) {
    size_t end = bytes.find('\n', start);
    if (end == std::string_view::npos) end = bytes.size();
    const std::string_view line = bytes.substr(start, end - start);
    if (is_blank(line)) {
      ++stats.blank_lines;
    } else if (!line_fn(line, line_number)) {
      return;
    }
    start = end + 1;
    line_number += batch.line_stride;
  }
}

// Parses one JSONL line into `texts` and adds its replacements to `stats`; a bad line (malformed,
// too long, wrong value type) returns it instead.
std::optional<BadLine> parse_line(JsonlLineParser& parser, std::string_view line, const std::string& file,
                                  int64_t line_number, size_t max_line_bytes, std::vector<KeyTexts>& texts,
                                  PreprocessStats& stats) {
  try {
    if (line.size() > max_line_bytes) throw Error(too_long_message(max_line_bytes), "");
    stats.replaced += static_cast<int64_t>(parser.parse(line, texts));
    return std::nullopt;
  } catch (const Error& e) {
    return BadLine{file, line_number, e.what()};
  }
}

// A line the reader skipped as too long: counted with skip_bad_lines, else returned.
std::optional<BadLine> too_long_line(const LineBatch& batch, size_t max_line_bytes, bool skip_bad_lines,
                                     PreprocessStats& stats) {
  if (!batch.too_long) return std::nullopt;
  if (skip_bad_lines) {
    ++stats.bad_lines;
    return std::nullopt;
  }
  return BadLine{batch.file, batch.first_line, too_long_message(max_line_bytes)};
}

// Tokenizes every line of `batch`: per key, Megatron's sequences and documents.
void tokenize_batch(const Tokenizer& tokenizer, ParserPool& pool, const PreprocessOptions& options,
                    const std::optional<int32_t>& eod, TokenizedBatch& batch) {
  const size_t key_count = options.json_keys.size();
  batch.keys.resize(key_count);
  if (batch.lines.too_long) {
    if (auto error = too_long_line(batch.lines, options.input.max_line_bytes, options.skip_bad_lines, batch.stats)) {
      batch.error = std::move(*error);
    }
    return;
  }
  auto parser = pool.acquire();
  std::vector<KeyTexts> texts;
  for_each_line(batch.lines, batch.stats, [&](std::string_view line, int64_t line_number) {
    if (auto error = parse_line(*parser, line, batch.lines.file, line_number, options.input.max_line_bytes, texts,
                                batch.stats)) {
      if (options.skip_bad_lines) {
        ++batch.stats.bad_lines;
        return true;
      }
      batch.error = std::move(*error);
      return false;
    }
    ++batch.stats.documents;
    for (size_t k = 0; k < key_count; ++k) {
      KeyOutput& out = batch.keys[k];
      const size_t document_start = out.tokens.size();
      int32_t sequences = 0;
      for (const std::string& sentence : texts[k]) {
        batch.stats.text_bytes += static_cast<int64_t>(sentence.size());
        const size_t before = out.tokens.size();
        tokenizer.encode_sequence(sentence, out.tokens, options.allow_special);
        const size_t added = out.tokens.size() - before;
        if (added == 0) continue;  // Megatron drops sentences without tokens
        out.sequence_lengths.push_back(static_cast<int32_t>(added));
        ++sequences;
      }
      if (options.append_eod && out.tokens.size() > document_start) {
        out.tokens.push_back(*eod);
        ++out.sequence_lengths.back();
      }
      if (sequences == 0) ++batch.stats.empty_documents;
      batch.stats.sequences += sequences;
      batch.stats.tokens += static_cast<int64_t>(out.tokens.size() - document_start);
      out.sequences_per_document.push_back(sequences);
    }
    return true;
  });
  pool.release(std::move(parser));
}

// The documents of `out` (one key of a batch), in order.
void write_documents(const KeyOutputView& out, data::TokenDatasetWriter& writer) {
  const int32_t* tokens = out.tokens.data();
  size_t sequence = 0;
  for (int32_t count : out.sequences_per_document) {
    for (int32_t s = 0; s < count; ++s, ++sequence) {
      const size_t length = static_cast<size_t>(out.sequence_lengths[sequence]);
      writer.add_sequence({tokens, length});
      tokens += length;
    }
    writer.end_document();
  }
}

void add_counts(PreprocessStats& total, const PreprocessStats& part) {
  total.documents += part.documents;
  total.empty_documents += part.empty_documents;
  total.sequences += part.sequences;
  total.tokens += part.tokens;
  total.text_bytes += part.text_bytes;
  total.replaced += part.replaced;
  total.bad_lines += part.bad_lines;
  total.blank_lines += part.blank_lines;
}

// What an HDF5 token dataset records about `tokenizer`.
data::TokenDatasetMetadata dataset_metadata(const Tokenizer& tokenizer) {
  data::TokenDatasetMetadata metadata;
  metadata.tokenizer = tokenizer.name();
  metadata.tokenizer_hash = tokenizer.hash();
  metadata.eod_id = tokenizer.eod_id().value_or(-1);
  return metadata;
}

void check_workers(int workers) {
  if (workers < 1) throw UsageError("--workers", "must be at least 1");
}

// The EOD id --append-eod appends (refused for a tokenizer without one); checks the output prefix.
std::optional<int32_t> checked_eod(const Tokenizer& tokenizer, const PreprocessOptions& options) {
  if (options.output_prefix.empty()) throw UsageError("--output-prefix", "is required");
  const std::optional<int32_t> eod = tokenizer.eod_id();
  if (options.append_eod && !eod) throw UsageError("--append-eod", "the tokenizer " + tokenizer.name() + " has no end-of-document token");
  return eod;
}

// One writer per --json-keys key: `<output_prefix>_<key>_document`.
std::vector<data::TokenDatasetWriter> create_writers(const Tokenizer& tokenizer, const PreprocessOptions& options) {
  std::vector<data::TokenDatasetWriter> writers;
  for (const std::string& key : options.json_keys) {
    writers.push_back(data::TokenDatasetWriter::create(options.output_prefix + "_" + key + "_document",
                                                       options.output_format, tokenizer.vocab_size(),
                                                       dataset_metadata(tokenizer)));
  }
  return writers;
}

// Per partition written apart (round robin's N, else 1), one writer per key: partition 0's are
// the outputs (create_writers); partition p's, appended to them at the end, are only ever
// temporaries, named as Megatron names partition p's outputs: `<output_prefix>_<p>_<key>_document`.
std::vector<std::vector<data::TokenDatasetWriter>> create_partition_writers(const Tokenizer& tokenizer,
                                                                            const PreprocessOptions& options,
                                                                            int partitions) {
  std::vector<std::vector<data::TokenDatasetWriter>> writers;
  writers.push_back(create_writers(tokenizer, options));
  for (int partition = 1; partition < partitions; ++partition) {
    std::vector<data::TokenDatasetWriter>& partition_writers = writers.emplace_back();
    for (const std::string& key : options.json_keys) {
      partition_writers.push_back(data::TokenDatasetWriter::create(
          options.output_prefix + "_" + std::to_string(partition) + "_" + key + "_document",
          data::TokenDatasetFormat::megatron, tokenizer.vocab_size(), dataset_metadata(tokenizer)));
    }
  }
  return writers;
}

}  // namespace

std::vector<size_t> split_points_for_parallel_encoding(std::string_view text, size_t target_bytes) {
  auto ascii_letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  auto printable = [](char c) { return c > 0x20 && c < 0x7f; };
  std::vector<size_t> points;
  if (target_bytes == 0) return points;
  for (size_t pos = std::max<size_t>(target_bytes, 1); pos + 1 < text.size(); ++pos) {
    const bool after_newline = text[pos] == '\n' && printable(text[pos - 1]) && ascii_letter(text[pos + 1]);
    const bool before_space = text[pos] == ' ' && ascii_letter(text[pos - 1]) && ascii_letter(text[pos + 1]);
    if (!after_newline && !before_space) continue;
    const size_t cut = after_newline ? pos + 1 : pos;
    points.push_back(cut);
    pos = cut + target_bytes - 1;
  }
  return points;
}

PreprocessStats preprocess_jsonl(const Tokenizer& tokenizer, const PreprocessOptions& options,
                                 const PreprocessProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  check_workers(options.workers);
  const std::optional<int32_t> eod = checked_eod(tokenizer, options);
  ParserPool pool(options.json_keys);
  LineReader reader(options.input);
  std::vector<data::TokenDatasetWriter> writers = create_writers(tokenizer, options);

  PreprocessStats total;
  run_ordered_pipeline<TokenizedBatch>(
      options.workers, [&](TokenizedBatch& batch) { return reader.next(batch.lines); },
      [&](TokenizedBatch& batch) { tokenize_batch(tokenizer, pool, options, eod, batch); },
      [&](TokenizedBatch& batch) {
        for (size_t k = 0; k < writers.size(); ++k) write_documents(batch.keys[k], writers[k]);
        if (batch.error) throw Error(batch.error->message(), "");
        add_counts(total, batch.stats);
        total.input_bytes = reader.input_bytes();
        total.seconds = seconds_since(start);
        if (progress) progress(total);
      });
  for (data::TokenDatasetWriter& writer : writers) {
    writer.finish();
    for (const std::string& path : writer.final_paths()) total.outputs.push_back(path);
  }
  total.input_bytes = reader.input_bytes();
  total.seconds = seconds_since(start);
  return total;
}

namespace {

bool has_glob_magic(std::string_view text) { return text.find_first_of("*?[") != std::string_view::npos; }

bool path_exists(const std::string& path) {
  struct stat info;
  return ::lstat(path.c_str(), &info) == 0;
}

// One [...] set of fnmatch at pattern[start] ('['): whether `c` is in it, and where it ends
// (npos when there is no closing ']', so the '[' is literal).
size_t match_set(std::string_view pattern, size_t start, char c, bool& matched) {
  size_t i = start + 1;
  bool negate = false;
  if (i < pattern.size() && pattern[i] == '!') {
    negate = true;
    ++i;
  }
  const size_t first = i;
  bool in_set = false;
  while (i < pattern.size() && (pattern[i] != ']' || i == first)) {
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      if (pattern[i] <= c && c <= pattern[i + 2]) in_set = true;
      i += 3;
    } else {
      if (pattern[i] == c) in_set = true;
      ++i;
    }
  }
  if (i >= pattern.size()) return std::string_view::npos;
  matched = in_set != negate;
  return i + 1;
}

}  // namespace

bool fnmatch_case(std::string_view name, std::string_view pattern) {
  size_t n = 0, p = 0, star_p = std::string_view::npos, star_n = 0;
  while (n < name.size()) {
    bool advanced = false;
    if (p < pattern.size()) {
      if (pattern[p] == '*') {
        star_p = p++;
        star_n = n;
        continue;
      }
      if (pattern[p] == '?') {
        ++p, ++n;
        continue;
      }
      if (pattern[p] == '[') {
        bool matched = false;
        const size_t end = match_set(pattern, p, name[n], matched);
        if (end == std::string_view::npos) {
          advanced = name[n] == '[';
          if (advanced) ++p, ++n;
        } else if (matched) {
          p = end, ++n;
          advanced = true;
        }
      } else if (pattern[p] == name[n]) {
        ++p, ++n;
        advanced = true;
      }
    }
    if (advanced) continue;
    if (star_p == std::string_view::npos) return false;
    p = star_p + 1;
    n = ++star_n;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::vector<std::string> expand_input_glob(const std::string& pattern) {
  const size_t slash = pattern.rfind('/');
  const std::string directory = slash == std::string::npos ? "" : pattern.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? pattern : pattern.substr(slash + 1);
  if (has_glob_magic(directory)) {
    throw UsageError("--input " + pattern, "wildcards in a directory name are not supported; put them in the file name");
  }
  std::vector<std::string> matches;
  if (!has_glob_magic(base)) {
    if (path_exists(pattern)) matches.push_back(pattern);
  } else {
    DIR* dir = ::opendir(directory.empty() ? "." : directory.c_str());
    if (dir != nullptr) {
      const bool hidden_pattern = base.starts_with('.');
      while (const dirent* entry = ::readdir(dir)) {
        const std::string_view name = entry->d_name;
        if (name == "." || name == "..") continue;
        if (name.starts_with('.') && !hidden_pattern) continue;
        if (fnmatch_case(name, base)) matches.push_back(directory + std::string(name));
      }
      ::closedir(dir);
    }
  }
  if (matches.empty()) throw UsageError("--input " + pattern, "matches no file");
  return matches;
}

std::string partition_file_name(const std::string& pattern, int index) {
  // os.path.splitext: the last '.' of the last component, unless only dots precede it there.
  const size_t slash = pattern.rfind('/');
  const size_t base_start = slash == std::string::npos ? 0 : slash + 1;
  size_t dot = pattern.rfind('.');
  if (dot != std::string::npos && dot > base_start) {
    const size_t first_non_dot = pattern.find_first_not_of('.', base_start);
    if (first_non_dot == std::string::npos || first_non_dot > dot) dot = std::string::npos;
  } else {
    dot = std::string::npos;
  }
  const std::string root = dot == std::string::npos ? pattern : pattern.substr(0, dot);
  const std::string extension = dot == std::string::npos ? "" : pattern.substr(dot);
  return root + "_" + std::to_string(index) + extension;
}

namespace {

// One file's lines as Python's text mode reads them (universal newlines: LF, CRLF and a lone CR
// end a line; a last line without an end is a line too), from the first line that starts at or
// after byte `from` (a line starts at the file's start or just after a line end; the LF of a CRLF
// is no start). A UTF-8 byte order mark at the file's start is dropped, as for every mt-tokenize
// input (Python keeps it and Megatron's json.loads then fails on that line). A line longer than
// max_line_bytes is read past in chunks and never held whole, so memory stays about
// max_line_bytes + one chunk.
class PythonLines {
 public:
  struct Line {
    std::string_view text;  // without its end; valid until the next call
    bool too_long = false;  // read past: `text` is empty
    int64_t start = 0;      // the file offset where it starts (0 for the first, a BOM or not)
  };

  PythonLines(const std::string& path, size_t max_line_bytes, int64_t from = 0)
      : path_(path), max_line_bytes_(max_line_bytes) {
    if (path.ends_with(".gz")) {
      throw UsageError("--input " + path, "gzip input is not supported (Megatron reads it); decompress it first");
    }
    fd_ = open_input_fd(path, "--input");
    if (from > 0) {  // the line holding byte from - 1 started before `from`: read past it
      if (::lseek(fd_, from - 1, SEEK_SET) < 0) {
        throw Error("--input " + path_, std::string("seek failed: ") + std::strerror(errno));
      }
      buffer_offset_ = from - 1;
      at_start_ = false;
      Line before;
      next(before);
    }
  }
  ~PythonLines() { ::close(fd_); }
  PythonLines(const PythonLines&) = delete;
  PythonLines& operator=(const PythonLines&) = delete;

  int64_t bytes_read() const { return bytes_read_; }

  // The next line; false after the last.
  bool next(Line& line) {
    bool too_long = false;
    int64_t start = -1;
    for (;;) {
      if (skip_lf_) {  // the previous line ended with a CR: a LF right after it is part of that end
        if (begin_ == end_ && !eof_) {
          fill();
          continue;
        }
        if (begin_ < end_ && buffer_[begin_] == '\n') ++begin_;
        skip_lf_ = false;
      }
      if (start < 0) start = buffer_offset_ + static_cast<int64_t>(begin_);
      const char* data = buffer_.data();
      const size_t stop = std::min(next_of('\n', lf_), next_of('\r', cr_));
      if (stop < end_ || eof_) {
        if (stop == end_ && begin_ == end_ && !too_long) return false;  // eof after the last line's end
        line.text = too_long ? std::string_view() : std::string_view(data + begin_, stop - begin_);
        line.too_long = too_long;
        line.start = start;
        skip_lf_ = stop < end_ && data[stop] == '\r';
        begin_ = std::min(stop + 1, end_);
        return true;
      }
      if (end_ - begin_ > max_line_bytes_) {  // drop the head of a line too long to keep
        too_long = true;
        begin_ = end_;
      }
      fill();
    }
  }

 private:
  static constexpr size_t kChunk = size_t{1} << 20;

  // Where the next `c` at or after begin_ is (end_ when none is buffered), searched once per fill
  // and byte: lines ended by one kind of end do not rescan the buffer for the other.
  struct Next {
    size_t at = 0;
    bool known = false;
  };
  size_t next_of(char c, Next& next) {
    if (!next.known || next.at < begin_) {
      const void* found = std::memchr(buffer_.data() + begin_, c, end_ - begin_);
      next.at = found != nullptr ? static_cast<size_t>(static_cast<const char*>(found) - buffer_.data()) : end_;
      next.known = true;
    }
    return next.at;
  }

  // Moves the unread bytes to the front and reads one more chunk after them.
  void fill() {
    lf_.known = cr_.known = false;
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      buffer_offset_ += static_cast<int64_t>(begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (buffer_.size() < end_ + kChunk) buffer_.resize(end_ + kChunk);
    ssize_t got;
    do {
      got = ::read(fd_, buffer_.data() + end_, kChunk);
    } while (got < 0 && errno == EINTR);
    if (got < 0) throw Error("--input " + path_, std::string("read failed: ") + std::strerror(errno));
    eof_ = got == 0;
    end_ += static_cast<size_t>(got);
    bytes_read_ += got;
    if (at_start_ && end_ > 0) {
      at_start_ = false;
      if (std::string_view(buffer_.data(), end_).starts_with("\xEF\xBB\xBF")) begin_ = 3;
    }
  }

  std::string path_;
  size_t max_line_bytes_;
  int fd_ = -1;
  std::string buffer_;
  size_t begin_ = 0, end_ = 0;  // unread bytes: buffer_[begin_, end_)
  int64_t buffer_offset_ = 0;   // the file offset of buffer_[0]
  bool eof_ = false, skip_lf_ = false, at_start_ = true;
  Next lf_, cr_;
  int64_t bytes_read_ = 0;
};

// The lines of `path` that start in bytes [from, to).
int64_t count_lines(const std::string& path, int64_t from, int64_t to) {
  if (from >= to) return 0;
  int64_t lines = 0;
  PythonLines reader(path, size_t{1} << 20, from);
  for (PythonLines::Line line; reader.next(line) && line.start < to;) ++lines;
  return lines;
}

int64_t file_bytes(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 ? static_cast<int64_t>(info.st_size) : -1;
}

// Megatron counts each file's lines with `for fc, _ in enumerate(fin)`; an empty file leaves fc
// as the previous file's (or undefined), so an empty file (no bytes, or only a byte order mark,
// which mt drops) is refused rather than miscounted.
void refuse_empty_for_sequential(const std::string& file, int64_t bytes) {
  if (bytes == 0 || (bytes == 3 && count_lines(file, 0, bytes) == 0)) {
    throw UsageError("--keep-sequential-samples",
                     file + " is empty: Megatron counts it as the previous file's lines (or fails); remove it");
  }
}

}  // namespace

PartitionFiles plan_partition_files(const std::string& pattern, const PartitionOptions& partitions) {
  if (partitions.partitions < 2) throw UsageError("--partitions", "a partitioned run needs at least 2");
  PartitionFiles plan;
  std::vector<std::string> existing;
  for (int i = 0; i < partitions.partitions; ++i) {
    plan.paths.push_back(partition_file_name(pattern, i));
    if (path_exists(plan.paths.back())) existing.push_back(plan.paths.back());
  }
  if (existing.size() == static_cast<size_t>(partitions.partitions)) {
    plan.reused = true;
    for (const std::string& path : plan.paths) plan.bytes.push_back(file_bytes(path));
    return plan;
  }
  plan.inputs = expand_input_glob(pattern);
  for (const std::string& file : plan.inputs) {
    if (std::find(existing.begin(), existing.end(), file) != existing.end()) {
      throw UsageError("--input " + pattern, "matches " + file +
                                                 ", a partition file left by an earlier run; remove it");
    }
    plan.bytes.push_back(file_bytes(file));
    if (partitions.keep_sequential) refuse_empty_for_sequential(file, plan.bytes.back());
  }
  return plan;
}

namespace {

// How a partitioned run splits its work. The files' bytes, one after another, are cut into
// `chunks` equal byte ranges; a line belongs to the range holding its first byte. A rank claims a
// chunk, reads it once and deals its lines to `streams`: round robin has one stream per partition,
// line k of the chunk (counted from 0) going to stream k % N; with contiguous blocks
// (--keep-sequential-samples, or partition files reused, partition i being file i) the merged
// order is the lines' own, one stream taking every line. A chunk's lines of one stream are a
// segment, tagged stream * chunks + chunk. Round robin's partition p takes the lines whose index
// across the files, j, has j % N == p (Megatron's dealing), so chunk c's stream q is partition
// (first + q) % N, where `first` is the index of the chunk's first line: the sum of the line
// counts of the chunks before it, which the ranks report as they finish each chunk, and which
// rank 0 therefore knows by the time it writes the chunk (it writes the chunks in order, and a
// chunk's turn comes only when every chunk before it has ended). Chunks are
// tokenized by whichever rank claims them first, in order (SegmentWriter::claim), so a rank that
// is slower, holds fewer threads or, as rank 0, also writes takes fewer, and rank 0 has each
// chunk's records soon after they are made.
struct PartitionLayout {
  std::vector<std::string> files;
  std::vector<int64_t> starts;  // files[f]'s first byte in the whole; starts.back() is the total
  int64_t chunks = 1;
  int partitions = 2, streams = 1;
  bool round_robin = false;

  PartitionLayout(const PartitionFiles& plan, const PartitionOptions& options)
      : files(plan.reused ? plan.paths : plan.inputs), partitions(options.partitions) {
    starts.push_back(0);
    for (int64_t bytes : plan.bytes) starts.push_back(starts.back() + bytes);
    round_robin = !plan.reused && !options.keep_sequential;
    streams = round_robin ? partitions : 1;
    // 16 chunks per partition (tiny ones for a tiny input), more for a big input: at most 4 MiB
    // each, so that the ranks' last chunks end close together (a chunk takes 0.1 s or less to
    // tokenize; 64 MiB chunks left one rank idle for up to a third of a second at the end).
    const int64_t per_partition = std::max<int64_t>(16, (starts.back() / partitions >> 22) + 1);
    chunks = per_partition * partitions;
  }
  int64_t begin(int64_t chunk) const {
    return static_cast<int64_t>(static_cast<__int128>(starts.back()) * chunk / chunks);
  }
  int64_t tag(int stream, int64_t chunk) const { return stream * chunks + chunk; }
  int64_t chunk_of(int64_t tag) const { return tag % chunks; }
  int stream_of(int64_t tag) const { return static_cast<int>(tag / chunks); }
  // The output (a partition written apart; 0 without round robin) of a chunk's stream: there are
  // as many outputs as streams.
  int output_of(int stream, int64_t first_line) const {
    return round_robin ? static_cast<int>((first_line + stream) % partitions) : 0;
  }

  // Calls part_fn(file, from, to) for each file's part of the chunk: its bytes [from, to), in order.
  template <class PartFn>
  void for_each_part(int64_t chunk, PartFn&& part_fn) const {
    const int64_t first = begin(chunk), end = begin(chunk + 1);
    auto f = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end() - 1, first) - starts.begin()) - 1;
    for (; f < files.size() && starts[f] < end; ++f) {
      const int64_t from = std::max<int64_t>(first - starts[f], 0);
      const int64_t to = std::min(end, starts[f + 1]) - starts[f];
      if (from < to) part_fn(f, from, to);
    }
  }
};

// A batch of one segment's lines (a pipeline item) and, once tokenized, its documents; or, with
// chunk_lines >= 0 and no lines, the end of chunk `tag` (its line count).
struct PartitionBatch : TokenizedBatch {
  int64_t tag = 0;
  int64_t chunk_lines = -1;
};

// Deals the chunks this rank claims (`claim`: the next one, in increasing order, or -1 when none
// is left) into batches of whole lines of one segment and one file (about
// LineInputOptions::batch_bytes; a too-long line alone, with no bytes). Each chunk is read once:
// its lines go to their streams' open batches, so batches of a chunk's segments come interleaved,
// each segment's in order, then the chunk's end (its line count), before anything of the next.
class SegmentDealer {
 public:
  SegmentDealer(const PartitionLayout& layout, std::function<int64_t()> claim, const LineInputOptions& input)
      : layout_(layout), claim_(std::move(claim)), input_(input), open_(static_cast<size_t>(layout.streams)) {}

  // Bytes of the files read so far.
  int64_t bytes_read() const { return bytes_read_ + (reader_ ? reader_->bytes_read() : 0); }

  // The next batch of this rank's chunks, or a chunk's end; false after the last.
  bool next(PartitionBatch& batch) {
    while (ready_.empty()) {
      if (reader_) {
        deal_one_batch();
      } else if (next_part_ < parts_.size()) {
        part_ = parts_[next_part_++];
        reader_.emplace(layout_.files[part_.file], input_.max_line_bytes, part_.from);
        part_line_ = 0;
      } else if (chunk_ >= 0) {
        PartitionBatch& end = ready_.emplace_back();
        end.tag = chunk_;
        end.chunk_lines = chunk_line_;
        chunk_ = -1;
      } else if (!claim_next()) {
        return false;
      }
    }
    batch = std::move(ready_.front());
    ready_.pop_front();
    return true;
  }

 private:
  bool claim_next() {
    if (claimed_all_) return false;
    chunk_ = claim_();
    if (chunk_ < 0) {
      claimed_all_ = true;
      return false;
    }
    parts_.clear();
    layout_.for_each_part(chunk_, [&](size_t f, int64_t from, int64_t to) { parts_.push_back({f, from, to}); });
    next_part_ = 0;
    chunk_line_ = 0;
    return true;
  }

  // Reads lines until a batch is ready or the file part ends (its open batches then become ready).
  void deal_one_batch() {
    const std::string& file = layout_.files[part_.file];
    const int64_t stride = layout_.streams;
    PythonLines::Line line;
    while (ready_.empty()) {
      if (!reader_->next(line) || line.start >= part_.to) {
        bytes_read_ += reader_->bytes_read();
        reader_.reset();
        for (int stream = 0; stream < layout_.streams; ++stream) make_ready(stream);
        return;
      }
      const int64_t number = ++part_line_;
      const int stream = static_cast<int>(chunk_line_++ % layout_.streams);
      if (line.too_long) {
        make_ready(stream);
        PartitionBatch& batch = ready_.emplace_back();
        batch.tag = layout_.tag(stream, chunk_);
        batch.lines = LineBatch{"", file, number, 1, true, part_.from};
        continue;
      }
      LineBatch& open = open_[static_cast<size_t>(stream)];
      if (open.bytes.empty()) {
        open = LineBatch{"", file, number, stride, false, part_.from};
        open.bytes.reserve(input_.batch_bytes + (input_.batch_bytes >> 4));  // no regrowth for ordinary lines
      }
      open.bytes.append(line.text);
      open.bytes.push_back('\n');
      if (open.bytes.size() >= input_.batch_bytes) make_ready(stream);
    }
  }

  void make_ready(int stream) {
    LineBatch& open = open_[static_cast<size_t>(stream)];
    if (open.bytes.empty()) return;
    PartitionBatch& batch = ready_.emplace_back();
    batch.tag = layout_.tag(stream, chunk_);
    batch.lines = std::move(open);
    open = LineBatch{};
  }

  struct Part {
    size_t file = 0;
    int64_t from = 0, to = 0;
  };
  const PartitionLayout& layout_;
  std::function<int64_t()> claim_;
  const LineInputOptions& input_;
  bool claimed_all_ = false;
  int64_t chunk_ = -1;       // the chunk being read, -1 between chunks
  std::vector<Part> parts_;  // the current chunk, per file
  size_t next_part_ = 0;
  Part part_;
  std::optional<PythonLines> reader_;
  int64_t chunk_line_ = 0;  // lines of the chunk read so far
  int64_t part_line_ = 0;   // lines of the file part read so far
  std::vector<LineBatch> open_;  // per stream: lines taken, not yet a batch
  std::deque<PartitionBatch> ready_;
  int64_t bytes_read_ = 0;  // of the file parts done
};

// One tokenized batch as bytes: per key its document, sequence and token counts (int64), then
// per key the documents' sequence counts, the sequence lengths and the tokens (int32). Without
// `tokens` the record is the batch's index only (its token counts 0, no token bytes).
std::string encode_record(const std::vector<KeyOutput>& keys, bool tokens = true) {
  size_t bytes = keys.size() * 3 * sizeof(int64_t);
  for (const KeyOutput& out : keys) {
    bytes += (out.sequences_per_document.size() + out.sequence_lengths.size() + (tokens ? out.tokens.size() : 0)) *
             sizeof(int32_t);
  }
  std::string record;
  record.reserve(bytes);
  auto append = [&record](const void* data, size_t size) { record.append(static_cast<const char*>(data), size); };
  for (const KeyOutput& out : keys) {
    const int64_t counts[3] = {static_cast<int64_t>(out.sequences_per_document.size()),
                               static_cast<int64_t>(out.sequence_lengths.size()),
                               tokens ? static_cast<int64_t>(out.tokens.size()) : 0};
    append(counts, sizeof counts);
  }
  for (const KeyOutput& out : keys) {
    append(out.sequences_per_document.data(), out.sequences_per_document.size() * sizeof(int32_t));
    append(out.sequence_lengths.data(), out.sequence_lengths.size() * sizeof(int32_t));
    if (tokens) append(out.tokens.data(), out.tokens.size() * sizeof(int32_t));
  }
  return record;
}

// A record's arrays, one view per key. `record` is a heap string (aligned for int32, as operator
// new aligns) made by encode_record, on this rank or another; the views point into it.
std::vector<KeyOutputView> decode_record(const std::string& record, size_t keys) {
  const size_t header = keys * 3 * sizeof(int64_t);
  if (record.size() < header) throw Error("partition record", "shorter than its header");
  size_t offset = header;
  auto array = [&](int64_t count) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(int32_t);
    if (count < 0 || offset + bytes > record.size()) throw Error("partition record", "shorter than its counts say");
    const std::span<const int32_t> items(reinterpret_cast<const int32_t*>(record.data() + offset), static_cast<size_t>(count));
    offset += bytes;
    return items;
  };
  std::vector<KeyOutputView> views;
  for (size_t k = 0; k < keys; ++k) {
    int64_t counts[3];
    std::memcpy(counts, record.data() + k * sizeof counts, sizeof counts);
    const auto documents = array(counts[0]), lengths = array(counts[1]), tokens = array(counts[2]);
    views.emplace_back(tokens, lengths, documents);
  }
  return views;
}

// Writes a record's documents, key k's to writers[k].
void write_record(const std::string& record, std::vector<data::TokenDatasetWriter>& writers) {
  const std::vector<KeyOutputView> views = decode_record(record, writers.size());
  for (size_t k = 0; k < writers.size(); ++k) write_documents(views[k], writers[k]);
}

// Adds an index record's documents to output `output`, key k's to writers[k], without their
// tokens: {the segment's tag, the output, then per key the byte offset in its token file where
// they go}, for the rank that holds them.
std::vector<int64_t> reserve_record(int64_t tag, int output, const std::string& record,
                                    std::vector<data::TokenDatasetWriter>& writers) {
  const std::vector<KeyOutputView> views = decode_record(record, writers.size());
  std::vector<int64_t> placement{tag, output};
  for (size_t k = 0; k < writers.size(); ++k) {
    placement.push_back(writers[k].reserve_documents(views[k].sequence_lengths, views[k].sequences_per_document));
  }
  return placement;
}

constexpr int kPartitionTag = 26;
constexpr int kClaimTag = 27;
constexpr int kPlacementTag = 28;

// Waits for `request`, sleeping between polls: MPI's blocking calls spin, and a rank waiting for
// another would take a core from the ranks still tokenizing.
constexpr auto kPollInterval = std::chrono::microseconds(200);
void wait_sleeping(comm::Request& request) {
  while (!request.test()) std::this_thread::sleep_for(kPollInterval);
}

// What a rank other than 0 sends rank 0 (kPartitionTag), a header of three numbers: a record
// {tag, its size in bytes, 0}, then its bytes; a chunk's end {chunk, kChunkEnd, its line count};
// the rank's end {0, kRankDone, 0}.
constexpr int64_t kRankDone = -1;
constexpr int64_t kChunkEnd = -2;
using Header = std::array<int64_t, 3>;

// Rank 0: hands out the chunks and writes them in order, each chunk's segments into their
// outputs' writers (round robin: partition p's; partition 0's are the outputs, the others are
// appended to them at the end), each batch as its rank makes it: its own batches with their
// tokens as they are tokenized, the other ranks' as their index records arrive (Header). For
// another rank's batch it reserves the tokens' place in the output's token files
// (TokenDatasetWriter::reserve_documents) and sends the rank that place ({tag, output, byte offset
// per key}, kPlacementTag; offsets -1 for "drop them", after an error), and that rank writes them
// there (SegmentSender), so tokens never cross MPI. A record whose turn has not come waits in its
// rank's queue for its stream. A rank makes its chunks in the order it claimed them and ends each
// with its line count, so when a chunk's turn comes every chunk before it has ended and its
// streams' partitions are known (PartitionLayout). Claims from the other ranks (SegmentClaimer)
// are answered whenever rank 0 is between batches.
class SegmentWriter {
 public:
  // `writers`: per output, one writer per key. `placing`: per rank, whether it writes its own
  // tokens (SegmentSender) or sends whole records.
  SegmentWriter(comm::Communicator& world, const PartitionLayout& layout,
                std::vector<std::vector<data::TokenDatasetWriter>>& writers, std::vector<bool> placing,
                const std::string& output_prefix, size_t& budget)
      : world_(world), layout_(layout), writers_(writers), placing_(std::move(placing)),
        owner_(static_cast<size_t>(layout.chunks), -1), chunk_lines_(static_cast<size_t>(layout.chunks), -1),
        first_lines_{0}, finished_(static_cast<size_t>(world.size())), done_(static_cast<size_t>(world.size())),
        headers_(static_cast<size_t>(world.size())), pending_(static_cast<size_t>(world.size())),
        claim_asks_(static_cast<size_t>(world.size())), claim_pending_(static_cast<size_t>(world.size())) {
    for (int r = 0; r < world.size(); ++r) {
      for (int stream = 0; stream < layout.streams; ++stream) {
        queues_.push_back(std::make_unique<RecordQueue>(output_prefix, budget));
      }
      if (r == 0) continue;
      listen(r);
      if (r < layout_.partitions) listen_for_claim(r);  // a rank holding no partition claims nothing
    }
  }

  // After an error on rank 0 (a bad line, a failed write) the other ranks are told there is
  // nothing more to claim and their records are taken in, never written, until each is done, so that
  // no rank waits for rank 0 and no receive is left posted; the error then stops the job.
  ~SegmentWriter() {
    try {
      next_claim_ = layout_.chunks;
      finished_[0] = layout_.chunks;
      done_[0] = true;
      while (!every_rank_done()) {
        answer_claims();
        take_in_records();
        drop_other_ranks_records();
        std::this_thread::sleep_for(kPollInterval);
      }
      wait_for_sends();
    } catch (...) {  // a destructor cannot throw: the error already on its way stops the job
    }
  }
  SegmentWriter(const SegmentWriter&) = delete;
  SegmentWriter& operator=(const SegmentWriter&) = delete;

  // The next chunk for `rank`, or -1 when every chunk is claimed.
  int64_t claim(int rank) {
    if (next_claim_ == layout_.chunks) return -1;
    owner_[static_cast<size_t>(next_claim_)] = rank;
    return next_claim_++;
  }

  // One of rank 0's batches of segment `tag` (its chunks come in order).
  void add_own(int64_t tag, const std::vector<KeyOutput>& keys) {
    const int64_t chunk = layout_.chunk_of(tag);
    finished_[0] = chunk;
    receive();
    if (next_ == chunk) {  // its turn: the chunk's first line, so its streams' outputs, are known
      const int output = layout_.output_of(layout_.stream_of(tag), first_lines_.at(static_cast<size_t>(chunk)));
      std::vector<data::TokenDatasetWriter>& writers = writers_[static_cast<size_t>(output)];
      for (size_t k = 0; k < writers.size(); ++k) write_documents(keys[k], writers[k]);
    } else {
      queue(0, layout_.stream_of(tag)).push(tag, encode_record(keys));
    }
  }

  // The end of one of rank 0's chunks.
  void end_own_chunk(int64_t chunk, int64_t lines) {
    end_chunk(0, chunk, lines);
    receive();
  }

  // Writes everything once rank 0 has made all its batches, answering claims until every rank is
  // done (has written its tokens where it was told).
  void finish() {
    finished_[0] = layout_.chunks;
    done_[0] = true;
    while (!receive() || !every_rank_done()) std::this_thread::sleep_for(kPollInterval);
    wait_for_sends();
  }

 private:
  // A claim's answer on its way to a rank (std::deque: elements stay where they are while sent).
  struct Answer {
    int64_t chunk = -1;
    std::unique_ptr<comm::Request> request;
  };
  // A batch's place in the token files on its way to the rank that holds its tokens.
  struct Placement {
    std::vector<int64_t> values;  // {tag, output, byte offset per key}
    std::unique_ptr<comm::Request> request;
  };

  RecordQueue& queue(int rank, int stream) { return *queues_[static_cast<size_t>(rank * layout_.streams + stream)]; }

  // Notes that `rank` has made every chunk up to `chunk` and that `chunk` has `lines` lines; the
  // first line index of every chunk whose predecessors' counts are all known follows.
  void end_chunk(int rank, int64_t chunk, int64_t lines) {
    if (chunk < 0 || chunk >= layout_.chunks || lines < 0) {
      throw Error("partition chunk end", "chunk " + std::to_string(chunk) + " of " + std::to_string(layout_.chunks) +
                                             " with " + std::to_string(lines) + " lines from rank " + std::to_string(rank));
    }
    chunk_lines_[static_cast<size_t>(chunk)] = lines;
    finished_[static_cast<size_t>(rank)] = chunk + 1;
    while (first_lines_.size() <= static_cast<size_t>(layout_.chunks) - 1 &&
           chunk_lines_[first_lines_.size() - 1] >= 0) {
      first_lines_.push_back(first_lines_.back() + chunk_lines_[first_lines_.size() - 1]);
    }
  }

  void send_placement(int rank, std::vector<int64_t> values) {
    while (!placements_.empty() && placements_.front().request->test()) placements_.pop_front();
    Placement& placement = placements_.emplace_back();
    placement.values = std::move(values);
    placement.request = world_.send_async(placement.values.data(), static_cast<int64_t>(placement.values.size()),
                                          DType::i64, rank, kPlacementTag);
  }

  void wait_for_sends() {
    for (Answer& answer : answers_) wait_sleeping(*answer.request);
    answers_.clear();
    for (Placement& placement : placements_) wait_sleeping(*placement.request);
    placements_.clear();
  }

  // After an error: the other ranks' records are dropped, and a rank holding tokens for one is
  // told to drop them.
  void drop_other_ranks_records() {
    for (int r = 1; r < world_.size(); ++r) {
      for (int stream = 0; stream < layout_.streams; ++stream) {
        RecordQueue& records = queue(r, stream);
        while (!records.empty()) {
          const int64_t tag = records.front_tag();
          records.pop();
          if (!placing_[static_cast<size_t>(r)]) continue;
          std::vector<int64_t> drop(writers_[0].size() + 2, -1);
          drop[0] = tag;
          drop[1] = 0;
          send_placement(r, std::move(drop));
        }
      }
    }
  }

  void listen(int rank) {
    pending_[static_cast<size_t>(rank)] =
        world_.recv_async(headers_[static_cast<size_t>(rank)].data(), 3, DType::i64, rank, kPartitionTag);
  }
  void listen_for_claim(int rank) {
    claim_pending_[static_cast<size_t>(rank)] =
        world_.recv_async(&claim_asks_[static_cast<size_t>(rank)], 1, DType::i64, rank, kClaimTag);
  }

  // Answers the claims that have arrived; a rank told -1 asks no more.
  void answer_claims() {
    while (!answers_.empty() && answers_.front().request->test()) answers_.pop_front();
    for (int r = 1; r < world_.size(); ++r) {
      std::unique_ptr<comm::Request>& pending = claim_pending_[static_cast<size_t>(r)];
      if (!pending || !pending->test()) continue;
      Answer& answer = answers_.emplace_back();
      answer.chunk = claim(r);
      answer.request = world_.send_async(&answer.chunk, 1, DType::i64, r, kClaimTag);
      pending.reset();
      if (answer.chunk >= 0) listen_for_claim(r);
    }
  }

  // Every rank has said it is done (a rank that ended the last chunk may still be writing tokens).
  bool every_rank_done() const { return std::all_of(done_.begin(), done_.end(), [](bool done) { return done; }); }

  // Answers claims, takes in what has arrived and writes what is due; true once every segment is written.
  bool receive() {
    answer_claims();
    take_in_records();
    return write_due();
  }

  // Writes the chunks in order as far as their records have come, each chunk's segments into
  // their outputs; true once all are written. A chunk's turn comes once every chunk before it has
  // ended, so its first line, and so the output of each of its streams, is known. All of a
  // chunk's segments are written before any of the next: each queue (a rank's stream) holds its
  // records in chunk order, while a stream's output changes from chunk to chunk.
  bool write_due() {
    while (next_ < layout_.chunks) {
      const int owner = owner_[static_cast<size_t>(next_)];
      if (owner < 0) return false;  // not claimed yet
      const int64_t first_line = first_lines_.at(static_cast<size_t>(next_));
      for (int stream = 0; stream < layout_.streams; ++stream) {
        RecordQueue& records = queue(owner, stream);
        const int64_t tag = layout_.tag(stream, next_);
        const int output = layout_.output_of(stream, first_line);
        std::vector<data::TokenDatasetWriter>& writers = writers_[static_cast<size_t>(output)];
        while (!records.empty() && records.front_tag() == tag) {
          if (!placing_[static_cast<size_t>(owner)]) {
            write_record(records.pop(), writers);
          } else {
            send_placement(owner, reserve_record(tag, output, records.pop(), writers));
          }
        }
      }
      if (finished_[static_cast<size_t>(owner)] <= next_) return false;
      ++next_;
    }
    return true;
  }

  // Queues the records that have arrived from the other ranks and notes the chunks and ranks that are done.
  void take_in_records() {
    for (int r = 1; r < world_.size(); ++r) {
      const size_t q = static_cast<size_t>(r);
      while (pending_[q] && pending_[q]->test()) {
        const auto [tag, size, lines] = headers_[q];
        pending_[q].reset();
        if (size == kRankDone) {
          finished_[q] = layout_.chunks;
          done_[q] = true;
          break;
        }
        if (size == kChunkEnd) {
          end_chunk(r, tag, lines);
        } else {
          std::string record(static_cast<size_t>(size), '\0');
          world_.recv(record.data(), size, DType::u8, r, kPartitionTag);
          finished_[q] = layout_.chunk_of(tag);
          queue(r, layout_.stream_of(tag)).push(tag, std::move(record));
        }
        listen(r);
      }
    }
  }

  comm::Communicator& world_;
  const PartitionLayout& layout_;
  std::vector<std::vector<data::TokenDatasetWriter>>& writers_;  // per output, per key
  std::vector<bool> placing_;          // per rank: it writes its own tokens, sending index records
  std::vector<int> owner_;             // per chunk: the rank that claimed it, -1 before
  std::vector<int64_t> chunk_lines_;   // per chunk: its line count once it has ended, -1 before
  std::vector<int64_t> first_lines_;   // the first line index of chunks 0, 1, ... as far as known
  int64_t next_claim_ = 0;             // the first chunk not claimed
  int64_t next_ = 0;                   // the chunk whose segments are being written
  std::vector<int64_t> finished_;      // per rank: all its chunks before this one are made
  std::vector<bool> done_;             // per rank: it has said it is done (its tokens written, durable)
  std::vector<Header> headers_;
  std::vector<std::unique_ptr<comm::Request>> pending_;
  std::vector<int64_t> claim_asks_;  // per rank: the claim being received (its value is unused)
  std::vector<std::unique_ptr<comm::Request>> claim_pending_;
  std::deque<Answer> answers_;
  std::deque<Placement> placements_;
  // Per rank and stream (queue()): whole records, or index records (placing_).
  std::vector<std::unique_ptr<RecordQueue>> queues_;
};

// A rank other than 0: claims its chunks from rank 0, one ahead of the one it is reading, so it
// seldom waits for an answer (rank 0 answers between its batches).
class SegmentClaimer {
 public:
  explicit SegmentClaimer(comm::Communicator& world) : world_(world) {}

  // The next chunk this rank claimed, or -1 when none is left.
  int64_t next() {
    for (;;) {
      if (answer_ && answer_->test()) take_answer();
      if (!claimed_.empty()) {
        const int64_t chunk = claimed_.front();
        claimed_.pop_front();
        ask();
        return chunk;
      }
      if (no_more_) {
        if (ask_sent_) wait_sleeping(*ask_sent_);
        ask_sent_.reset();
        return -1;
      }
      ask();
      wait_sleeping(*answer_);
    }
  }

 private:
  // Asks for one more chunk unless one is claimed or asked for already.
  void ask() {
    if (answer_ || no_more_ || !claimed_.empty()) return;
    if (ask_sent_) wait_sleeping(*ask_sent_);
    ask_sent_ = world_.send_async(&ask_, 1, DType::i64, 0, kClaimTag);
    answer_ = world_.recv_async(&answered_, 1, DType::i64, 0, kClaimTag);
  }

  void take_answer() {
    answer_.reset();
    if (answered_ < 0) {
      no_more_ = true;
    } else {
      claimed_.push_back(answered_);
    }
  }

  comm::Communicator& world_;
  int64_t ask_ = 1, answered_ = -1;
  std::unique_ptr<comm::Request> ask_sent_, answer_;
  std::deque<int64_t> claimed_;
  bool no_more_ = false;
};

// A rank other than 0: sends each batch to rank 0 as it is made, and each chunk's end. Where it
// can open rank 0's writers' token files (a filesystem the ranks share), it sends the batch's index
// record only (encode_record without tokens), keeps the tokens until rank 0, which writes each
// output's index in chunk order, sends their place in each of the output's token files
// (SegmentWriter), and writes them there itself (data::TokenSpoolWriter), so tokens never cross
// MPI; otherwise it sends whole records and rank 0 writes them. Rank 0 answers whenever it is
// between batches; while it is not (a long line), at most kMaxHeld bytes of records and tokens
// wait here before this rank waits too. finish() writes the rest, makes the writes into the
// outputs durable (the other partitions' token files are only read by rank 0, which copies them
// into the outputs) and closes the files, then sends a header saying this rank is done.
class SegmentSender {
 public:
  // `outputs`: per output (a partition), a writer into rank 0's token file per key; none when
  // this rank sends whole records.
  SegmentSender(comm::Communicator& world, std::vector<std::vector<std::unique_ptr<data::TokenSpoolWriter>>> outputs)
      : world_(world), outputs_(std::move(outputs)), placement_(outputs_.empty() ? 2 : outputs_[0].size() + 2) {}

  void send(int64_t tag, std::vector<KeyOutput>& keys) {
    const bool places_tokens = !outputs_.empty();
    InFlight& sent = in_flight_.emplace_back();
    sent.record = encode_record(keys, !places_tokens);
    sent.header = {tag, static_cast<int64_t>(sent.record.size()), 0};
    sent.header_request = world_.send_async(sent.header.data(), 3, DType::i64, 0, kPartitionTag);
    sent.record_request = world_.send_async(sent.record.data(), sent.header[1], DType::u8, 0, kPartitionTag);
    held_bytes_ += sent.record.size();
    if (places_tokens) {
      Held& held = held_[tag].emplace_back();
      for (KeyOutput& out : keys) {
        held_bytes_ += out.tokens.size() * sizeof(int32_t);
        held.tokens.push_back(std::move(out.tokens));
      }
    }
    drain(false);
  }

  void end_chunk(int64_t chunk, int64_t lines) {
    InFlight& sent = in_flight_.emplace_back();
    sent.header = {chunk, kChunkEnd, lines};
    sent.header_request = world_.send_async(sent.header.data(), 3, DType::i64, 0, kPartitionTag);
    drain(false);
  }

  void finish() {
    drain(true);
    for (size_t output = 0; output < outputs_.size(); ++output) {
      for (const auto& writer : outputs_[output]) writer->close(output == 0);
    }
    InFlight& done = in_flight_.emplace_back();
    done.header = {0, kRankDone, 0};
    done.header_request = world_.send_async(done.header.data(), 3, DType::i64, 0, kPartitionTag);
    wait_sleeping(*done.header_request);
    in_flight_.clear();
  }

 private:
  struct InFlight {
    Header header{};
    std::string record;
    std::unique_ptr<comm::Request> header_request, record_request;  // no record_request for a chunk's end
  };
  struct Held {
    std::vector<std::vector<int32_t>> tokens;  // per key
  };

  bool sent(InFlight& message, bool wait) {
    for (auto* request : {message.header_request.get(), message.record_request.get()}) {
      if (request == nullptr) continue;
      if (wait) {
        wait_sleeping(*request);
      } else if (!request->test()) {
        return false;
      }
    }
    return true;
  }

  // Lets go of the messages sent and writes the held batches whose place has come (rank 0 places
  // each segment's batches in the order they were sent); waits while more than kMaxHeld bytes are
  // held, or, with `all`, until nothing is.
  void drain(bool all) {
    while (!in_flight_.empty()) {
      InFlight& oldest = in_flight_.front();
      if (!sent(oldest, all || held_bytes_ > kMaxHeld)) break;
      held_bytes_ -= oldest.record.size();
      in_flight_.pop_front();
    }
    while (!held_.empty()) {
      if (!placed_) {
        placed_ = world_.recv_async(placement_.data(), static_cast<int64_t>(placement_.size()), DType::i64, 0,
                                    kPlacementTag);
      }
      if (all || held_bytes_ > kMaxHeld) {
        wait_sleeping(*placed_);
      } else if (!placed_->test()) {
        return;
      }
      placed_.reset();
      write_placed();
    }
  }

  // Writes the oldest held batch of the segment placement_ is for into the token files of the
  // output (the partition) rank 0 placed it in, where it says.
  void write_placed() {
    const int64_t tag = placement_[0];
    const auto found = held_.find(tag);
    if (found == held_.end() || placement_[1] < 0 || placement_[1] >= static_cast<int64_t>(outputs_.size())) {
      throw Error("partition placement", "for segment " + std::to_string(tag) + " in output " +
                                             std::to_string(placement_[1]) + " came for no batch held");
    }
    const size_t output = static_cast<size_t>(placement_[1]);
    Held& oldest = found->second.front();
    for (size_t k = 0; k < oldest.tokens.size(); ++k) {
      if (placement_[k + 2] >= 0) outputs_[output][k]->write_at(placement_[k + 2], oldest.tokens[k]);
      held_bytes_ -= oldest.tokens[k].size() * sizeof(int32_t);
    }
    found->second.pop_front();
    if (found->second.empty()) held_.erase(found);
  }

  static constexpr size_t kMaxHeld = size_t{64} << 20;
  comm::Communicator& world_;
  // Per output, per key; none: whole records are sent.
  std::vector<std::vector<std::unique_ptr<data::TokenSpoolWriter>>> outputs_;
  std::deque<InFlight> in_flight_;  // std::deque: elements stay where they are while sent
  std::map<int64_t, std::deque<Held>> held_;  // per segment tag, in the order sent; no empty entry
  size_t held_bytes_ = 0;  // of the records in flight and the tokens held
  std::vector<int64_t> placement_;  // the place being received: {tag, output, byte offset per key}
  std::unique_ptr<comm::Request> placed_;
};

// The fields of `text`, each ended by a NUL (as rank 0 broadcasts lists of names).
std::vector<std::string> nul_ended_fields(const std::string& text) {
  std::vector<std::string> fields;
  for (size_t start = 0, end; (end = text.find('\0', start)) != std::string::npos; start = end + 1) {
    fields.push_back(text.substr(start, end - start));
  }
  return fields;
}

// Rank 0's plan on every rank (broadcast as text: the reuse flag, then per file of the plan its
// name and size, each ended by a NUL).
void share_partition_plan(comm::Communicator& world, PartitionFiles& plan, const std::string& pattern,
                          int partitions) {
  if (world.size() == 1) return;
  std::string text;
  if (world.rank() == 0) {
    text = std::string(plan.reused ? "1" : "0") + '\0';
    const std::vector<std::string>& files = plan.reused ? plan.paths : plan.inputs;
    for (size_t f = 0; f < files.size(); ++f) text += files[f] + '\0' + std::to_string(plan.bytes[f]) + '\0';
  }
  comm::broadcast_text(world, text, 0);
  if (world.rank() == 0) return;
  plan = PartitionFiles{};
  for (int i = 0; i < partitions; ++i) plan.paths.push_back(partition_file_name(pattern, i));
  plan.reused = text.at(0) == '1';
  const std::vector<std::string> fields = nul_ended_fields(text);
  for (size_t i = 1; i + 1 < fields.size(); i += 2) {
    if (!plan.reused) plan.inputs.push_back(fields[i]);
    plan.bytes.push_back(std::stoll(fields[i + 1]));
  }
}

// On a rank other than 0: every file of the plan exists and has the size rank 0 saw, so ranks on
// nodes without a shared filesystem stop, naming the file, rather than read different lines.
void check_partition_files(const comm::Communicator& world, const PartitionFiles& plan) {
  if (world.rank() == 0) return;
  const std::vector<std::string>& files = plan.reused ? plan.paths : plan.inputs;
  const std::string rank = std::to_string(world.rank());
  for (size_t f = 0; f < files.size(); ++f) {
    const int64_t bytes = file_bytes(files[f]);
    if (bytes < 0) {
      throw Error(files[f], "not found on rank " + rank +
                                ": --partitions under MPI reads the input on every rank; put it on a filesystem they share");
    }
    if (bytes != plan.bytes[f]) {
      throw Error(files[f], "is " + std::to_string(bytes) + " bytes on rank " + rank + " but " +
                                std::to_string(plan.bytes[f]) + " on rank 0: --partitions under MPI needs the same "
                                "input on every rank (a filesystem they share)");
    }
  }
}

// Rank 0's writers' token files (TokenDatasetWriter::token_spool_path), on every rank: per partition,
// one per key.
std::vector<std::vector<std::string>> share_token_files(comm::Communicator& world, const PartitionLayout& layout,
                                                        const std::vector<std::vector<data::TokenDatasetWriter>>& writers) {
  std::string text;
  for (const auto& partition : writers) {
    for (const data::TokenDatasetWriter& out : partition) text += out.token_spool_path() + '\0';
  }
  if (world.size() > 1) comm::broadcast_text(world, text, 0);
  const std::vector<std::string> paths = nul_ended_fields(text);
  const size_t keys = paths.size() / static_cast<size_t>(layout.streams);
  std::vector<std::vector<std::string>> per_partition;
  for (size_t first = 0; first < paths.size(); first += keys) {
    per_partition.emplace_back(paths.begin() + static_cast<std::ptrdiff_t>(first), paths.begin() + static_cast<std::ptrdiff_t>(first + keys));
  }
  return per_partition;
}

// On a rank other than 0 that holds partitions: its writers into rank 0's token files (per partition,
// per key), or none (a warning on stderr) where it cannot open them: no filesystem shared with
// rank 0, whose outputs then take this rank's tokens over MPI.
std::vector<std::vector<std::unique_ptr<data::TokenSpoolWriter>>> open_token_files(
    const comm::Communicator& world, const std::vector<std::vector<std::string>>& paths, int held, int64_t vocab_size) {
  std::vector<std::vector<std::unique_ptr<data::TokenSpoolWriter>>> outputs;
  if (held == 0 || world.rank() == 0) return outputs;
  for (const std::vector<std::string>& partition : paths) {
    std::vector<std::unique_ptr<data::TokenSpoolWriter>>& partition_outputs = outputs.emplace_back();
    for (const std::string& path : partition) {
      try {
        partition_outputs.push_back(std::make_unique<data::TokenSpoolWriter>(path, vocab_size));
      } catch (const Error& e) {
        log::warn(std::string("--partitions: ") + e.what() +
                  ": no filesystem shared with rank 0's outputs, so this rank sends its tokens to rank 0");
        return {};
      }
    }
  }
  return outputs;
}

// Per rank, whether it writes its own tokens into rank 0's token files (every rank learns all).
std::vector<bool> ranks_placing_tokens(comm::Communicator& world, bool places_tokens) {
  std::vector<int64_t> flags(static_cast<size_t>(world.size()));
  flags[static_cast<size_t>(world.rank())] = places_tokens ? 1 : 0;
  if (world.size() > 1) wait_sleeping(*world.all_reduce_async(flags.data(), world.size(), DType::i64, comm::ReduceOp::sum));
  return std::vector<bool>(flags.begin(), flags.end());
}

// Returns once every rank has checked its input (check_partition_files): no rank goes on, and
// rank 0 makes no output, before then.
void wait_for_every_rank(comm::Communicator& world) {
  if (world.size() == 1) return;
  int64_t ready = 1;
  wait_sleeping(*world.all_reduce_async(&ready, 1, DType::i64, comm::ReduceOp::sum));
}

void check_partition_options(const PreprocessOptions& options, int partitions) {
  check_workers(options.workers);
  if (partitions < 2) throw UsageError("--partitions", "a partitioned run needs at least 2");
  if (options.workers % partitions != 0) {
    throw UsageError("--workers " + std::to_string(options.workers),
                     "must be divisible by --partitions " + std::to_string(partitions) +
                         " (as Megatron: each partition gets workers / partitions)");
  }
  if (options.input.inputs.size() != 1 || options.input.inputs[0] == "-") {
    throw UsageError("--input", "--partitions takes one input file or glob pattern (not stdin)");
  }
}

// The counts of every rank's partitions, summed.
PreprocessStats sum_over_ranks(comm::Communicator& world, const PreprocessStats& mine) {
  std::vector<int64_t> counts{mine.documents,  mine.empty_documents, mine.sequences, mine.tokens,
                              mine.text_bytes, mine.replaced,        mine.bad_lines, mine.blank_lines};
  wait_sleeping(*world.all_reduce_async(counts.data(), static_cast<int64_t>(counts.size()), DType::i64, comm::ReduceOp::sum));
  PreprocessStats total;
  total.documents = counts[0], total.empty_documents = counts[1], total.sequences = counts[2], total.tokens = counts[3];
  total.text_bytes = counts[4], total.replaced = counts[5], total.bad_lines = counts[6], total.blank_lines = counts[7];
  return total;
}

// A bad line's number in its file: a batch from a file part that does not start the file counts
// its lines from there, so the lines before it are counted now.
BadLine numbered_in_file(BadLine bad, const LineBatch& lines) {
  bad.line += count_lines(lines.file, 0, lines.lines_from);
  return bad;
}

}  // namespace

PreprocessStats preprocess_partitions(const Tokenizer& tokenizer, const PreprocessOptions& options,
                                      const PartitionOptions& partitions, comm::Communicator& world,
                                      const PreprocessProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  const int n = partitions.partitions;
  check_partition_options(options, n);
  const std::optional<int32_t> eod = checked_eod(tokenizer, options);
  ParserPool pool(options.json_keys);
  const std::string& pattern = options.input.inputs[0];
  PartitionFiles plan;
  if (world.rank() == 0) plan = plan_partition_files(pattern, partitions);
  share_partition_plan(world, plan, pattern, n);
  check_partition_files(world, plan);
  int held = 0;  // partitions r, r + size, ...: workers / N threads each
  for (int p = world.rank(); p < n; p += world.size()) ++held;

  wait_for_every_rank(world);
  const PartitionLayout layout(plan, partitions);
  // Rank 0 hands out the chunks and writes each partition's index, every segment in turn; the
  // other ranks claim theirs from it, send it their index and write their tokens where it says.
  std::vector<std::vector<data::TokenDatasetWriter>> writers;  // per output (partition), per key
  if (world.rank() == 0) writers = create_partition_writers(tokenizer, options, layout.streams);
  std::vector<std::vector<std::unique_ptr<data::TokenSpoolWriter>>> token_outputs =
      open_token_files(world, share_token_files(world, layout, writers), held, tokenizer.vocab_size());
  const std::vector<bool> placing = ranks_placing_tokens(world, !token_outputs.empty());
  size_t budget = partitions.spool_memory_bytes;
  std::optional<SegmentWriter> writer;
  std::optional<SegmentSender> sender;
  std::optional<SegmentClaimer> claimer;
  std::function<int64_t()> claim = [] { return int64_t{-1}; };  // a rank holding no partition
  if (world.rank() == 0) {
    writer.emplace(world, layout, writers, placing, options.output_prefix, budget);
    claim = [&] { return writer->claim(0); };
  } else {
    sender.emplace(world, std::move(token_outputs));
    if (held > 0) {
      claimer.emplace(world);
      claim = [&] { return claimer->next(); };
    }
  }
  SegmentDealer dealer(layout, claim, options.input);
  PreprocessStats mine;
  run_ordered_pipeline<PartitionBatch>(
      options.workers / n * held, [&](PartitionBatch& batch) { return dealer.next(batch); },
      [&](PartitionBatch& batch) { tokenize_batch(tokenizer, pool, options, eod, batch); },
      [&](PartitionBatch& batch) {
        if (batch.error) throw Error(numbered_in_file(*batch.error, batch.lines).message(), "");
        if (batch.chunk_lines >= 0) {
          if (writer) {
            writer->end_own_chunk(batch.tag, batch.chunk_lines);
          } else {
            sender->end_chunk(batch.tag, batch.chunk_lines);
          }
        } else if (writer) {
          writer->add_own(batch.tag, batch.keys);
        } else {
          sender->send(batch.tag, batch.keys);
        }
        add_counts(mine, batch.stats);
        mine.input_bytes = dealer.bytes_read();
        mine.seconds = seconds_since(start);
        if (progress) progress(mine);
      });
  if (writer) {
    writer->finish();
  } else {
    sender->finish();
  }
  PreprocessStats total = sum_over_ranks(world, mine);
  std::vector<std::string> outputs;
  for (size_t k = 0; writer && k < writers[0].size(); ++k) {
    data::TokenDatasetWriter& out = writers[0][k];
    for (size_t partition = 1; partition < writers.size(); ++partition) out.append_writer(std::move(writers[partition][k]));
    if (out.document_count() != total.documents) {  // every line made is written, once
      throw Error("--partitions", "the ranks made " + std::to_string(total.documents) + " documents but " +
                                      std::to_string(out.document_count()) + " were written");
    }
    out.finish();
    for (const std::string& path : out.final_paths()) outputs.push_back(path);
  }
  for (int64_t bytes : plan.bytes) total.input_bytes += bytes;
  total.outputs = std::move(outputs);
  total.partition_files_reused = plan.reused;
  total.partitioned_inputs = plan.inputs;
  total.seconds = seconds_since(start);
  return total;
}

PreprocessStats encode_stream(const Tokenizer& tokenizer, const EncodeOptions& options,
                              const std::function<void(std::span<const int32_t>, bool)>& emit,
                              const PreprocessProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  check_workers(options.workers);
  LineReader reader(options.input);
  PreprocessStats total;

  if (options.raw) {
    struct Chunk {
      std::string_view text;
      bool first = false, last = false;
      std::vector<int32_t> ids;
    };
    const std::string text = reader.read_all_text(total);
    total.input_bytes = reader.input_bytes();
    std::vector<size_t> cuts;
    // Special tokens may hold spaces, so text that recognises them is not cut; nor is text whose
    // tokenizer treats a text's start specially.
    if (options.workers > 1 && !options.allow_special && tokenizer.encodes_parts_alike()) {
      cuts = split_points_for_parallel_encoding(text, size_t{1} << 18);
    }
    cuts.push_back(text.size());
    size_t next_cut = 0, begin = 0;
    run_ordered_pipeline<Chunk>(
        options.workers,
        [&](Chunk& chunk) {
          if (next_cut == cuts.size()) return false;
          chunk.text = std::string_view(text).substr(begin, cuts[next_cut] - begin);
          chunk.first = next_cut == 0;
          begin = cuts[next_cut++];
          chunk.last = next_cut == cuts.size();
          return true;
        },
        [&](Chunk& chunk) {
          // The document is one sequence: the template's ids go before its first piece and after its last.
          const auto prefix = tokenizer.sequence_prefix(), suffix = tokenizer.sequence_suffix();
          if (chunk.first) chunk.ids.assign(prefix.begin(), prefix.end());
          tokenizer.encode(chunk.text, chunk.ids, options.allow_special);
          if (chunk.last) chunk.ids.insert(chunk.ids.end(), suffix.begin(), suffix.end());
        },
        [&](Chunk& chunk) {
          total.tokens += static_cast<int64_t>(chunk.ids.size());
          emit(chunk.ids, chunk.last);
        });
    total.sequences = total.tokens > 0 ? 1 : 0;
    total.empty_documents = total.tokens > 0 ? 0 : 1;
    total.seconds = seconds_since(start);
    return total;
  }

  PreprocessOptions jsonl;
  jsonl.json_keys = {options.json_key};
  jsonl.allow_special = options.allow_special;
  jsonl.skip_bad_lines = options.skip_bad_lines;
  jsonl.input = options.input;
  ParserPool pool(jsonl.json_keys);
  run_ordered_pipeline<TokenizedBatch>(
      options.workers, [&](TokenizedBatch& batch) { return reader.next(batch.lines); },
      [&](TokenizedBatch& batch) { tokenize_batch(tokenizer, pool, jsonl, std::nullopt, batch); },
      [&](TokenizedBatch& batch) {
        const KeyOutput& out = batch.keys[0];
        const int32_t* tokens = out.tokens.data();
        size_t sequence = 0;
        for (int32_t count : out.sequences_per_document) {
          size_t length = 0;
          for (int32_t s = 0; s < count; ++s) length += static_cast<size_t>(out.sequence_lengths[sequence++]);
          emit({tokens, length}, true);
          tokens += length;
        }
        if (batch.error) throw Error(batch.error->message(), "");
        add_counts(total, batch.stats);
        total.input_bytes = reader.input_bytes();
        total.seconds = seconds_since(start);
        if (progress) progress(total);
      });
  total.input_bytes = reader.input_bytes();
  total.seconds = seconds_since(start);
  return total;
}

PreprocessStats read_texts(const LineInputOptions& input, bool raw, const std::string& json_key, bool skip_bad_lines,
                           const std::function<void(std::string_view)>& text_fn) {
  const auto start = std::chrono::steady_clock::now();
  LineReader reader(input);
  PreprocessStats total;
  if (raw) {
    text_fn(reader.read_all_text(total));
  } else {
    JsonlLineParser parser({json_key});
    std::vector<KeyTexts> texts;
    LineBatch batch;
    while (reader.next(batch)) {
      if (auto error = too_long_line(batch, input.max_line_bytes, skip_bad_lines, total)) throw Error(error->message(), "");
      for_each_line(batch, total, [&](std::string_view line, int64_t line_number) {
        if (auto error = parse_line(parser, line, batch.file, line_number, input.max_line_bytes, texts, total)) {
          if (!skip_bad_lines) throw Error(error->message(), "");
          ++total.bad_lines;
          return true;
        }
        ++total.documents;
        for (const std::string& text : texts[0]) {
          total.text_bytes += static_cast<int64_t>(text.size());
          text_fn(text);
        }
        return true;
      });
      batch = LineBatch{};
    }
  }
  total.input_bytes = reader.input_bytes();
  total.seconds = seconds_since(start);
  return total;
}

}  // namespace mt::text

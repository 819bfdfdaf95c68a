// Corpus tokenization: Megatron's preprocess_data and the streaming encoder (see preprocess.h).
// Tested in tests/unit/text/test_preprocess.cpp, tests/tools/mt-tokenize.bats and
// tests/tools/mt-tokenize-partitions.bats.
#include "text/preprocess.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "core/input_file.h"
#include "core/ordered_pipeline.h"
#include "text/jsonl.h"
#include "text/unicode.h"

namespace mt::text {
namespace {

// Whole lines of one input file, or (too_long) no bytes for the one line first_line, which
// was longer than max_line_bytes and was read past without being kept.
struct LineBatch {
  std::string bytes;
  std::string file;
  int64_t first_line = 1;
  bool too_long = false;
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

struct TokenizedBatch {
  LineBatch lines;
  std::vector<KeyOutput> keys;  // one per json key
  PreprocessStats stats;        // documents, empty, sequences, tokens, text bytes, replaced, bad lines
  std::string error;            // "<file>:<line>: <reason>" of the first bad line (not skipping)
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
    ++line_number;
  }
}

// Parses one JSONL line into `texts` and adds its replacements to `stats`; a bad line (malformed,
// too long, wrong value type) returns its "<file>:<line>: <reason>" message instead.
std::optional<std::string> parse_line(JsonlLineParser& parser, std::string_view line, const std::string& file,
                                      int64_t line_number, size_t max_line_bytes, std::vector<KeyTexts>& texts,
                                      PreprocessStats& stats) {
  try {
    if (line.size() > max_line_bytes) throw Error(too_long_message(max_line_bytes), "");
    stats.replaced += static_cast<int64_t>(parser.parse(line, texts));
    return std::nullopt;
  } catch (const Error& e) {
    return file + ":" + std::to_string(line_number) + ": " + e.what();
  }
}

// A line the reader skipped as too long: counted with skip_bad_lines, else its error message.
std::optional<std::string> too_long_line(const LineBatch& batch, size_t max_line_bytes, bool skip_bad_lines,
                                         PreprocessStats& stats) {
  if (!batch.too_long) return std::nullopt;
  if (skip_bad_lines) {
    ++stats.bad_lines;
    return std::nullopt;
  }
  return batch.file + ":" + std::to_string(batch.first_line) + ": " + too_long_message(max_line_bytes);
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

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
  if (options.output_prefix.empty()) throw UsageError("--output-prefix", "is required");
  const std::optional<int32_t> eod = tokenizer.eod_id();
  if (options.append_eod && !eod) throw UsageError("--append-eod", "the tokenizer " + tokenizer.name() + " has no end-of-document token");
  ParserPool pool(options.json_keys);
  LineReader reader(options.input);

  const data::TokenDatasetMetadata metadata = dataset_metadata(tokenizer);
  std::vector<data::TokenDatasetWriter> writers;
  for (const std::string& key : options.json_keys) {
    writers.push_back(data::TokenDatasetWriter::create(options.output_prefix + "_" + key + "_document", options.output_format,
                                                 tokenizer.vocab_size(), metadata));
  }

  PreprocessStats total;
  run_ordered_pipeline<TokenizedBatch>(
      options.workers, [&](TokenizedBatch& batch) { return reader.next(batch.lines); },
      [&](TokenizedBatch& batch) { tokenize_batch(tokenizer, pool, options, eod, batch); },
      [&](TokenizedBatch& batch) {
        for (size_t k = 0; k < writers.size(); ++k) {
          const KeyOutput& out = batch.keys[k];
          const int32_t* tokens = out.tokens.data();
          size_t sequence = 0;
          for (int32_t count : out.sequences_per_document) {
            for (int32_t s = 0; s < count; ++s, ++sequence) {
              const size_t length = static_cast<size_t>(out.sequence_lengths[sequence]);
              writers[k].add_sequence({tokens, length});
              tokens += length;
            }
            writers[k].end_document();
          }
        }
        if (!batch.error.empty()) throw Error(batch.error, "");
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

// Calls line_fn(line) for each line of `path` as Python's text mode reads it: LF, CRLF and a lone
// CR end a line, and the line is passed with a LF in their place. A last line without an end
// gets a LF too (Megatron writes it bare, so the next line dealt to its partition joins it and
// that partition fails as malformed JSON).
template <typename LineFn>
void for_each_python_line(const std::string& path, LineFn&& line_fn) {
  if (path.ends_with(".gz")) {
    throw UsageError("--input " + path, "gzip input is not supported (Megatron reads it); decompress it first");
  }
  std::FILE* file = open_input_file(path, "--input");
  char* buffer = nullptr;
  size_t capacity = 0;
  ssize_t length;
  std::string line;
  while ((length = ::getline(&buffer, &capacity, file)) >= 0) {
    std::string_view rest(buffer, static_cast<size_t>(length));
    if (rest.back() == '\n' && std::memchr(buffer, '\r', rest.size()) == nullptr) {
      line_fn(rest);  // the common case: one LF-ended line, passed without a copy
      continue;
    }
    while (!rest.empty()) {
      const size_t end = rest.find_first_of("\r\n");
      if (end == std::string_view::npos) {
        line.assign(rest);
        line.push_back('\n');
        line_fn(std::string_view(line));
        break;
      }
      line.assign(rest.substr(0, end));
      line.push_back('\n');
      line_fn(std::string_view(line));
      const size_t skip = rest[end] == '\r' && end + 1 < rest.size() && rest[end + 1] == '\n' ? 2 : 1;
      rest.remove_prefix(end + skip);
    }
  }
  const bool failed = std::ferror(file) != 0;
  std::free(buffer);
  std::fclose(file);
  if (failed) throw Error("--input " + path, "read failed");
}

// Megatron counts each file's lines with `for fc, _ in enumerate(fin)`; an empty file leaves fc
// as the previous file's (or undefined), so an empty file is refused rather than miscounted.
int64_t count_lines(const std::vector<std::string>& files) {
  int64_t total = 0;
  for (const std::string& file : files) {
    int64_t lines = 0;
    for_each_python_line(file, [&](std::string_view) { ++lines; });
    if (lines == 0) {
      throw UsageError("--keep-sequential-samples",
                       file + " is empty: Megatron counts it as the previous file's lines (or fails); remove it");
    }
    total += lines;
  }
  return total;
}

std::string partition_temporary(const std::string& path) { return path + ".tmp"; }

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
    return plan;
  }
  plan.inputs = expand_input_glob(pattern);
  for (const std::string& file : plan.inputs) {
    if (std::find(existing.begin(), existing.end(), file) != existing.end()) {
      throw UsageError("--input " + pattern, "matches " + file +
                                                 ", a partition file of this run left by an earlier one; remove it");
    }
  }
  if (partitions.keep_sequential) {
    plan.lines_per_partition = (count_lines(plan.inputs) + partitions.partitions - 1) / partitions.partitions;
  }
  return plan;
}

namespace {

// Deals every line of the plan's inputs and writes those of partitions `which` (indices into
// plan.paths) to their temporaries.
void write_partition_temporaries(const PartitionFiles& plan, const PartitionOptions& partitions,
                                 const std::vector<int>& which) {
  std::vector<std::FILE*> outputs(plan.paths.size(), nullptr);
  auto close_all = [&] {
    for (std::FILE*& out : outputs) {
      if (out != nullptr) std::fclose(out);
      out = nullptr;
    }
  };
  for (int i : which) {
    const std::string temporary = partition_temporary(plan.paths.at(static_cast<size_t>(i)));
    outputs[static_cast<size_t>(i)] = std::fopen(temporary.c_str(), "wb");
    if (outputs[static_cast<size_t>(i)] == nullptr) {
      const std::string reason = std::strerror(errno);
      close_all();
      throw Error(temporary, "cannot create: " + reason);
    }
  }
  size_t index = 0;
  int64_t line_count = 0;
  bool write_failed = false;
  try {
    for (const std::string& file : plan.inputs) {
      for_each_python_line(file, [&](std::string_view line) {
        std::FILE* out = outputs[index];
        if (out != nullptr && std::fwrite(line.data(), 1, line.size(), out) != line.size()) write_failed = true;
        if (partitions.keep_sequential) {
          if (++line_count % plan.lines_per_partition == 0) ++index;
        } else {
          index = (index + 1) % outputs.size();
        }
      });
    }
  } catch (...) {
    close_all();
    throw;
  }
  for (int i : which) {
    write_failed = std::fclose(outputs[static_cast<size_t>(i)]) != 0 || write_failed;
    outputs[static_cast<size_t>(i)] = nullptr;
  }
  if (write_failed) throw Error(partition_temporary(plan.paths.at(static_cast<size_t>(which.front()))), "write failed");
}

void rename_partition_temporaries(const PartitionFiles& plan, const std::vector<int>& which) {
  for (int i : which) {
    const std::string& path = plan.paths.at(static_cast<size_t>(i));
    if (std::rename(partition_temporary(path).c_str(), path.c_str()) != 0) {
      throw Error(path, std::string("cannot rename into place: ") + std::strerror(errno));
    }
  }
}

// Rank 0's plan on every rank: the reuse decision, the sequential block size and the matched
// inputs (broadcast as text: the flag, the size, then the file names each ended by a NUL).
void share_partition_plan(comm::Communicator& world, PartitionFiles& plan, const std::string& pattern,
                          int partitions) {
  if (world.size() == 1) return;
  std::string text;
  if (world.rank() == 0) {
    text = std::string(plan.reused ? "1" : "0") + std::to_string(plan.lines_per_partition) + '\0';
    for (const std::string& input : plan.inputs) text += input + '\0';
  }
  comm::broadcast_text(world, text, 0);
  if (world.rank() == 0) return;
  plan = PartitionFiles{};
  for (int i = 0; i < partitions; ++i) plan.paths.push_back(partition_file_name(pattern, i));
  plan.reused = text.at(0) == '1';
  size_t start = text.find('\0');
  plan.lines_per_partition = std::stoll(text.substr(1, start - 1));
  for (size_t end; (end = text.find('\0', start + 1)) != std::string::npos; start = end) {
    plan.inputs.push_back(text.substr(start + 1, end - start - 1));
  }
}

// The partitions a rank writes: partition i by rank (i + 1) % size, so with several ranks every
// rank tokenizes a file another rank wrote and a filesystem that is not shared shows before any
// tokenizing, naming the partition that rank cannot see.
std::vector<int> partitions_written_by(const comm::Communicator& world, int partitions) {
  std::vector<int> mine;
  for (int i = 0; i < partitions; ++i) {
    if ((i + 1) % world.size() == world.rank()) mine.push_back(i);
  }
  return mine;
}

// Rank 0's merge of the partition outputs into `<output_prefix>_<key>_document` (what
// data::merge_token_datasets writes for them: the tokenizer's metadata and vocabulary): the
// partitions are appended in order as they become ready, each from its .bin where there is one
// (copied by the kernel) without a second scan of tokens this run's writers checked.
class PartitionMerge {
 public:
  PartitionMerge(const Tokenizer& tokenizer, const PreprocessOptions& options) : options_(options) {
    for (const std::string& key : options.json_keys) {
      writers_.push_back(data::TokenDatasetWriter::create(options.output_prefix + "_" + key + "_document",
                                                          options.output_format, tokenizer.vocab_size(),
                                                          dataset_metadata(tokenizer)));
    }
  }
  // Appends partitions next_partition_, ..., end - 1.
  void append_through(int end) {
    const char* extension = options_.output_format == data::TokenDatasetFormat::hdf5 ? ".h5" : ".bin";
    for (; next_partition_ < end; ++next_partition_) {
      for (size_t k = 0; k < writers_.size(); ++k) {
        const std::string part = options_.output_prefix + "_" + std::to_string(next_partition_) + "_" +
                                 options_.json_keys[k] + "_document" + extension;
        writers_[k].append_dataset(data::TokenDataset::open(part), data::TokenDatasetWriter::SourceTokens::checked);
      }
    }
  }
  std::vector<std::string> finish() {
    std::vector<std::string> outputs;
    for (data::TokenDatasetWriter& writer : writers_) {
      writer.finish();
      for (const std::string& path : writer.final_paths()) outputs.push_back(path);
    }
    return outputs;
  }

 private:
  const PreprocessOptions& options_;
  std::vector<data::TokenDatasetWriter> writers_;
  int next_partition_ = 0;
};

}  // namespace

PreprocessStats preprocess_partitions(const Tokenizer& tokenizer, const PreprocessOptions& options,
                                      const PartitionOptions& partitions, comm::Communicator& world,
                                      const PreprocessProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  check_workers(options.workers);
  if (partitions.partitions < 2) throw UsageError("--partitions", "a partitioned run needs at least 2");
  if (options.workers % partitions.partitions != 0) {
    throw UsageError("--workers " + std::to_string(options.workers),
                     "must be divisible by --partitions " + std::to_string(partitions.partitions) +
                         " (as Megatron: each partition gets workers / partitions)");
  }
  if (options.input.inputs.size() != 1 || options.input.inputs[0] == "-") {
    throw UsageError("--input", "--partitions takes one input file or glob pattern (not stdin)");
  }
  const std::string& pattern = options.input.inputs[0];
  PartitionFiles files;
  if (world.rank() == 0) files = plan_partition_files(pattern, partitions);
  share_partition_plan(world, files, pattern, partitions.partitions);
  // Every rank deals the lines and writes its share of the partition files (all of them in a
  // world of one), under temporary names renamed once every rank has written its share.
  const std::vector<int> written = files.reused ? std::vector<int>{} : partitions_written_by(world, partitions.partitions);
  if (!written.empty()) write_partition_temporaries(files, partitions, written);
  world.barrier();
  rename_partition_temporaries(files, written);
  world.barrier();

  std::vector<int> mine;
  for (int i = world.rank(); i < partitions.partitions; i += world.size()) mine.push_back(i);
  PreprocessStats total;
  for (int i : mine) {
    PreprocessOptions part = options;
    part.input.inputs = {partition_file_name(pattern, i)};
    if (!path_exists(part.input.inputs[0])) {
      throw Error(part.input.inputs[0], "not found on rank " + std::to_string(world.rank()) +
                                            ": --partitions under MPI needs the input's directory on a filesystem every rank shares");
    }
    part.output_prefix = options.output_prefix + "_" + std::to_string(i);
    part.workers = options.workers / partitions.partitions * static_cast<int>(mine.size());
    const PreprocessStats stats = preprocess_jsonl(tokenizer, part, progress);
    add_counts(total, stats);
    total.input_bytes += stats.input_bytes;
  }
  // Rank 0 merges: the partitions it tokenized first (in a world of one, all of them) now, the
  // others once every rank has finished (the all-reduce below).
  std::optional<PartitionMerge> merge;
  if (world.rank() == 0) {
    merge.emplace(tokenizer, options);
    int finished = 0;
    while (finished < partitions.partitions && finished % world.size() == 0) ++finished;
    merge->append_through(finished);
  }
  std::vector<int64_t> counts{total.documents, total.empty_documents, total.sequences, total.tokens, total.input_bytes,
                              total.text_bytes,  total.replaced,        total.bad_lines, total.blank_lines};
  world.all_reduce(counts.data(), static_cast<int64_t>(counts.size()), DType::i64, comm::ReduceOp::sum);
  total = PreprocessStats{};
  total.documents = counts[0], total.empty_documents = counts[1], total.sequences = counts[2], total.tokens = counts[3];
  total.input_bytes = counts[4], total.text_bytes = counts[5], total.replaced = counts[6], total.bad_lines = counts[7];
  total.blank_lines = counts[8];
  if (merge) {
    merge->append_through(partitions.partitions);
    total.outputs = merge->finish();
  }
  world.barrier();
  total.partition_files_reused = files.reused;
  total.partitioned_inputs = files.inputs;
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
        if (!batch.error.empty()) throw Error(batch.error, "");
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
      if (auto error = too_long_line(batch, input.max_line_bytes, skip_bad_lines, total)) throw Error(*error, "");
      for_each_line(batch, total, [&](std::string_view line, int64_t line_number) {
        if (auto error = parse_line(parser, line, batch.file, line_number, input.max_line_bytes, texts, total)) {
          if (!skip_bad_lines) throw Error(*error, "");
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

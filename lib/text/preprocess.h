// Tokenizing corpora: Megatron's tools/preprocess_data.py as a library, plus the streaming
// encoder behind `mt-tokenize encode`. Input is read in batches of whole lines; batches are
// tokenized by `workers` threads and written in input order (core/ordered_pipeline.h), so the
// output is byte-identical for every worker count and for several inputs given one after another.
//
// Megatron's semantics, per JSONL line and per --json-keys key: a string value is one sequence
// (Tokenizer::encode_sequence: with a post-processor's template, e.g. LLaMA-3's BOS, around it),
// a list of strings is one sequence per string (pre-split sentences); sentences that encode to
// no tokens are dropped; with append_eod a document with tokens gets the EOD id appended to its
// last sequence; every line is one document, so empty text is written as a document with no
// sequences. Key k goes to `<output_prefix>_<key>_document` (.h5 and/or .bin/.idx).
// Tested in tests/unit/text/test_preprocess.cpp, tests/tools/mt-tokenize.bats and
// tests/tools/mt-tokenize-partitions.bats (partitions).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/token_dataset.h"
#include "text/tokenizer.h"

namespace mt::text {

// JSONL input: a UTF-8 byte order mark at the start of an input is dropped; blank lines are
// skipped (counted); a line longer than max_line_bytes is read past in chunks, never held whole,
// and is a bad line (an error, or counted with skip_bad_lines), so memory stays about
// max_line_bytes + batch_bytes whatever the input.
struct LineInputOptions {
  std::vector<std::string> inputs;     // files read one after another; "-" is stdin
  size_t batch_bytes = size_t{1} << 20;  // input bytes per work item (whole lines)
  size_t max_line_bytes = size_t{64} << 20;
};

struct PreprocessOptions {
  LineInputOptions input;
  std::vector<std::string> json_keys{"text"};
  std::string output_prefix;
  data::TokenDatasetFormat output_format = data::TokenDatasetFormat::hdf5;
  int workers = 1;
  bool append_eod = false;
  bool allow_special = false;
  bool skip_bad_lines = false;  // count malformed lines instead of failing on the first
};

struct PreprocessStats {
  int64_t documents = 0;        // lines written as documents
  int64_t empty_documents = 0;  // (document, key) pairs that encoded to no tokens
  int64_t sequences = 0;
  int64_t tokens = 0;
  int64_t input_bytes = 0;      // bytes of input read
  int64_t text_bytes = 0;       // UTF-8 bytes of the texts tokenized
  int64_t replaced = 0;         // U+FFFD substitutions (invalid UTF-8, lone surrogates)
  int64_t bad_lines = 0;        // skipped with skip_bad_lines (malformed, or over max_line_bytes)
  int64_t blank_lines = 0;      // JSONL lines of only spaces, tabs and CR: skipped, never documents
  double seconds = 0;
  std::vector<std::string> outputs;  // final file paths
  // preprocess_partitions on rank 0: the files the --input pattern matched, in order, and
  // whether partition files an earlier run left were read instead.
  std::vector<std::string> partitioned_inputs;
  bool partition_files_reused = false;
};

using PreprocessProgress = std::function<void(const PreprocessStats&)>;

// Throws mt::Error "<file>:<line>: <reason>" for the first bad line (in input order) unless
// skip_bad_lines; no output file exists under its final name unless the whole run succeeded.
PreprocessStats preprocess_jsonl(const Tokenizer& tokenizer, const PreprocessOptions& options,
                                 const PreprocessProgress& progress = {});

struct EncodeOptions {
  LineInputOptions input;
  std::string json_key = "text";
  bool raw = false;  // the whole input is one plain-text document
  int workers = 1;
  bool allow_special = false;
  bool skip_bad_lines = false;
};

// Calls emit(ids, end_of_document) in input order: for JSONL one call per line (the key's
// sentences concatenated, each an encode_sequence), for raw text the document's ids in pieces
// (the whole text one sequence: a template's ids first and last), the last with end_of_document. Raw text is cut for the workers only where every supported pre-tokenizer
// pattern has a piece boundary whatever follows (see split_points_for_parallel_encoding), and
// only for a tokenizer whose encodes_parts_alike() holds, so the ids equal encoding the whole text
// at once.
PreprocessStats encode_stream(const Tokenizer& tokenizer, const EncodeOptions& options,
                              const std::function<void(std::span<const int32_t>, bool)>& emit,
                              const PreprocessProgress& progress = {});

// Calls text_fn for every text of the inputs, in order: each string of `json_key` per JSONL
// line (invalid UTF-8 and lone surrogates replaced), or with `raw` the whole input as one text.
// Returns the counts (documents, text bytes, replaced, bad lines).
PreprocessStats read_texts(const LineInputOptions& input, bool raw, const std::string& json_key, bool skip_bad_lines,
                           const std::function<void(std::string_view)>& text_fn);

// --partitions N as Megatron's preprocess_data.py runs it (N > 1). `--input` is one pattern
// expanded as Python's glob.glob does (not sorted: the directory's listing order, as Megatron).
// The lines of the matching files (Python's universal newlines: LF, CRLF and CR end a line; a
// last line without one is a line) are dealt to the partitions: line j to partition j % N, or with
// keep_sequential contiguous blocks of ceil(lines / N) lines (which equals one process). The
// output `<output_prefix>_<key>_document` holds partition 0's documents, then partition 1's, ...:
// the bytes Megatron's merge of its per-partition outputs writes. Unlike Megatron, no partition
// file is written and per-partition outputs exist only as temporaries: the ranks claim the files'
// chunks as they need them and write their tokens at the places rank 0 gives them (see
// preprocess_partitions). Partition files an earlier run (Megatron's) left are read instead of
// the input when all N exist, as Megatron does.
struct PartitionOptions {
  int partitions = 2;
  bool keep_sequential = false;
  // On rank 0: batches made before their turn in the output (rank 0's own with their tokens, 4
  // bytes per token, and 4 per sequence and per document; another rank's index, or whole batch
  // when it sends its tokens) are kept in memory up to this many bytes, then in a spool file beside
  // the output, unlinked once made.
  size_t spool_memory_bytes = size_t{256} << 20;
};

// Python's glob.glob(pattern) without recursion: *, ? and [...] (with ! and ranges) in the last
// path component, names starting with '.' only for a pattern starting with '.', in readdir
// order. A pattern without those characters matches itself if it exists. Wildcards in a
// directory component are refused by name; no match throws mt::UsageError naming the pattern.
std::vector<std::string> expand_input_glob(const std::string& pattern);

// Python's fnmatch.fnmatchcase(name, pattern) for *, ? and [...].
bool fnmatch_case(std::string_view name, std::string_view pattern);

// `<root>_<index><ext>` for os.path.splitext(pattern) = (root, ext).
std::string partition_file_name(const std::string& pattern, int index);

// What a partitioned run reads, decided by rank 0. When all N partition files exist they are
// reused as they are (Megatron's rule: partition i is its file's lines); when only some exist and
// the pattern matches one of them (it would be read as input) it throws naming that file;
// otherwise it expands the pattern (with keep_sequential an empty file is refused: Megatron
// miscounts it).
struct PartitionFiles {
  std::vector<std::string> paths;   // the partition files' names, partition 0 first (read when reused)
  std::vector<std::string> inputs;  // the files the pattern matched, in the order read (none when reused)
  std::vector<int64_t> bytes;       // the size of each file read (inputs, or paths when reused)
  bool reused = false;
};
PartitionFiles plan_partition_files(const std::string& pattern, const PartitionOptions& partitions);

// The whole partitioned run over `world` (a world of one without MPI). Rank 0 plans (above) and
// tells the others, which check that every file is there with rank 0's size (a rank without the
// input, or with another copy of it, throws naming the file). Rank r holds partitions r, r + size,
// ... and runs options.workers / partitions threads per partition it holds (options.workers is
// the job's total, as Megatron's --workers; it must be divisible by the partitions). The files'
// bytes, one after another, are cut into 16 or more chunks per partition (4 MiB at most; a line
// belongs to the chunk holding its first byte, found as Python's universal newlines end lines).
// A rank holding a partition claims the next unclaimed chunk from rank 0 whenever it needs one
// (one ahead of the one it reads), so a slower rank, one with fewer threads, or rank 0, which also
// writes, takes fewer; it reads the chunk once and deals its lines to N streams, line k of the
// chunk to stream k % N (contiguous blocks and reused partition files: all to one, in order), a
// chunk's lines of one stream being a segment. Each rank tokenizes its chunks in order and sends
// rank 0 each batch's index as it is made, and each chunk's line count at its end (point to
// point). Rank 0 writes the chunks in order, as soon as each is complete: by then every chunk
// before it has ended, so the index of its first line across the files, and so the partition of
// each of its streams, is known (round robin: Megatron's line j to partition j % N). Each
// partition has writers of its own (partition 0's are the outputs; partition p's are temporaries
// `<output_prefix>_<p>_<key>_document.bin.tmp-...`, appended to the outputs at the end with
// data::TokenDatasetWriter::append_writer); rank 0 sends the rank the place of each batch's tokens
// in the token files of its partition's writers, where the rank writes them
// (data::TokenSpoolWriter); batches that arrive before their turn wait on rank 0
// (PartitionOptions::spool_memory_bytes). A rank that cannot open rank 0's token files (no shared
// filesystem) warns on stderr and sends its tokens with the index for rank 0 to
// write. Every rank reads the input by path. The ranks test their messages between batches and
// sleep while they wait, so `world` needs no progress thread. Returns on rank 0 the outputs'
// counts and paths.
PreprocessStats preprocess_partitions(const Tokenizer& tokenizer, const PreprocessOptions& options,
                                      const PartitionOptions& partitions, comm::Communicator& world,
                                      const PreprocessProgress& progress = {});

// Offsets in `text` where it may be cut without changing any pre-tokenizer's pieces (none of
// the patterns looks behind, so a piece depends only on the text from its start): just after a
// '\n' that follows a printable ASCII non-space byte and precedes an ASCII letter, and just
// before a space between two ASCII letters (CRLF text has many of those). No pattern's piece
// holds both sides of either cut, and the piece before it ends there whether or not the text
// goes on. At least `target_bytes` apart.
std::vector<size_t> split_points_for_parallel_encoding(std::string_view text, size_t target_bytes);

}  // namespace mt::text

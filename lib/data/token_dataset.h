// Token datasets (DESIGN.md sec. 4): sequences of token ids grouped into documents, stored either
// as mt's HDF5 token dataset (`<prefix>.h5`) or as Megatron-LM's indexed dataset (`<prefix>.bin`
// + `<prefix>.idx`, byte-compatible with megatron/core/datasets/indexed_dataset.py).
//
// Megatron's .idx (little-endian): magic "MMIDIDX\0\0" (9 bytes), uint64 version = 1, uint8 dtype
// code (megatron_dtype_code below), uint64 sequence count S, uint64 document-index count D (= documents
// + 1), int32 sequence lengths[S], int64 sequence pointers[S] (byte offsets into .bin), int64
// document indices[D] (0, then after each document the number of sequences written so far).
// The .bin holds the tokens back to back in the dtype.
//
// The HDF5 file mirrors it: /tokens (1-D, contiguous, unfiltered, so it is memory-mapped at its
// file offset), /sequence_lengths (int32), /sequence_offsets (int64, in tokens, not bytes),
// /document_indices (int64, as Megatron's), root attributes mt_format = "mt-token-dataset",
// mt_format_version = 1, tokenizer, tokenizer_hash, vocab_size, eod_id (-1 when none).
//
// Tested in tests/unit/data/test_token_dataset.cpp (with tests/data/read_megatron_idx.py as an
// independent numpy reader of the .bin/.idx).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace mt::data {

// The code of Megatron's DType enum (indexed_dataset.py) stored in the .idx: uint8 1, int8 2,
// int16 3, int32 4, int64 5, float64 6, float32 7, uint16 8. Only the integer types hold tokens.
// megatron_dtype_code throws mt::Error for a dtype Megatron has no code for (bf16, f16);
// dtype_from_megatron_code gives nullopt for an unknown code.
uint8_t megatron_dtype_code(DType dtype);
std::optional<DType> dtype_from_megatron_code(uint8_t code);
// Megatron's DType.optimal_dtype: uint16 when vocab_size < 65500, else int32.
DType optimal_token_dtype(int64_t vocab_size);

enum class TokenDatasetFormat { hdf5, megatron, both };

// "hdf5", "megatron" (alias "bin") or "both"; anything else is an mt::UsageError.
TokenDatasetFormat parse_token_dataset_format(std::string_view text);

// What the HDF5 file records about the tokenizer; the .bin/.idx format has no place for it.
struct TokenDatasetMetadata {
  std::string tokenizer;       // e.g. "gpt2-bpe"
  std::string tokenizer_hash;  // e.g. a hex digest of the tokenizer files
  int64_t eod_id = -1;         // end-of-document token id, -1 when none
};

// Streams sequences into the chosen format(s) under temporary names (core/temporary_file.h:
// `<final>.tmp-<host>-<pid>-<random>`) and renames them into place on finish(); a writer
// destroyed without finish() (an exception, a failed run) removes its temporaries, and so does a
// tool's signal handler, so no file ever appears under a final name half-written.
// Final names: `<prefix>.h5`, `<prefix>.bin`, `<prefix>.idx`. Tokens are stored in
// optimal_token_dtype(vocab_size).
class TokenDataset;

class TokenDatasetWriter {
 public:
  // Throws mt::UsageError for vocab_size < 1, mt::Error when the temporaries cannot be created.
  static TokenDatasetWriter create(const std::string& prefix, TokenDatasetFormat format, int64_t vocab_size,
                                   const TokenDatasetMetadata& metadata = {});
  TokenDatasetWriter(TokenDatasetWriter&&) noexcept;
  TokenDatasetWriter& operator=(TokenDatasetWriter&&) noexcept;
  ~TokenDatasetWriter();

  // Appends one sequence (possibly empty) to the current document. Every token must be in
  // [0, vocab_size); throws mt::Error otherwise (nothing of that sequence is written).
  void add_sequence(std::span<const int32_t> tokens);
  // Closes the current document (Megatron's end_document: an empty document is allowed).
  void end_document();
  // Appends every document of `source`, as add_sequence for each of its sequences and
  // end_document after each of its documents would (Megatron's add_index: its lengths and
  // document indices, offset by the sequences written so far). When source's dtype is this
  // writer's, its token bytes are copied as they are stored, after one scan checks that every
  // token is in the vocabulary; otherwise (or when that scan finds one outside it) sequence by
  // sequence, with add_sequence's conversion and error. The bytes of a .bin source are copied by
  // the kernel (copy_file_range) where it can.
  void append_dataset(const TokenDataset& source);
  // Documents whose tokens another process writes (mt-tokenize --partitions under MPI,
  // text/preprocess.cpp): appends their index entries as add_sequence and end_document would
  // (`sequences_per_document[d]` sequences of `sequence_lengths` each), and returns the byte offset
  // in token_spool_path() where their tokens go, one after another, for a TokenSpoolWriter to
  // write there; this writer's own tokens go after them. Throws mt::Error for counts that do not
  // add up. finish() refuses a token file shorter than the tokens it holds.
  int64_t reserve_documents(std::span<const int32_t> sequence_lengths, std::span<const int32_t> sequences_per_document);
  // The temporary file the tokens go into (the .bin's temporary, or a spool beside the .h5's).
  const std::string& token_spool_path() const;
  // Appends every document of `part`, an unfinished writer of the same vocabulary (mt-tokenize
  // --partitions writes each partition into a writer of its own at once and appends partitions
  // 1, 2, ... to partition 0's at the end), as if each of its documents had been added here: its
  // index entries, and its token bytes copied as stored, by the kernel (copy_file_range) where it
  // can. Tokens are not checked again (add_sequence and TokenSpoolWriter checked them). Throws
  // mt::Error for another vocabulary, an open document in `part`, or tokens reserved in `part`
  // that never arrived. `part` is left empty, its temporaries removed.
  void append_writer(TokenDatasetWriter&& part);
  // Closes an open document (sequences added since the last end_document), writes the index and
  // renames every file into place (for .bin/.idx the .idx goes last, any older .idx is removed
  // first so a stale index never pairs with a new .bin: a kill between the renames leaves a .bin
  // without an .idx, refused by mt and Megatron alike; MT_TOKEN_DATASET_FAULT=between-renames:kill
  // kills there, for tests). No call is allowed afterwards.
  void finish();

  int64_t sequence_count() const;
  int64_t document_count() const;  // documents closed so far
  int64_t token_count() const;
  DType dtype() const;
  std::vector<std::string> final_paths() const;

 private:
  struct State;
  explicit TokenDatasetWriter(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Writes tokens into another process's TokenDatasetWriter token file, at the offsets that writer
// reserved (reserve_documents), in the dataset's dtype (optimal_token_dtype(vocab_size)) and
// checked against the vocabulary as add_sequence checks them. close() makes them durable
// (fdatasync) and closes the file: the writer's finish() (or append_writer) must come after every
// close(). close(false) does not sync: for a writer that only append_writer reads, whose copy the
// finished file's own sync makes durable (the file's data is seen by every process once closed).
class TokenSpoolWriter {
 public:
  // Throws mt::Error naming the file when it cannot be opened for writing.
  TokenSpoolWriter(const std::string& spool_path, int64_t vocab_size);
  TokenSpoolWriter(const TokenSpoolWriter&) = delete;
  TokenSpoolWriter& operator=(const TokenSpoolWriter&) = delete;
  ~TokenSpoolWriter();  // closes the file without syncing it (a run that failed)

  void write_at(int64_t byte_offset, std::span<const int32_t> tokens);
  void close(bool make_durable = true);

 private:
  std::string path_;
  int fd_ = -1;
  int64_t vocab_size_ = 0;
  DType dtype_ = DType::i32;
  std::vector<uint16_t> narrow_;
};

// A read-only token dataset with its tokens memory-mapped. open(X) looks for `X.h5`, then for
// `X.bin` + `X.idx`; when both kinds exist they must hold the same dataset (as
// --output-format both writes: equal sequence and document structure, equal tokens in up to 64
// sequences spread over it) and the HDF5 file is used, otherwise the prefix is ambiguous (an
// mt::Error naming both files). A path naming one of those files directly (`X.h5`, `X.bin`,
// `X.idx`) reads that one. Everything is validated on open (header,
// version, dtype, sizes, monotonic non-overlapping offsets inside the token storage, document
// indices from 0 to the sequence count, a .bin exactly as long as its index says, as Megatron's
// builder writes it): a bad file is an mt::Error naming it, never a crash.
class TokenDataset {
 public:
  static TokenDataset open(const std::string& path_prefix);
  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;
  ~TokenDataset();

  TokenDatasetFormat format() const;  // hdf5 or megatron
  const std::string& path() const;    // the .h5 file, or the .bin file
  int64_t sequence_count() const;
  int64_t document_count() const;  // document_indices().size() - 1
  int64_t token_count() const;
  DType dtype() const;
  int64_t vocab_size() const;  // -1 for .bin/.idx (Megatron's format does not record it)
  const TokenDatasetMetadata& metadata() const;  // empty strings and eod_id -1 for .bin/.idx

  std::span<const int32_t> sequence_lengths() const;
  std::span<const int64_t> sequence_offsets() const;  // in tokens from the start of the storage
  std::span<const int64_t> document_indices() const;  // document d = sequences [i[d], i[d+1])
  // The token storage as stored, items of dtype() that sequence_offsets() index (for copying
  // tokens unconverted); null when it holds no token.
  const std::byte* token_storage() const;

  // Tokens [offset, offset + length) of a sequence as int32 (length defaults to the rest of the
  // sequence, as Megatron's IndexedDataset.get). Out-of-range arguments, or a stored value that
  // does not fit int32, throw mt::Error.
  std::vector<int32_t> get(int64_t sequence_index, int64_t offset = 0,
                           std::optional<int64_t> length = std::nullopt) const;
  // The same into caller storage: out.size() tokens starting at `offset`.
  void read(int64_t sequence_index, int64_t offset, std::span<int32_t> out) const;

 private:
  struct State;
  explicit TokenDataset(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Megatron's tools/merge_datasets.py: the documents of `inputs` (prefixes or paths TokenDataset::
// open accepts) one after another into `output_prefix`, so tokenizing files separately and
// merging equals tokenizing them in one run. HDF5 inputs must agree on tokenizer, hash, vocab
// size and EOD id (their metadata is kept); `vocab_size` (> 0) is needed when every input is a
// .bin/.idx, which records none, and must cover every token. Returns the final paths.
std::vector<std::string> merge_token_datasets(const std::vector<std::string>& inputs, const std::string& output_prefix,
                                              TokenDatasetFormat format, int64_t vocab_size = 0);

}  // namespace mt::data

// Token datasets (lib/data/token_dataset.h): round trips through HDF5 and Megatron .bin/.idx with
// uint16 and int32 tokens, byte-for-byte agreement with Megatron's layout built here by hand, an
// independent numpy reader (tests/data/read_megatron_idx.py) reading what the writer wrote, every
// kind of corrupt file refused with mt::Error, no file left behind by an unfinished writer, and
// appending whole datasets (the merge) equal to adding their sequences, and documents whose tokens
// another writer places (reserve_documents, TokenSpoolWriter) equal to adding them.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../temp_dir.h"
#include "core/error.h"
#include "data/token_dataset.h"

using namespace mt;
using namespace mt::data;
namespace fs = std::filesystem;

namespace {

class TempDir : public mt::testing::TempDir {
 public:
  TempDir() : mt::testing::TempDir("mt_token_dataset") {}
};

using Bytes = std::vector<uint8_t>;

Bytes read_bytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  stream.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void append_le(Bytes& bytes, T value) {
  uint8_t raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // the test hosts are little-endian, as the format
  bytes.insert(bytes.end(), raw, raw + sizeof(T));
}

template <typename T>
void poke(Bytes& bytes, size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

using Sequences = std::vector<std::vector<int32_t>>;

// Megatron's .bin/.idx for these sequences and document indices, built from the layout rules of
// megatron/core/datasets/indexed_dataset.py (_IndexWriter.write and IndexedDatasetBuilder).
struct MegatronFiles {
  Bytes bin;
  Bytes idx;
};

template <typename Token>
MegatronFiles megatron_by_hand(uint8_t dtype_code, const Sequences& sequences,
                               const std::vector<int64_t>& document_indices) {
  MegatronFiles files;
  for (const auto& sequence : sequences) {
    for (const int32_t token : sequence) append_le<Token>(files.bin, static_cast<Token>(token));
  }
  const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  files.idx.insert(files.idx.end(), magic, magic + 9);
  append_le<uint64_t>(files.idx, 1);
  append_le<uint8_t>(files.idx, dtype_code);
  append_le<uint64_t>(files.idx, sequences.size());
  append_le<uint64_t>(files.idx, document_indices.size());
  for (const auto& sequence : sequences) append_le<int32_t>(files.idx, static_cast<int32_t>(sequence.size()));
  int64_t pointer = 0;
  for (const auto& sequence : sequences) {
    append_le<int64_t>(files.idx, pointer);
    pointer += static_cast<int64_t>(sequence.size() * sizeof(Token));
  }
  for (const int64_t index : document_indices) append_le<int64_t>(files.idx, index);
  return files;
}

// Documents of one or more sequences, one of them empty, one document with no sequence at all.
struct Corpus {
  std::vector<Sequences> documents;
  Sequences sequences() const {
    Sequences all;
    for (const auto& document : documents) all.insert(all.end(), document.begin(), document.end());
    return all;
  }
  std::vector<int64_t> document_indices() const {
    std::vector<int64_t> indices{0};
    for (const auto& document : documents) indices.push_back(indices.back() + static_cast<int64_t>(document.size()));
    return indices;
  }
};

Corpus make_corpus(int32_t vocab_size) {
  const int32_t top = vocab_size - 1;
  Corpus corpus;
  corpus.documents.push_back({{1, 2, 3, 4, 5}, {top, 0, top - 1}});
  corpus.documents.push_back({{7}});
  corpus.documents.push_back({{}, {9, 10}});
  corpus.documents.push_back({});
  corpus.documents.push_back({{top / 2, top / 3, top / 5, top / 7}, {}, {11}});
  return corpus;
}

// Adds document d of `corpus` to `writer`, sequence by sequence.
void add_document(TokenDatasetWriter& writer, const Corpus& corpus, size_t d) {
  for (const auto& sequence : corpus.documents[d]) writer.add_sequence(sequence);
  writer.end_document();
}

// Reserves documents [first, end) of `corpus` in `writer` (reserve_documents): the byte offset
// where their tokens go, and those tokens, for a TokenSpoolWriter to write.
std::pair<int64_t, std::vector<int32_t>> reserve_corpus_documents(TokenDatasetWriter& writer, const Corpus& corpus,
                                                                  size_t first, size_t end) {
  std::vector<int32_t> lengths, per_document, tokens;
  for (size_t d = first; d < end; ++d) {
    per_document.push_back(static_cast<int32_t>(corpus.documents[d].size()));
    for (const auto& sequence : corpus.documents[d]) {
      lengths.push_back(static_cast<int32_t>(sequence.size()));
      tokens.insert(tokens.end(), sequence.begin(), sequence.end());
    }
  }
  return {writer.reserve_documents(lengths, per_document), tokens};
}

void write_corpus(const std::string& prefix, TokenDatasetFormat format, int64_t vocab_size, const Corpus& corpus,
                  const TokenDatasetMetadata& metadata = {}) {
  TokenDatasetWriter writer = TokenDatasetWriter::create(prefix, format, vocab_size, metadata);
  for (size_t d = 0; d < corpus.documents.size(); ++d) add_document(writer, corpus, d);
  writer.finish();
}

// The files of `dir`/`name` (as `format` writes them) equal those write_corpus writes for `corpus`.
void expect_files_equal_written_corpus(const TempDir& dir, const std::string& name, TokenDatasetFormat format,
                                       int64_t vocab_size, const Corpus& corpus) {
  write_corpus(dir.file("added"), format, vocab_size, corpus);
  std::vector<std::string> extensions{".bin", ".idx", ".h5"};
  if (format == TokenDatasetFormat::megatron) extensions.pop_back();
  if (format == TokenDatasetFormat::hdf5) extensions = {".h5"};
  for (const std::string& extension : extensions) {
    EXPECT_EQ(read_bytes(dir.file(name) + extension), read_bytes(dir.file("added") + extension))
        << extension << " vocab " << vocab_size;
  }
}

void expect_matches(const TokenDataset& dataset, const Corpus& corpus) {
  const Sequences sequences = corpus.sequences();
  ASSERT_EQ(dataset.sequence_count(), static_cast<int64_t>(sequences.size()));
  ASSERT_EQ(dataset.document_count(), static_cast<int64_t>(corpus.documents.size()));
  const std::vector<int64_t> indices = corpus.document_indices();
  EXPECT_EQ(std::vector<int64_t>(dataset.document_indices().begin(), dataset.document_indices().end()), indices);
  int64_t offset = 0;
  int64_t total = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t index = static_cast<int64_t>(i);
    EXPECT_EQ(dataset.sequence_lengths()[i], static_cast<int32_t>(sequences[i].size())) << i;
    EXPECT_EQ(dataset.sequence_offsets()[i], offset) << i;
    EXPECT_EQ(dataset.get(index), sequences[i]) << "sequence " << i;
    if (sequences[i].size() >= 3) {
      EXPECT_EQ(dataset.get(index, 1, 2), std::vector<int32_t>(sequences[i].begin() + 1, sequences[i].begin() + 3));
      EXPECT_EQ(dataset.get(index, 2), std::vector<int32_t>(sequences[i].begin() + 2, sequences[i].end()));
    }
    offset += static_cast<int64_t>(sequences[i].size());
    total += static_cast<int64_t>(sequences[i].size());
  }
  EXPECT_EQ(dataset.token_count(), total);
}

struct RoundTripCase {
  TokenDatasetFormat format;
  int64_t vocab_size;
  DType dtype;
};

class TokenDatasetRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

}  // namespace

TEST(TokenDataset, DtypeAndFormatRules) {
  EXPECT_EQ(optimal_token_dtype(50257), DType::u16);
  EXPECT_EQ(optimal_token_dtype(65499), DType::u16);
  EXPECT_EQ(optimal_token_dtype(65500), DType::i32);
  EXPECT_EQ(optimal_token_dtype(128256), DType::i32);
  // Megatron's DType codes (indexed_dataset.py), both ways.
  const std::pair<uint8_t, DType> codes[] = {{1, DType::u8},  {2, DType::i8},  {3, DType::i16}, {4, DType::i32},
                                             {5, DType::i64}, {6, DType::f64}, {7, DType::f32}, {8, DType::u16}};
  for (const auto& [code, dtype] : codes) {
    EXPECT_EQ(megatron_dtype_code(dtype), code) << dtype_name(dtype);
    EXPECT_EQ(dtype_from_megatron_code(code), dtype) << int{code};
  }
  EXPECT_EQ(dtype_from_megatron_code(0), std::nullopt);
  EXPECT_EQ(dtype_from_megatron_code(9), std::nullopt);
  EXPECT_THROW(megatron_dtype_code(DType::bf16), Error);
  EXPECT_EQ(parse_token_dataset_format("hdf5"), TokenDatasetFormat::hdf5);
  EXPECT_EQ(parse_token_dataset_format("megatron"), TokenDatasetFormat::megatron);
  EXPECT_EQ(parse_token_dataset_format("both"), TokenDatasetFormat::both);
  EXPECT_THROW(parse_token_dataset_format("parquet"), UsageError);
}

TEST_P(TokenDatasetRoundTrip, ReadsBackWhatWasWritten) {
  const RoundTripCase c = GetParam();
  TempDir dir;
  const std::string prefix = dir.file("corpus");
  const Corpus corpus = make_corpus(static_cast<int32_t>(c.vocab_size));
  TokenDatasetMetadata metadata;
  metadata.tokenizer = "gpt2-bpe";
  metadata.tokenizer_hash = "0123abcd";
  metadata.eod_id = c.vocab_size - 1;
  write_corpus(prefix, c.format, c.vocab_size, corpus, metadata);

  const TokenDataset dataset = TokenDataset::open(prefix);
  EXPECT_EQ(dataset.format(), c.format);
  EXPECT_EQ(dataset.dtype(), c.dtype);
  expect_matches(dataset, corpus);
  if (c.format == TokenDatasetFormat::hdf5) {
    EXPECT_EQ(dataset.path(), prefix + ".h5");
    EXPECT_EQ(dataset.vocab_size(), c.vocab_size);
    EXPECT_EQ(dataset.metadata().tokenizer, "gpt2-bpe");
    EXPECT_EQ(dataset.metadata().tokenizer_hash, "0123abcd");
    EXPECT_EQ(dataset.metadata().eod_id, c.vocab_size - 1);
    EXPECT_EQ(dir.entries(), std::vector<std::string>{"corpus.h5"});
  } else {
    EXPECT_EQ(dataset.path(), prefix + ".bin");
    EXPECT_EQ(dataset.vocab_size(), -1);
    EXPECT_EQ(dataset.metadata().eod_id, -1);
    std::vector<std::string> entries = dir.entries();
    std::sort(entries.begin(), entries.end());
    EXPECT_EQ(entries, (std::vector<std::string>{"corpus.bin", "corpus.idx"}));
  }
}

INSTANTIATE_TEST_SUITE_P(FormatsAndDtypes, TokenDatasetRoundTrip,
                         ::testing::Values(RoundTripCase{TokenDatasetFormat::hdf5, 1000, DType::u16},
                                           RoundTripCase{TokenDatasetFormat::hdf5, 100000, DType::i32},
                                           RoundTripCase{TokenDatasetFormat::megatron, 1000, DType::u16},
                                           RoundTripCase{TokenDatasetFormat::megatron, 100000, DType::i32}));

TEST(TokenDataset, BothFormatsHoldTheSameDataAndH5IsPreferred) {
  TempDir dir;
  const std::string prefix = dir.file("both");
  const Corpus corpus = make_corpus(65499);
  write_corpus(prefix, TokenDatasetFormat::both, 65499, corpus);
  std::vector<std::string> entries = dir.entries();
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"both.bin", "both.h5", "both.idx"}));
  const TokenDataset preferred = TokenDataset::open(prefix);
  EXPECT_EQ(preferred.format(), TokenDatasetFormat::hdf5);
  expect_matches(preferred, corpus);
  // Naming a file directly picks that format.
  const TokenDataset megatron = TokenDataset::open(prefix + ".idx");
  EXPECT_EQ(megatron.format(), TokenDatasetFormat::megatron);
  expect_matches(megatron, corpus);
  EXPECT_EQ(TokenDataset::open(prefix + ".h5").format(), TokenDatasetFormat::hdf5);
}

TEST(TokenDataset, DatasetsWithoutTokensRoundTrip) {
  for (const TokenDatasetFormat format : {TokenDatasetFormat::hdf5, TokenDatasetFormat::megatron}) {
    TempDir dir;
    Corpus only_empty;
    only_empty.documents.push_back({{}, {}});
    only_empty.documents.push_back({});
    write_corpus(dir.file("empty"), format, 10, only_empty);
    expect_matches(TokenDataset::open(dir.file("empty")), only_empty);
    write_corpus(dir.file("nothing"), format, 10, Corpus{});
    const TokenDataset nothing = TokenDataset::open(dir.file("nothing"));
    EXPECT_EQ(nothing.sequence_count(), 0);
    EXPECT_EQ(nothing.document_count(), 0);
    EXPECT_THROW(nothing.get(0), Error);
  }
}

TEST(TokenDataset, FinishClosesAnOpenDocument) {
  TempDir dir;
  const std::string prefix = dir.file("open");
  TokenDatasetWriter writer = TokenDatasetWriter::create(prefix, TokenDatasetFormat::both, 50);
  writer.add_sequence(std::vector<int32_t>{1, 2});
  writer.end_document();
  writer.add_sequence(std::vector<int32_t>{3});
  writer.add_sequence(std::vector<int32_t>{4, 5, 6});
  EXPECT_EQ(writer.document_count(), 1);
  writer.finish();
  EXPECT_EQ(writer.sequence_count(), 3);
  EXPECT_EQ(writer.document_count(), 2);
  EXPECT_EQ(writer.token_count(), 6);
  EXPECT_THROW(writer.add_sequence(std::vector<int32_t>{1}), Error);
  for (const std::string& file : {prefix, prefix + ".bin"}) {
    const TokenDataset dataset = TokenDataset::open(file);
    EXPECT_EQ(std::vector<int64_t>(dataset.document_indices().begin(), dataset.document_indices().end()),
              (std::vector<int64_t>{0, 1, 3}));
    EXPECT_EQ(dataset.get(2), (std::vector<int32_t>{4, 5, 6}));
  }
}

// merge_token_datasets' append: a dataset appended whole (its bytes copied when the dtype is
// the writer's, converted sequence by sequence otherwise) gives the files that adding its
// sequences one by one gives, also after an open document, from either storage format.
TEST(TokenDataset, AppendingADatasetEqualsAddingItsSequences) {
  for (const int64_t vocab_size : {1000, 100000}) {
    for (const TokenDatasetFormat source_format : {TokenDatasetFormat::megatron, TokenDatasetFormat::hdf5}) {
      TempDir dir;
      const Corpus first = make_corpus(static_cast<int32_t>(vocab_size));
      Corpus second;
      second.documents.push_back({{5, 6}});
      second.documents.push_back({{}});
      second.documents.push_back({});
      write_corpus(dir.file("first"), source_format, vocab_size, first);
      write_corpus(dir.file("second"), source_format, vocab_size, second);
      write_corpus(dir.file("narrow"), source_format, 1000, second);  // u16 into an int32 writer
      TokenDatasetWriter writer = TokenDatasetWriter::create(dir.file("appended"), TokenDatasetFormat::both, vocab_size);
      writer.add_sequence(std::vector<int32_t>{3});  // open: first's first document continues it
      writer.append_dataset(TokenDataset::open(dir.file("first")));
      writer.append_dataset(TokenDataset::open(dir.file("second")));
      writer.append_dataset(TokenDataset::open(dir.file("narrow")));
      writer.finish();

      Corpus expected = first;
      expected.documents.front().insert(expected.documents.front().begin(), std::vector<int32_t>{3});
      for (int copy = 0; copy < 2; ++copy) {
        expected.documents.insert(expected.documents.end(), second.documents.begin(), second.documents.end());
      }
      write_corpus(dir.file("added"), TokenDatasetFormat::both, vocab_size, expected);
      for (const char* extension : {".bin", ".idx", ".h5"}) {
        EXPECT_EQ(read_bytes(dir.file("appended") + extension), read_bytes(dir.file("added") + extension))
            << extension << " vocab " << vocab_size;
      }
    }
  }
}

TEST(TokenDataset, AppendingRefusesTokensOutsideTheVocabularyAsAddSequenceDoes) {
  TempDir dir;
  write_corpus(dir.file("wide"), TokenDatasetFormat::megatron, 1000, make_corpus(1000));
  TokenDatasetWriter writer = TokenDatasetWriter::create(dir.file("small"), TokenDatasetFormat::megatron, 500);
  try {
    writer.append_dataset(TokenDataset::open(dir.file("wide")));
    FAIL() << "token 999 was appended to a vocabulary of 500";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 999 at position 0 of sequence 1 is outside the vocabulary [0, 500)"),
              std::string::npos)
        << e.what();
  }
}

// mt-tokenize --partitions under MPI: documents whose index the writer takes (reserve_documents)
// while another process writes their tokens at the offset it returns (TokenSpoolWriter), between
// and after documents the writer writes itself, in every format and token width, give the same
// files as one writer adding every sequence in order.
TEST(TokenDataset, ReservedDocumentsWrittenElsewhereEqualAddingTheirSequences) {
  for (const int64_t vocab_size : {1000, 100000}) {
    for (const TokenDatasetFormat format : {TokenDatasetFormat::megatron, TokenDatasetFormat::hdf5, TokenDatasetFormat::both}) {
      TempDir dir;
      const Corpus corpus = make_corpus(static_cast<int32_t>(vocab_size));  // 5 documents
      TokenDatasetWriter writer = TokenDatasetWriter::create(dir.file("placed"), format, vocab_size);
      TokenSpoolWriter elsewhere(writer.token_spool_path(), vocab_size);
      // Documents 1-2 and 4 are written elsewhere (4 is the last: the file ends with its tokens).
      add_document(writer, corpus, 0);
      const auto [middle_offset, middle_tokens] = reserve_corpus_documents(writer, corpus, 1, 3);
      add_document(writer, corpus, 3);
      const auto [last_offset, last_tokens] = reserve_corpus_documents(writer, corpus, 4, 5);
      elsewhere.write_at(last_offset, last_tokens);  // in any order
      elsewhere.write_at(middle_offset, middle_tokens);
      elsewhere.close();
      writer.finish();

      expect_files_equal_written_corpus(dir, "placed", format, vocab_size, corpus);
    }
  }
}

TEST(TokenDataset, ReservedTokensThatNeverArriveOrDoNotFitAreRefused) {
  TempDir dir;
  TokenDatasetWriter writer = TokenDatasetWriter::create(dir.file("short"), TokenDatasetFormat::megatron, 1000);
  writer.add_sequence(std::vector<int32_t>{1, 2});
  writer.end_document();
  const std::vector<int32_t> lengths{3}, per_document{1};
  EXPECT_EQ(writer.reserve_documents(lengths, per_document), 4);  // 2 uint16 tokens before
  try {
    writer.finish();
    FAIL() << "a token file without its reserved tokens was finished";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is 4 bytes but its 5 tokens take 10: tokens reserved for another writer never arrived"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir.file("short.bin")));
  EXPECT_FALSE(fs::exists(dir.file("short.idx")));

  TokenDatasetWriter counted = TokenDatasetWriter::create(dir.file("counts"), TokenDatasetFormat::megatron, 1000);
  const std::vector<int32_t> two_lengths{1, 2};
  EXPECT_THROW(counted.reserve_documents(two_lengths, per_document), Error);  // 1 sequence counted, 2 lengths
  TokenSpoolWriter elsewhere(counted.token_spool_path(), 1000);
  try {
    elsewhere.write_at(0, std::vector<int32_t>{5, 1000});
    FAIL() << "token 1000 written for a vocabulary of 1000";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 1000 is outside the vocabulary [0, 1000)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TokenSpoolWriter(dir.file("no_such_file"), 1000), Error);
}

// Documents 0-1 added to the output, 2-3 to a part writer (one reserved and written elsewhere,
// unsynced), 4 to a second part: appending the parts equals one writer adding all five, and
// leaves none of the parts' temporaries.
TEST(TokenDataset, AppendingUnfinishedWritersEqualsAddingTheirDocuments) {
  for (const int64_t vocab_size : {1000, 100000}) {
    for (const TokenDatasetFormat format : {TokenDatasetFormat::megatron, TokenDatasetFormat::hdf5, TokenDatasetFormat::both}) {
      TempDir dir;
      const Corpus corpus = make_corpus(static_cast<int32_t>(vocab_size));  // 5 documents
      TokenDatasetWriter writer = TokenDatasetWriter::create(dir.file("joined"), format, vocab_size);
      TokenDatasetWriter first_part = TokenDatasetWriter::create(dir.file("part_1"), TokenDatasetFormat::megatron, vocab_size);
      TokenDatasetWriter second_part = TokenDatasetWriter::create(dir.file("part_2"), TokenDatasetFormat::megatron, vocab_size);
      add_document(writer, corpus, 0);
      add_document(first_part, corpus, 2);
      const auto [offset, tokens] = reserve_corpus_documents(first_part, corpus, 3, 4);
      TokenSpoolWriter elsewhere(first_part.token_spool_path(), vocab_size);
      elsewhere.write_at(offset, tokens);
      elsewhere.close(false);
      add_document(writer, corpus, 1);
      add_document(second_part, corpus, 4);
      writer.append_writer(std::move(first_part));
      writer.append_writer(std::move(second_part));
      EXPECT_EQ(writer.document_count(), 5);
      writer.finish();

      expect_files_equal_written_corpus(dir, "joined", format, vocab_size, corpus);
      for (const auto& entry : fs::directory_iterator(dir.path())) {
        EXPECT_FALSE(entry.path().filename().string().starts_with("part_")) << entry.path();
      }
    }
  }
}

TEST(TokenDataset, AppendingAWriterRefusesMissingTokensAnOpenDocumentAndAnotherVocabulary) {
  TempDir dir;
  TokenDatasetWriter writer = TokenDatasetWriter::create(dir.file("out"), TokenDatasetFormat::megatron, 1000);
  TokenDatasetWriter missing = TokenDatasetWriter::create(dir.file("missing"), TokenDatasetFormat::megatron, 1000);
  const std::vector<int32_t> lengths{3}, per_document{1};
  missing.reserve_documents(lengths, per_document);  // never written
  try {
    writer.append_writer(std::move(missing));
    FAIL() << "a part without its reserved tokens was appended";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is 0 bytes but its 3 tokens take 6: tokens reserved for another writer never arrived"),
              std::string::npos)
        << e.what();
  }
  TokenDatasetWriter open = TokenDatasetWriter::create(dir.file("open"), TokenDatasetFormat::megatron, 1000);
  open.add_sequence(std::vector<int32_t>{1});
  EXPECT_THROW(writer.append_writer(std::move(open)), Error);
  TokenDatasetWriter wide = TokenDatasetWriter::create(dir.file("wide"), TokenDatasetFormat::megatron, 100000);
  EXPECT_THROW(writer.append_writer(std::move(wide)), Error);
  EXPECT_EQ(writer.document_count(), 0);
  writer.finish();
  EXPECT_EQ(TokenDataset::open(dir.file("out")).token_count(), 0);
}

TEST(TokenDataset, MegatronFilesEqualTheLayoutBuiltByHand) {
  for (const int64_t vocab_size : {1000, 100000}) {
    TempDir dir;
    const std::string prefix = dir.file("bytes");
    const Corpus corpus = make_corpus(static_cast<int32_t>(vocab_size));
    write_corpus(prefix, TokenDatasetFormat::megatron, vocab_size, corpus);
    const MegatronFiles expected =
        vocab_size < 65500 ? megatron_by_hand<uint16_t>(8, corpus.sequences(), corpus.document_indices())
                           : megatron_by_hand<int32_t>(4, corpus.sequences(), corpus.document_indices());
    EXPECT_EQ(read_bytes(prefix + ".bin"), expected.bin) << "vocab " << vocab_size;
    EXPECT_EQ(read_bytes(prefix + ".idx"), expected.idx) << "vocab " << vocab_size;
  }
}

TEST(TokenDataset, ReadsMegatronFilesOfOtherIntegerDtypes) {
  TempDir dir;
  const Sequences sequences{{1, 2, 3}, {}, {250}};
  const std::vector<int64_t> documents{0, 2, 3};
  const MegatronFiles uint8_files = megatron_by_hand<uint8_t>(1, sequences, documents);
  write_bytes(dir.file("u8.bin"), uint8_files.bin);
  write_bytes(dir.file("u8.idx"), uint8_files.idx);
  const TokenDataset u8 = TokenDataset::open(dir.file("u8"));
  EXPECT_EQ(u8.dtype(), DType::u8);
  EXPECT_EQ(u8.get(2), std::vector<int32_t>{250});

  const MegatronFiles int64_files = megatron_by_hand<int64_t>(5, sequences, documents);
  write_bytes(dir.file("i64.bin"), int64_files.bin);
  write_bytes(dir.file("i64.idx"), int64_files.idx);
  const TokenDataset i64 = TokenDataset::open(dir.file("i64"));
  EXPECT_EQ(i64.get(0), (std::vector<int32_t>{1, 2, 3}));

  // An int64 token that does not fit int32 is refused when read.
  Bytes bin = int64_files.bin;
  poke<int64_t>(bin, 0, int64_t{1} << 40);
  write_bytes(dir.file("i64.bin"), bin);
  const TokenDataset wide = TokenDataset::open(dir.file("i64"));
  EXPECT_THROW(wide.get(0), Error);
}

TEST(TokenDataset, NumpyReaderReadsTheSameSequences) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    // setup.sh installs the oracle and sets MT_REQUIRE_ORACLES=1: there, a missing one fails.
    const char* required = std::getenv("MT_REQUIRE_ORACLES");
    if (required && std::string(required) == "1") FAIL() << "/usr/bin/python3 with numpy is not available";
    GTEST_SKIP() << "/usr/bin/python3 with numpy is not available";
  }
  for (const int64_t vocab_size : {1000, 100000}) {
    TempDir dir;
    const std::string prefix = dir.file("numpy");
    const Corpus corpus = make_corpus(static_cast<int32_t>(vocab_size));
    write_corpus(prefix, TokenDatasetFormat::megatron, vocab_size, corpus);

    std::ostringstream expected;
    expected << "dtype " << (vocab_size < 65500 ? "uint16" : "int32") << "\n";
    const Sequences sequences = corpus.sequences();
    expected << "sequences " << sequences.size() << "\n";
    expected << "document_indices";
    for (const int64_t index : corpus.document_indices()) expected << " " << index;
    expected << "\n";
    for (size_t i = 0; i < sequences.size(); ++i) {
      expected << "sequence " << i << ":";
      for (const int32_t token : sequences[i]) expected << " " << token;
      expected << "\n";
    }

    const std::string command = "/usr/bin/python3 " MT_SOURCE_DIR "/tests/data/read_megatron_idx.py '" + prefix + "'";
    FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string output;
    char buffer[4096];
    size_t got = 0;
    while ((got = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, got);
    EXPECT_EQ(pclose(pipe), 0) << command;
    EXPECT_EQ(output, expected.str()) << "vocab " << vocab_size;
  }
}

TEST(TokenDataset, UnfinishedWriterLeavesNoFileBehind) {
  for (const TokenDatasetFormat format :
       {TokenDatasetFormat::hdf5, TokenDatasetFormat::megatron, TokenDatasetFormat::both}) {
    TempDir dir;
    {
      TokenDatasetWriter writer = TokenDatasetWriter::create(dir.file("partial"), format, 1000);
      writer.add_sequence(std::vector<int32_t>{1, 2, 3});
      writer.end_document();
      EXPECT_FALSE(dir.entries().empty()) << "the temporaries exist while writing";
    }
    EXPECT_TRUE(dir.entries().empty());
    // A writer abandoned because of an error cleans up too.
    try {
      TokenDatasetWriter writer = TokenDatasetWriter::create(dir.file("failed"), format, 1000);
      writer.add_sequence(std::vector<int32_t>{1, 2, 3});
      writer.add_sequence(std::vector<int32_t>{1, 1000});
      FAIL() << "a token outside the vocabulary was accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("outside the vocabulary"), std::string::npos) << error.what();
    }
    EXPECT_TRUE(dir.entries().empty());
  }
}

TEST(TokenDataset, WriterRefusesBadArguments) {
  TempDir dir;
  EXPECT_THROW(TokenDatasetWriter::create(dir.file("x"), TokenDatasetFormat::hdf5, 0), UsageError);
  EXPECT_THROW(TokenDatasetWriter::create(dir.file("missing-dir/x"), TokenDatasetFormat::hdf5, 10), Error);
  TokenDatasetWriter writer = TokenDatasetWriter::create(dir.file("x"), TokenDatasetFormat::hdf5, 10);
  EXPECT_THROW(writer.add_sequence(std::vector<int32_t>{-1}), Error);
  EXPECT_THROW(writer.add_sequence(std::vector<int32_t>{10}), Error);
  EXPECT_EQ(writer.sequence_count(), 0);
}

// Issue 11 case 5: X.h5 and X.bin/.idx of different runs under one prefix are refused, naming
// both files, however they differ (document structure, sequence lengths, or only tokens); one
// dataset in both formats (--output-format both) opens as before, and naming a file reads it.
TEST(Issue11Case05, AnAmbiguousPrefixIsRefusedNamingBothFiles) {
  TempDir dir;
  const Corpus corpus = make_corpus(1000);
  auto expect_ambiguous = [&](const std::string& prefix, const std::string& difference) {
    try {
      TokenDataset::open(prefix);
      ADD_FAILURE() << "opened an ambiguous prefix " << prefix;
    } catch (const Error& error) {
      EXPECT_EQ(std::string(error.what()),
                prefix + ": ambiguous: " + prefix + ".h5 and " + prefix + ".bin + " + prefix +
                    ".idx hold different token datasets (" + difference + "); remove the stale one, or name the one " +
                    "to read (" + prefix + ".h5 or " + prefix + ".bin)");
    }
    EXPECT_EQ(TokenDataset::open(prefix + ".h5").format(), TokenDatasetFormat::hdf5);
    EXPECT_EQ(TokenDataset::open(prefix + ".bin").format(), TokenDatasetFormat::megatron);
  };
  Corpus other = corpus;
  other.documents.pop_back();
  write_corpus(dir.file("shape"), TokenDatasetFormat::hdf5, 1000, corpus);
  write_corpus(dir.file("shape"), TokenDatasetFormat::megatron, 1000, other);
  expect_ambiguous(dir.file("shape"), "5 documents, 8 sequences, 16 tokens against 4 documents, 5 sequences, 11 tokens");

  other = corpus;
  std::swap(other.documents[0], other.documents[1]);  // same counts, other lengths
  write_corpus(dir.file("lengths"), TokenDatasetFormat::hdf5, 1000, corpus);
  write_corpus(dir.file("lengths"), TokenDatasetFormat::megatron, 1000, other);
  expect_ambiguous(dir.file("lengths"), "the sequence lengths differ");

  other = corpus;
  other.documents[4][2][0] = 12;  // the one token of the last sequence
  write_corpus(dir.file("tokens"), TokenDatasetFormat::hdf5, 1000, corpus);
  write_corpus(dir.file("tokens"), TokenDatasetFormat::megatron, 1000, other);
  expect_ambiguous(dir.file("tokens"), "the tokens of sequence 7 differ");

  // One dataset written twice, in another dtype the second time: not ambiguous.
  write_corpus(dir.file("same"), TokenDatasetFormat::hdf5, 1000, corpus);
  write_corpus(dir.file("same"), TokenDatasetFormat::megatron, 100000, corpus);
  const TokenDataset same = TokenDataset::open(dir.file("same"));
  EXPECT_EQ(same.format(), TokenDatasetFormat::hdf5);
  expect_matches(same, corpus);
}

// Issue 11 case 17: a directory where a dataset prefix or file is expected says so.
TEST(Issue11Case17, DirectoriesAreNamedAsSuch) {
  TempDir dir;
  fs::create_directories(dir.file("folder"));
  try {
    TokenDataset::open(dir.file("folder"));
    ADD_FAILURE() << "opened a directory";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), dir.file("folder") +
                                             ": is a directory; a token dataset is named by its prefix X (of X.h5, or "
                                             "X.bin and X.idx)");
  }
  fs::create_directories(dir.file("x.h5"));
  try {
    TokenDataset::open(dir.file("x"));
    ADD_FAILURE() << "opened a directory x.h5";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), dir.file("x.h5") + ": is a directory, expected a file");
  }
  // Megatron's default index cache is PREFIX/cache: a directory named like the prefix is fine.
  write_corpus(dir.file("data"), TokenDatasetFormat::hdf5, 1000, make_corpus(1000));
  fs::create_directories(dir.file("data") + "/cache");
  EXPECT_EQ(TokenDataset::open(dir.file("data")).format(), TokenDatasetFormat::hdf5);
  EXPECT_EQ(TokenDataset::open(dir.file("data") + ".h5").format(), TokenDatasetFormat::hdf5);
}

TEST(TokenDataset, MissingFilesAreNamed) {
  TempDir dir;
  const std::string prefix = dir.file("absent");
  try {
    TokenDataset::open(prefix);
    FAIL() << "opened a missing dataset";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(prefix + ".h5"), std::string::npos) << message;
    EXPECT_NE(message.find(prefix + ".bin"), std::string::npos) << message;
  }
  write_bytes(prefix + ".bin", Bytes(4, 0));
  try {
    TokenDataset::open(prefix);
    FAIL() << "opened a .bin without .idx";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(prefix + ".idx does not"), std::string::npos) << error.what();
  }
}

namespace {

// Writes a valid uint16 dataset's files by hand, lets `corrupt` change them, and expects open()
// to throw an mt::Error whose message contains `expected`.
void expect_corrupt_megatron(const std::string& expected,
                             const std::function<void(Bytes& bin, Bytes& idx)>& corrupt) {
  TempDir dir;
  const std::string prefix = dir.file("bad");
  MegatronFiles files = megatron_by_hand<uint16_t>(8, {{1, 2, 3}, {4, 5}, {6}}, {0, 2, 3});
  corrupt(files.bin, files.idx);
  write_bytes(prefix + ".bin", files.bin);
  write_bytes(prefix + ".idx", files.idx);
  try {
    TokenDataset::open(prefix);
    ADD_FAILURE() << "a corrupt dataset was accepted (expected: " << expected << ")";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find(prefix), std::string::npos) << error.what();
  }
}

// Offsets inside the hand-built .idx of three sequences and three document indices.
constexpr size_t kVersionAt = 9, kDtypeAt = 17, kSequenceCountAt = 18, kDocumentCountAt = 26;
constexpr size_t kLengthsAt = 34, kPointersAt = kLengthsAt + 3 * 4, kDocumentsAt = kPointersAt + 3 * 8;

}  // namespace

TEST(TokenDataset, CorruptMegatronFilesAreRefused) {
  expect_corrupt_megatron("wrong magic", [](Bytes&, Bytes& idx) { idx[0] = 'X'; });
  expect_corrupt_megatron("version 2", [](Bytes&, Bytes& idx) { poke<uint64_t>(idx, kVersionAt, 2); });
  expect_corrupt_megatron("dtype code 9", [](Bytes&, Bytes& idx) { idx[kDtypeAt] = 9; });
  expect_corrupt_megatron("dtype code 0", [](Bytes&, Bytes& idx) { idx[kDtypeAt] = 0; });
  expect_corrupt_megatron("float32", [](Bytes&, Bytes& idx) { idx[kDtypeAt] = 7; });
  expect_corrupt_megatron("truncated", [](Bytes&, Bytes& idx) { idx.resize(20); });
  expect_corrupt_megatron("truncated", [](Bytes&, Bytes& idx) { idx.pop_back(); });
  expect_corrupt_megatron("truncated",
                          [](Bytes&, Bytes& idx) { poke<uint64_t>(idx, kSequenceCountAt, uint64_t{1} << 62); });
  expect_corrupt_megatron("truncated",
                          [](Bytes&, Bytes& idx) { poke<uint64_t>(idx, kDocumentCountAt, 1000000000000); });
  expect_corrupt_megatron("past the end", [](Bytes& bin, Bytes&) { bin.resize(bin.size() - 2); });
  // Probe case W5: a .bin longer than its index (another dataset's) is refused, not read at the
  // wrong offsets.
  expect_corrupt_megatron("not one dataset's pair", [](Bytes& bin, Bytes&) { bin.resize(bin.size() + 2); });
  expect_corrupt_megatron("not one dataset's pair", [](Bytes&, Bytes& idx) { poke<int32_t>(idx, kLengthsAt + 8, 0); });
  expect_corrupt_megatron("past the end", [](Bytes&, Bytes& idx) { poke<int32_t>(idx, kLengthsAt + 8, 5); });
  expect_corrupt_megatron("past the end",
                          [](Bytes&, Bytes& idx) { poke<int64_t>(idx, kPointersAt + 16, int64_t{1} << 61); });
  expect_corrupt_megatron("negative length", [](Bytes&, Bytes& idx) { poke<int32_t>(idx, kLengthsAt, -1); });
  expect_corrupt_megatron("negative offset", [](Bytes&, Bytes& idx) { poke<int64_t>(idx, kPointersAt, -4); });
  expect_corrupt_megatron("not monotonic", [](Bytes&, Bytes& idx) { poke<int64_t>(idx, kPointersAt + 8, 2); });
  expect_corrupt_megatron("not a multiple", [](Bytes&, Bytes& idx) { poke<int64_t>(idx, kPointersAt + 8, 7); });
  expect_corrupt_megatron("start with 1", [](Bytes&, Bytes& idx) { poke<int64_t>(idx, kDocumentsAt, 1); });
  expect_corrupt_megatron("out of range", [](Bytes&, Bytes& idx) { poke<int64_t>(idx, kDocumentsAt + 8, 4); });
  expect_corrupt_megatron("out of range", [](Bytes&, Bytes& idx) { poke<int64_t>(idx, kDocumentsAt + 8, -1); });
  expect_corrupt_megatron("not the sequence count",
                          [](Bytes&, Bytes& idx) { poke<int64_t>(idx, kDocumentsAt + 16, 2); });
  expect_corrupt_megatron("document indices are empty", [](Bytes&, Bytes& idx) {
    poke<uint64_t>(idx, kDocumentCountAt, 0);
  });
}

namespace {

// A token dataset HDF5 file written directly with the HDF5 C API, with knobs to break it.
struct HandMadeH5 {
  std::vector<uint16_t> tokens{1, 2, 3, 4, 5, 6};
  std::vector<int32_t> lengths{3, 2, 1};
  std::vector<int64_t> offsets{0, 3, 5};
  std::vector<int64_t> document_indices{0, 2, 3};
  bool with_format = true;
  int64_t format_version = 1;
  bool chunked_tokens = false;
  bool with_offsets = true;
};

void write_string_attribute_vlen(hid_t file, const char* name, const char* value) {
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attribute = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attribute, type, &value);
  H5Aclose(attribute);
  H5Sclose(space);
  H5Tclose(type);
}

void write_int_attribute(hid_t file, const char* name, int64_t value) {
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attribute = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attribute, H5T_NATIVE_INT64, &value);
  H5Aclose(attribute);
  H5Sclose(space);
}

void write_dataset(hid_t file, const char* name, hid_t file_type, hid_t memory_type, const void* data, size_t count,
                   hid_t properties = H5P_DEFAULT) {
  const hsize_t dims[1] = {count};
  const hid_t space = H5Screate_simple(1, dims, nullptr);
  const hid_t dataset = H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, properties, H5P_DEFAULT);
  ASSERT_GE(dataset, 0) << name;
  H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(dataset);
  H5Sclose(space);
}

void write_hand_made(const std::string& path, const HandMadeH5& spec) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  if (spec.with_format) write_string_attribute_vlen(file, "mt_format", "mt-token-dataset");
  write_int_attribute(file, "mt_format_version", spec.format_version);
  write_int_attribute(file, "vocab_size", 100);
  write_string_attribute_vlen(file, "tokenizer", "hand-made");
  const hid_t properties = H5Pcreate(H5P_DATASET_CREATE);
  if (spec.chunked_tokens) {
    const hsize_t chunk[1] = {2};
    H5Pset_chunk(properties, 1, chunk);
  }
  write_dataset(file, "tokens", H5T_STD_U16LE, H5T_NATIVE_UINT16, spec.tokens.data(), spec.tokens.size(), properties);
  H5Pclose(properties);
  write_dataset(file, "sequence_lengths", H5T_STD_I32LE, H5T_NATIVE_INT32, spec.lengths.data(), spec.lengths.size());
  if (spec.with_offsets) {
    write_dataset(file, "sequence_offsets", H5T_STD_I64LE, H5T_NATIVE_INT64, spec.offsets.data(),
                  spec.offsets.size());
  }
  write_dataset(file, "document_indices", H5T_STD_I64LE, H5T_NATIVE_INT64, spec.document_indices.data(),
                spec.document_indices.size());
  H5Fclose(file);
}

void expect_corrupt_h5(const std::string& expected, const std::function<void(HandMadeH5&)>& corrupt) {
  TempDir dir;
  const std::string prefix = dir.file("bad");
  HandMadeH5 spec;
  corrupt(spec);
  write_hand_made(prefix + ".h5", spec);
  try {
    TokenDataset::open(prefix);
    ADD_FAILURE() << "a corrupt HDF5 dataset was accepted (expected: " << expected << ")";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find(prefix + ".h5"), std::string::npos) << error.what();
  }
}

}  // namespace

TEST(TokenDataset, ReadsAHandMadeHdf5File) {
  TempDir dir;
  write_hand_made(dir.file("hand.h5"), HandMadeH5{});
  const TokenDataset dataset = TokenDataset::open(dir.file("hand"));
  EXPECT_EQ(dataset.dtype(), DType::u16);
  EXPECT_EQ(dataset.vocab_size(), 100);
  EXPECT_EQ(dataset.metadata().tokenizer, "hand-made");
  EXPECT_EQ(dataset.metadata().eod_id, -1);
  EXPECT_EQ(dataset.get(0), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(dataset.get(1), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(dataset.get(2), (std::vector<int32_t>{6}));
  EXPECT_THROW(dataset.get(3), Error);
  EXPECT_THROW(dataset.get(0, 2, 2), Error);
  EXPECT_THROW(dataset.get(0, -1, 1), Error);
}

TEST(TokenDataset, CorruptHdf5FilesAreRefused) {
  expect_corrupt_h5("mt_format", [](HandMadeH5& h) { h.with_format = false; });
  expect_corrupt_h5("mt_format_version 2", [](HandMadeH5& h) { h.format_version = 2; });
  expect_corrupt_h5("memory-mapped", [](HandMadeH5& h) { h.chunked_tokens = true; });
  expect_corrupt_h5("/sequence_offsets is missing", [](HandMadeH5& h) { h.with_offsets = false; });
  expect_corrupt_h5("entries", [](HandMadeH5& h) { h.offsets.pop_back(); });
  expect_corrupt_h5("past the end", [](HandMadeH5& h) { h.offsets[2] = 6; });
  expect_corrupt_h5("past the end", [](HandMadeH5& h) { h.tokens.pop_back(); });
  expect_corrupt_h5("not monotonic", [](HandMadeH5& h) { h.offsets[1] = 1; });
  expect_corrupt_h5("out of range", [](HandMadeH5& h) { h.document_indices[1] = 7; });
  expect_corrupt_h5("not the sequence count", [](HandMadeH5& h) { h.document_indices[2] = 2; });

  TempDir dir;
  write_bytes(dir.file("junk.h5"), Bytes(1000, 0x5a));
  EXPECT_THROW(TokenDataset::open(dir.file("junk")), Error);
  // A truncated HDF5 file (cut inside /tokens or its metadata) is refused, never a crash.
  write_corpus(dir.file("cut"), TokenDatasetFormat::hdf5, 1000, make_corpus(1000));
  Bytes bytes = read_bytes(dir.file("cut.h5"));
  bytes.resize(bytes.size() / 2);
  write_bytes(dir.file("cut.h5"), bytes);
  EXPECT_THROW(TokenDataset::open(dir.file("cut")), Error);
}

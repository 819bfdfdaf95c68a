// Token dataset writer and reader: HDF5 and Megatron .bin/.idx (see token_dataset.h).
// Tested in tests/unit/data/test_token_dataset.cpp.
#include "data/token_dataset.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/input_file.h"
#include "core/positional_io.h"
#include "core/temporary_file.h"
#include "io/hdf5_attributes.h"

namespace mt::data {

using io::Hdf5Handle;
using io::read_int_attribute;
using io::read_string_attribute;
using io::write_int_attribute;
using io::write_string_attribute;

// Both formats are little-endian; tokens are read and written in host order.
static_assert(std::endian::native == std::endian::little, "mt token datasets need a little-endian host");

namespace {

constexpr char kIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kIdxVersion = 1;
constexpr size_t kIdxHeaderBytes = 9 + 8 + 1 + 8 + 8;
// The dtypes of Megatron's DType codes 1..8, in code order.
constexpr DType kMegatronDtypes[] = {DType::u8, DType::i8, DType::i16, DType::i32,
                                     DType::i64, DType::f64, DType::f32, DType::u16};
constexpr const char* kHdf5Format = "mt-token-dataset";
constexpr int64_t kHdf5FormatVersion = 1;
constexpr size_t kCopyBlockTokens = size_t{1} << 20;

std::string errno_text() { return std::strerror(errno); }

bool is_regular_file(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error);
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Closes a file descriptor when it goes out of scope.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// A read-only memory mapping of bytes [offset, offset + length) of a file (page-aligned inside).
class Mapping {
 public:
  Mapping() = default;
  Mapping(const std::string& path, int fd, uint64_t offset, uint64_t length) {
    if (length == 0) return;
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t aligned = offset - offset % page;
    mapped_length_ = static_cast<size_t>(length + (offset - aligned));
    void* base = mmap(nullptr, mapped_length_, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(aligned));
    if (base == MAP_FAILED) {
      mapped_length_ = 0;
      throw Error(path, "cannot memory-map: " + errno_text());
    }
    base_ = base;
    data_ = static_cast<const std::byte*>(base) + (offset - aligned);
  }
  ~Mapping() { release(); }
  Mapping(Mapping&& other) noexcept { *this = std::move(other); }
  Mapping& operator=(Mapping&& other) noexcept {
    if (this != &other) {
      release();
      base_ = std::exchange(other.base_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      mapped_length_ = std::exchange(other.mapped_length_, 0);
    }
    return *this;
  }
  const std::byte* data() const { return data_; }

 private:
  void release() {
    if (base_ != nullptr) munmap(base_, mapped_length_);
    base_ = nullptr;
    data_ = nullptr;
    mapped_length_ = 0;
  }
  void* base_ = nullptr;
  const std::byte* data_ = nullptr;
  size_t mapped_length_ = 0;
};

uint64_t file_size(const std::string& path, int fd) {
  struct stat status {};
  if (fstat(fd, &status) != 0) throw Error(path, "cannot stat: " + errno_text());
  return static_cast<uint64_t>(status.st_size);
}

// fwrite of `count` items, where an empty write (possibly from a null pointer) succeeds.
bool write_items(FILE* file, const void* data, size_t item_size, size_t count) {
  return count == 0 || std::fwrite(data, item_size, count, file) == count;
}

// The index of the first token outside [0, vocab_size), or tokens.size() when every one is inside.
size_t first_outside_vocabulary(std::span<const int32_t> tokens, int64_t vocab_size) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) return i;
  }
  return tokens.size();
}

// `tokens` as `dtype` stores them: their own bytes for int32, narrowed into `narrow` for uint16.
std::span<const std::byte> stored_bytes(std::span<const int32_t> tokens, DType dtype, std::vector<uint16_t>& narrow) {
  if (dtype != DType::u16) return std::as_bytes(tokens);
  narrow.assign(tokens.begin(), tokens.end());
  return std::as_bytes(std::span<const uint16_t>(narrow));
}

// memcpy that accepts empty copies from or to null pointers.
void copy_bytes(void* destination, const void* source, size_t bytes) {
  if (bytes > 0) std::memcpy(destination, source, bytes);
}

// Megatron's builder writes a .bin as its sequences back to back, so the index's last sequence
// ends exactly at the file's end; a longer .bin is another dataset's (an .idx paired with the
// wrong .bin would train on tokens cut at the wrong offsets). Offsets are validated before.
void check_bin_size(const std::string& idx_path, const std::string& bin_path, uint64_t bin_size,
                    const std::vector<int32_t>& lengths, const std::vector<int64_t>& offsets, int64_t item) {
  const int64_t end_tokens = lengths.empty() ? 0 : offsets.back() + lengths.back();
  const uint64_t end_bytes = static_cast<uint64_t>(end_tokens) * static_cast<uint64_t>(item);
  if (bin_size != end_bytes) {
    throw Error(bin_path, std::to_string(bin_size) + " bytes, but its index " + idx_path + " ends at byte " +
                              std::to_string(end_bytes) + ": the .bin and .idx are not one dataset's pair");
  }
}

// Checks what both formats promise, in tokens: lengths >= 0; each sequence inside the storage,
// after the end of the previous one; document indices 0 .. sequence count, non-decreasing.
void validate_index(const std::string& path, const std::vector<int32_t>& lengths, const std::vector<int64_t>& offsets,
                    const std::vector<int64_t>& document_indices, int64_t storage_tokens) {
  const std::string storage = "the token storage (" + std::to_string(storage_tokens) + " tokens)";
  for (size_t i = 0; i < lengths.size(); ++i) {
    const std::string sequence = "sequence " + std::to_string(i);
    if (lengths[i] < 0) throw Error(path, sequence + " has negative length " + std::to_string(lengths[i]));
    if (offsets[i] < 0) throw Error(path, sequence + " has negative offset " + std::to_string(offsets[i]));
    if (offsets[i] > storage_tokens - lengths[i]) {
      throw Error(path, sequence + " (offset " + std::to_string(offsets[i]) + ", length " + std::to_string(lengths[i]) +
                            ") ends past the end of " + storage);
    }
    if (i > 0 && offsets[i] < offsets[i - 1] + lengths[i - 1]) {
      throw Error(path, "sequence offsets are not monotonic: " + sequence + " starts at " + std::to_string(offsets[i]) +
                            ", before the end of sequence " + std::to_string(i - 1) + " (" +
                            std::to_string(offsets[i - 1] + lengths[i - 1]) + ")");
    }
  }
  const int64_t sequences = static_cast<int64_t>(lengths.size());
  if (document_indices.empty()) throw Error(path, "document indices are empty (they start with 0)");
  if (document_indices.front() != 0) {
    throw Error(path, "document indices start with " + std::to_string(document_indices.front()) + ", not 0");
  }
  for (size_t d = 1; d < document_indices.size(); ++d) {
    if (document_indices[d] < document_indices[d - 1] || document_indices[d] > sequences) {
      throw Error(path, "document index " + std::to_string(d) + " (" + std::to_string(document_indices[d]) +
                            ") is out of range: indices must be non-decreasing and at most the sequence count " +
                            std::to_string(sequences));
    }
  }
  if (document_indices.back() != sequences) {
    throw Error(path, "the last document index (" + std::to_string(document_indices.back()) +
                          ") is not the sequence count " + std::to_string(sequences));
  }
}

// ---- HDF5 helpers ----

void write_index_dataset(const std::string& path, hid_t file, const char* name, hid_t file_type, hid_t memory_type,
                         const void* data, size_t count) {
  const hsize_t dims[1] = {count};
  Hdf5Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  Hdf5Handle properties(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(properties.get(), false);  // no timestamps: equal inputs give equal files
  Hdf5Handle dataset(H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, properties.get(), H5P_DEFAULT), H5Dclose);
  if (!dataset.ok()) throw Error(path, std::string("cannot create dataset /") + name);
  if (count > 0 && H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    throw Error(path, std::string("cannot write dataset /") + name);
  }
}

// Opens a dataset, throwing when it is missing.
hid_t open_dataset(const std::string& path, hid_t file, const char* name) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) throw Error(path, std::string("dataset /") + name + " is missing");
  const hid_t dataset = H5Dopen2(file, name, H5P_DEFAULT);
  if (dataset < 0) throw Error(path, std::string("cannot open dataset /") + name);
  return dataset;
}

// The element count of a 1-D integer dataset; throws naming it when it is anything else.
hsize_t integer_1d_extent(const std::string& path, hid_t dataset, const char* name) {
  Hdf5Handle type(H5Dget_type(dataset), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER) throw Error(path, std::string("dataset /") + name + " is not integer");
  Hdf5Handle space(H5Dget_space(dataset), H5Sclose);
  if (H5Sget_simple_extent_ndims(space.get()) != 1) throw Error(path, std::string("dataset /") + name + " is not 1-D");
  hsize_t count = 0;
  H5Sget_simple_extent_dims(space.get(), &count, nullptr);
  return count;
}

template <typename T>
std::vector<T> read_index_dataset(const std::string& path, hid_t file, const char* name, hid_t memory_type) {
  Hdf5Handle dataset(open_dataset(path, file, name), H5Dclose);
  const hsize_t count = integer_1d_extent(path, dataset.get(), name);
  std::vector<T> values(static_cast<size_t>(count));
  if (count > 0 && H5Dread(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
    throw Error(path, std::string("cannot read dataset /") + name + " (values out of range for its type?)");
  }
  return values;
}

// The token dtype of an HDF5 integer type stored little-endian; throws for anything else.
DType dtype_from_hdf5(const std::string& path, hid_t type) {
  const size_t size = H5Tget_size(type);
  const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
  if (H5Tget_order(type) != H5T_ORDER_LE) throw Error(path, "dataset /tokens is not little-endian");
  if (size == 1) return is_signed ? DType::i8 : DType::u8;
  if (size == 2) return is_signed ? DType::i16 : DType::u16;
  if (size == 4 && is_signed) return DType::i32;
  if (size == 8 && is_signed) return DType::i64;
  throw Error(path, "dataset /tokens has an unsupported integer type (" + std::to_string(size * 8) + "-bit " +
                        (is_signed ? "signed" : "unsigned") + ")");
}

hid_t hdf5_file_type(DType dtype) { return dtype == DType::u16 ? H5T_STD_U16LE : H5T_STD_I32LE; }
hid_t hdf5_memory_type(DType dtype) { return dtype == DType::u16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_INT32; }

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path, "cannot reopen to sync: " + errno_text());
  FileDescriptor guard(fd);
  if (fsync(fd) != 0) throw Error(path, "cannot sync: " + errno_text());
}

}  // namespace

// ---- dtypes and formats ----

uint8_t megatron_dtype_code(DType dtype) {
  for (size_t i = 0; i < std::size(kMegatronDtypes); ++i) {
    if (kMegatronDtypes[i] == dtype) return static_cast<uint8_t>(i + 1);
  }
  throw Error(std::string("dtype ") + dtype_name(dtype), "Megatron's .idx has no code for it");
}

std::optional<DType> dtype_from_megatron_code(uint8_t code) {
  if (code < 1 || code > std::size(kMegatronDtypes)) return std::nullopt;
  return kMegatronDtypes[code - 1];
}

DType optimal_token_dtype(int64_t vocab_size) { return vocab_size < 65500 ? DType::u16 : DType::i32; }

TokenDatasetFormat parse_token_dataset_format(std::string_view text) {
  if (text == "hdf5") return TokenDatasetFormat::hdf5;
  if (text == "megatron" || text == "bin") return TokenDatasetFormat::megatron;
  if (text == "both") return TokenDatasetFormat::both;
  throw UsageError("dataset format '" + std::string(text) + "'", "expected hdf5, megatron or both");
}

// ---- writer ----

struct TokenDatasetWriter::State {
  std::string prefix;
  TokenDatasetFormat format = TokenDatasetFormat::hdf5;
  int64_t vocab_size = 0;
  DType dtype = DType::i32;
  TokenDatasetMetadata metadata;

  std::string h5_final, bin_final, idx_final;
  // Removed unless committed (core/temporary_file.h), also by a signal handler.
  std::optional<TemporaryFile> h5_temp, idx_temp, spool_temp;
  std::string h5_temporary, idx_temporary;  // their paths
  // The tokens as they arrive: the .bin temporary, or a spool file when only HDF5 is written.
  std::string spool_path;
  FILE* spool = nullptr;

  std::vector<int32_t> sequence_lengths;
  std::vector<int64_t> document_indices{0};
  int64_t tokens = 0;
  std::vector<uint16_t> narrow;
  bool finished = false;

  bool writes_hdf5() const { return format != TokenDatasetFormat::megatron; }
  bool writes_megatron() const { return format != TokenDatasetFormat::hdf5; }

  ~State() {
    if (spool != nullptr) std::fclose(spool);
  }

  void check_open() const {
    // The spool is closed by finish(), also by one that failed: the writer is then unusable.
    if (finished || spool == nullptr) throw Error(prefix, "token dataset writer used after finish()");
  }

  bool has_open_document() const { return static_cast<int64_t>(sequence_lengths.size()) != document_indices.back(); }

  // The spool, flushed, holds exactly the tokens added and reserved: `stored` bytes.
  void check_tokens_stored(uint64_t stored) const {
    const int64_t expected = tokens * static_cast<int64_t>(dtype_size(dtype));
    if (static_cast<int64_t>(stored) != expected) {
      throw Error(spool_path, "is " + std::to_string(stored) + " bytes but its " + std::to_string(tokens) +
                                  " tokens take " + std::to_string(expected) + ": tokens reserved for another writer never arrived");
    }
  }

  void write_idx() const {
    FILE* file = std::fopen(idx_temporary.c_str(), "wb");
    if (file == nullptr) throw Error(idx_final, "cannot create " + idx_temporary + ": " + errno_text());
    const size_t item = dtype_size(dtype);
    std::vector<int64_t> pointers(sequence_lengths.size());
    int64_t pointer = 0;
    for (size_t i = 0; i < sequence_lengths.size(); ++i) {
      pointers[i] = pointer;
      pointer += static_cast<int64_t>(sequence_lengths[i]) * static_cast<int64_t>(item);
    }
    const uint64_t sequence_count = sequence_lengths.size();
    const uint64_t document_count = document_indices.size();
    const uint8_t code = megatron_dtype_code(dtype);
    bool ok = std::fwrite(kIdxMagic, 1, sizeof kIdxMagic, file) == sizeof kIdxMagic;
    ok = ok && std::fwrite(&kIdxVersion, sizeof kIdxVersion, 1, file) == 1;
    ok = ok && std::fwrite(&code, 1, 1, file) == 1;
    ok = ok && std::fwrite(&sequence_count, sizeof sequence_count, 1, file) == 1;
    ok = ok && std::fwrite(&document_count, sizeof document_count, 1, file) == 1;
    ok = ok && write_items(file, sequence_lengths.data(), sizeof(int32_t), sequence_lengths.size());
    ok = ok && write_items(file, pointers.data(), sizeof(int64_t), pointers.size());
    ok = ok && write_items(file, document_indices.data(), sizeof(int64_t), document_indices.size());
    ok = ok && std::fflush(file) == 0 && fsync(fileno(file)) == 0;
    const std::string failure = errno_text();
    ok = std::fclose(file) == 0 && ok;
    if (!ok) throw Error(idx_final, "cannot write " + idx_temporary + ": " + failure);
  }

  void write_hdf5() const {
    const io::Hdf5QuietErrors quiet;
    {
      Hdf5Handle file(H5Fcreate(h5_temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
      if (!file.ok()) throw Error(h5_final, "cannot create " + h5_temporary);
      write_string_attribute(h5_final, file.get(), "mt_format", kHdf5Format);
      write_int_attribute(h5_final, file.get(), "mt_format_version", kHdf5FormatVersion);
      write_string_attribute(h5_final, file.get(), "tokenizer", metadata.tokenizer);
      write_string_attribute(h5_final, file.get(), "tokenizer_hash", metadata.tokenizer_hash);
      write_int_attribute(h5_final, file.get(), "vocab_size", vocab_size);
      write_int_attribute(h5_final, file.get(), "eod_id", metadata.eod_id);

      std::vector<int64_t> offsets(sequence_lengths.size());
      int64_t offset = 0;
      for (size_t i = 0; i < sequence_lengths.size(); ++i) {
        offsets[i] = offset;
        offset += sequence_lengths[i];
      }
      write_index_dataset(h5_final, file.get(), "sequence_lengths", H5T_STD_I32LE, H5T_NATIVE_INT32,
                          sequence_lengths.data(), sequence_lengths.size());
      write_index_dataset(h5_final, file.get(), "sequence_offsets", H5T_STD_I64LE, H5T_NATIVE_INT64, offsets.data(),
                          offsets.size());
      write_index_dataset(h5_final, file.get(), "document_indices", H5T_STD_I64LE, H5T_NATIVE_INT64,
                          document_indices.data(), document_indices.size());

      // /tokens: contiguous and unfiltered, allocated at creation, so it sits at one file offset.
      const hsize_t dims[1] = {static_cast<hsize_t>(tokens)};
      Hdf5Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
      Hdf5Handle properties(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      H5Pset_layout(properties.get(), H5D_CONTIGUOUS);
      H5Pset_alloc_time(properties.get(), H5D_ALLOC_TIME_EARLY);
      H5Pset_fill_time(properties.get(), H5D_FILL_TIME_NEVER);
      H5Pset_obj_track_times(properties.get(), false);
      Hdf5Handle dataset(H5Dcreate2(file.get(), "tokens", hdf5_file_type(dtype), space.get(), H5P_DEFAULT,
                                properties.get(), H5P_DEFAULT),
                     H5Dclose);
      if (!dataset.ok()) throw Error(h5_final, "cannot create dataset /tokens");
      copy_spool_into(dataset.get(), space.get());
      if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) throw Error(h5_final, "cannot flush " + h5_temporary);
    }
    fsync_path(h5_temporary);
  }

  void copy_spool_into(hid_t dataset, hid_t file_space) const {
    if (tokens == 0) return;
    FILE* source = std::fopen(spool_path.c_str(), "rb");
    if (source == nullptr) throw Error(h5_final, "cannot reopen " + spool_path + ": " + errno_text());
    const size_t item = dtype_size(dtype);
    std::vector<std::byte> block(kCopyBlockTokens * item);
    hsize_t done = 0;
    const hsize_t total = static_cast<hsize_t>(tokens);
    bool ok = true;
    while (ok && done < total) {
      const hsize_t count = std::min<hsize_t>(kCopyBlockTokens, total - done);
      ok = std::fread(block.data(), item, count, source) == count;
      if (!ok) break;
      const hsize_t start[1] = {done};
      const hsize_t extent[1] = {count};
      Hdf5Handle memory(H5Screate_simple(1, extent, nullptr), H5Sclose);
      ok = H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, nullptr, extent, nullptr) >= 0 &&
           H5Dwrite(dataset, hdf5_memory_type(dtype), memory.get(), file_space, H5P_DEFAULT, block.data()) >= 0;
      done += count;
    }
    std::fclose(source);
    if (!ok) throw Error(h5_final, "cannot copy the tokens from " + spool_path + " into /tokens");
  }

};

TokenDatasetWriter::TokenDatasetWriter(std::unique_ptr<State> state) : state_(std::move(state)) {}
TokenDatasetWriter::TokenDatasetWriter(TokenDatasetWriter&&) noexcept = default;
TokenDatasetWriter& TokenDatasetWriter::operator=(TokenDatasetWriter&&) noexcept = default;
TokenDatasetWriter::~TokenDatasetWriter() = default;

TokenDatasetWriter TokenDatasetWriter::create(const std::string& prefix, TokenDatasetFormat format,
                                              int64_t vocab_size, const TokenDatasetMetadata& metadata) {
  if (prefix.empty()) throw UsageError("token dataset prefix", "is empty");
  if (vocab_size < 1) throw UsageError("vocab size " + std::to_string(vocab_size), "must be at least 1");
  if (vocab_size - 1 > std::numeric_limits<int32_t>::max()) {
    throw UsageError("vocab size " + std::to_string(vocab_size), "token ids must fit int32");
  }
  auto state = std::make_unique<State>();
  state->prefix = prefix;
  state->format = format;
  state->vocab_size = vocab_size;
  state->dtype = optimal_token_dtype(vocab_size);
  state->metadata = metadata;
  state->h5_final = prefix + ".h5";
  state->bin_final = prefix + ".bin";
  state->idx_final = prefix + ".idx";
  if (state->writes_hdf5()) {
    state->h5_temp.emplace(state->h5_final);
    state->h5_temporary = state->h5_temp->path();
  }
  if (state->writes_megatron()) {
    state->idx_temp.emplace(state->idx_final);
    state->idx_temporary = state->idx_temp->path();
    state->spool_temp.emplace(state->bin_final);
  } else {
    state->spool_temp.emplace(prefix + ".h5.tokens");
  }
  state->spool_path = state->spool_temp->path();
  state->spool = std::fopen(state->spool_path.c_str(), "wb");
  if (state->spool == nullptr) throw Error(prefix, "cannot create " + state->spool_path + ": " + errno_text());
  return TokenDatasetWriter(std::move(state));
}

void TokenDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  State& s = *state_;
  s.check_open();
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw Error(s.prefix, "sequence of " + std::to_string(tokens.size()) + " tokens is longer than int32 allows");
  }
  if (const size_t i = first_outside_vocabulary(tokens, s.vocab_size); i < tokens.size()) {
    throw Error(s.prefix, "token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                              " of sequence " + std::to_string(s.sequence_lengths.size()) +
                              " is outside the vocabulary [0, " + std::to_string(s.vocab_size) + ")");
  }
  const std::span<const std::byte> bytes = stored_bytes(tokens, s.dtype, s.narrow);
  if (!write_items(s.spool, bytes.data(), 1, bytes.size())) {
    throw Error(s.prefix, "cannot write to " + s.spool_path + ": " + errno_text());
  }
  s.sequence_lengths.push_back(static_cast<int32_t>(tokens.size()));
  s.tokens += static_cast<int64_t>(tokens.size());
}

void TokenDatasetWriter::end_document() {
  state_->check_open();
  state_->document_indices.push_back(static_cast<int64_t>(state_->sequence_lengths.size()));
}

int64_t TokenDatasetWriter::reserve_documents(std::span<const int32_t> sequence_lengths,
                                              std::span<const int32_t> sequences_per_document) {
  State& s = *state_;
  s.check_open();
  int64_t sequences = 0, tokens = 0;
  for (int32_t count : sequences_per_document) {
    if (count < 0) throw Error(s.prefix, "a reserved document has a negative sequence count");
    sequences += count;
  }
  if (sequences != static_cast<int64_t>(sequence_lengths.size())) {
    throw Error(s.prefix, "reserved documents hold " + std::to_string(sequences) + " sequences but " +
                              std::to_string(sequence_lengths.size()) + " lengths were given");
  }
  for (int32_t length : sequence_lengths) {
    if (length < 0) throw Error(s.prefix, "a reserved sequence has a negative length");
    tokens += length;
  }
  const int64_t item = static_cast<int64_t>(dtype_size(s.dtype));
  const int64_t offset = s.tokens * item;
  if (fseeko(s.spool, static_cast<off_t>((s.tokens + tokens) * item), SEEK_SET) != 0) {
    throw Error(s.prefix, "cannot move past the reserved tokens in " + s.spool_path + ": " + errno_text());
  }
  size_t sequence = 0;
  for (int32_t count : sequences_per_document) {
    for (int32_t i = 0; i < count; ++i) s.sequence_lengths.push_back(sequence_lengths[sequence++]);
    s.document_indices.push_back(static_cast<int64_t>(s.sequence_lengths.size()));
  }
  s.tokens += tokens;
  return offset;
}

const std::string& TokenDatasetWriter::token_spool_path() const { return state_->spool_path; }

TokenSpoolWriter::TokenSpoolWriter(const std::string& spool_path, int64_t vocab_size)
    : path_(spool_path), vocab_size_(vocab_size), dtype_(optimal_token_dtype(vocab_size)) {
  fd_ = ::open(spool_path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(spool_path, "cannot open for writing: " + errno_text());
}

TokenSpoolWriter::~TokenSpoolWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenSpoolWriter::write_at(int64_t byte_offset, std::span<const int32_t> tokens) {
  if (fd_ < 0) throw Error(path_, "token writer used after close()");
  if (const size_t i = first_outside_vocabulary(tokens, vocab_size_); i < tokens.size()) {
    throw Error(path_, "token " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                           std::to_string(vocab_size_) + ")");
  }
  const std::span<const std::byte> stored = stored_bytes(tokens, dtype_, narrow_);
  if (const std::string why = pwrite_all(fd_, stored.data(), stored.size(), byte_offset); !why.empty()) {
    throw Error(path_, "cannot write: " + why);
  }
}

void TokenSpoolWriter::close(bool make_durable) {
  if (fd_ < 0) return;
  const bool synced = !make_durable || ::fdatasync(fd_) == 0;
  const std::string failure = errno_text();
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!synced || !closed) throw Error(path_, "cannot write: " + (synced ? errno_text() : failure));
}

namespace {

// The sequences of `source` as runs of adjacent storage: (first token, token count) each.
std::vector<std::pair<int64_t, int64_t>> contiguous_runs(const TokenDataset& source) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  const auto lengths = source.sequence_lengths();
  const auto offsets = source.sequence_offsets();
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] == 0) continue;
    if (!runs.empty() && runs.back().first + runs.back().second == offsets[i]) {
      runs.back().second += lengths[i];
    } else {
      runs.emplace_back(offsets[i], lengths[i]);
    }
  }
  return runs;
}

// Whether every token of the runs is in [0, vocab_size), read as stored in `dtype` (u16 or i32).
bool tokens_in_vocabulary(const std::byte* storage, DType dtype, const std::vector<std::pair<int64_t, int64_t>>& runs,
                          int64_t vocab_size) {
  const auto check = [&]<typename T>(T) {
    for (const auto& [first, count] : runs) {
      const std::byte* bytes = storage + static_cast<size_t>(first) * sizeof(T);
      T low = std::numeric_limits<T>::max(), high = std::numeric_limits<T>::min();
      for (int64_t i = 0; i < count; ++i) {
        T value;
        std::memcpy(&value, bytes + static_cast<size_t>(i) * sizeof(T), sizeof(T));
        low = std::min(low, value);
        high = std::max(high, value);
      }
      if (static_cast<int64_t>(low) < 0 || static_cast<int64_t>(high) >= vocab_size) return false;
    }
    return true;
  };
  return dtype == DType::u16 ? check(uint16_t{}) : check(int32_t{});
}

// Appends the byte runs of the .bin `bin_path` to the spool with copy_file_range (no copy
// through user space); false, with nothing appended, when the kernel cannot (another
// filesystem, an old kernel): the caller then copies them itself.
bool copy_runs_in_kernel(FILE* spool, const std::string& spool_path, const std::string& bin_path,
                         const std::vector<std::pair<int64_t, int64_t>>& runs, size_t item) {
  if (std::fflush(spool) != 0) throw Error(spool_path, "cannot write: " + errno_text());
  const int source = ::open(bin_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (source < 0) return false;
  const int target = fileno(spool);
  const off_t start = ::lseek(target, 0, SEEK_CUR);
  bool copied = start >= 0;
  for (size_t r = 0; copied && r < runs.size(); ++r) {
    loff_t from = static_cast<loff_t>(runs[r].first) * static_cast<loff_t>(item);
    size_t left = static_cast<size_t>(runs[r].second) * item;
    while (left > 0) {
      const ssize_t done = ::copy_file_range(source, &from, target, nullptr, left, 0);
      if (done <= 0) {
        copied = false;
        break;
      }
      left -= static_cast<size_t>(done);
    }
  }
  ::close(source);
  if (!copied && start >= 0) {  // undo a partial copy: the caller appends the runs again
    if (::ftruncate(target, start) != 0 || ::lseek(target, start, SEEK_SET) != start) {
      throw Error(spool_path, "cannot write: " + errno_text());
    }
  }
  return copied;
}

// MT_TOKEN_DATASET_FAULT=between-renames:kill (tests only, as MT_CHECKPOINT_FAULT): SIGKILL
// after the new .bin is renamed into place and before the new .idx is, the one moment a .bin/.idx
// pair is neither the previous nor the new one. finish() removes the previous .idx first, so a
// kill there leaves a .bin without an .idx, which mt and Megatron both refuse (never a new .bin
// beside an old .idx, which Megatron would read silently when the new .bin is the longer).
void kill_between_renames_if_asked() {
  const char* fault = std::getenv("MT_TOKEN_DATASET_FAULT");
  if (fault != nullptr && std::string_view(fault) == "between-renames:kill") raise(SIGKILL);
}

}  // namespace

void TokenDatasetWriter::append_dataset(const TokenDataset& source) {
  State& s = *state_;
  s.check_open();
  const auto runs = contiguous_runs(source);
  const bool in_vocabulary = tokens_in_vocabulary(source.token_storage(), s.dtype, runs, s.vocab_size);
  if (source.dtype() != s.dtype || !in_vocabulary) {
    const auto documents = source.document_indices();
    std::vector<int32_t> tokens;
    for (size_t d = 0; d + 1 < documents.size(); ++d) {
      for (int64_t sequence = documents[d]; sequence < documents[d + 1]; ++sequence) {
        tokens.resize(static_cast<size_t>(source.sequence_lengths()[static_cast<size_t>(sequence)]));
        source.read(sequence, 0, tokens);
        add_sequence(tokens);
      }
      end_document();
    }
    return;
  }
  const size_t item = dtype_size(s.dtype);
  if (source.format() != TokenDatasetFormat::megatron || !copy_runs_in_kernel(s.spool, s.spool_path, source.path(), runs, item)) {
    for (const auto& [first, count] : runs) {
      if (!write_items(s.spool, source.token_storage() + static_cast<size_t>(first) * item, item,
                       static_cast<size_t>(count))) {
        throw Error(s.prefix, "cannot write to " + s.spool_path + ": " + errno_text());
      }
    }
  }
  const int64_t sequences_before = static_cast<int64_t>(s.sequence_lengths.size());
  const auto lengths = source.sequence_lengths();
  s.sequence_lengths.insert(s.sequence_lengths.end(), lengths.begin(), lengths.end());
  const auto documents = source.document_indices();
  for (size_t d = 1; d < documents.size(); ++d) s.document_indices.push_back(sequences_before + documents[d]);
  s.tokens += source.token_count();
}

void TokenDatasetWriter::append_writer(TokenDatasetWriter&& part_writer) {
  State& s = *state_;
  State& part = *part_writer.state_;
  s.check_open();
  part.check_open();
  if (part.vocab_size != s.vocab_size) {
    throw Error(s.prefix, "cannot append " + part.prefix + ": its vocabulary size is " + std::to_string(part.vocab_size) +
                              ", not " + std::to_string(s.vocab_size));
  }
  if (part.has_open_document()) throw Error(part.prefix, "cannot be appended with a document still open");
  if (std::fflush(part.spool) != 0) throw Error(part.prefix, "cannot write " + part.spool_path + ": " + errno_text());
  part.check_tokens_stored(file_size(part.spool_path, fileno(part.spool)));
  const size_t item = dtype_size(s.dtype);
  const std::vector<std::pair<int64_t, int64_t>> all{{0, part.tokens}};
  if (part.tokens > 0 && !copy_runs_in_kernel(s.spool, s.spool_path, part.spool_path, all, item)) {
    std::vector<std::byte> block(kCopyBlockTokens * item);
    const int64_t bytes = part.tokens * static_cast<int64_t>(item);
    for (int64_t done = 0; done < bytes;) {
      const size_t count = static_cast<size_t>(std::min<int64_t>(bytes - done, static_cast<int64_t>(block.size())));
      if (const std::string why = pread_all(fileno(part.spool), block.data(), count, done); !why.empty()) {
        throw Error(part.spool_path, "cannot read: " + why);
      }
      if (!write_items(s.spool, block.data(), 1, count)) throw Error(s.prefix, "cannot write to " + s.spool_path + ": " + errno_text());
      done += static_cast<int64_t>(count);
    }
  }
  const int64_t sequences_before = static_cast<int64_t>(s.sequence_lengths.size());
  s.sequence_lengths.insert(s.sequence_lengths.end(), part.sequence_lengths.begin(), part.sequence_lengths.end());
  for (size_t d = 1; d < part.document_indices.size(); ++d) s.document_indices.push_back(sequences_before + part.document_indices[d]);
  s.tokens += part.tokens;
  part_writer.state_.reset();
}

void TokenDatasetWriter::finish() {
  State& s = *state_;
  s.check_open();
  if (s.has_open_document()) end_document();
  const bool flushed = std::fflush(s.spool) == 0 && fsync(fileno(s.spool)) == 0;
  const std::string failure = errno_text();
  const uint64_t stored = flushed ? file_size(s.spool_path, fileno(s.spool)) : 0;
  const bool closed = std::fclose(s.spool) == 0;
  s.spool = nullptr;
  if (!flushed || !closed) throw Error(s.prefix, "cannot write " + s.spool_path + ": " + failure);
  s.check_tokens_stored(stored);

  if (s.writes_megatron()) s.write_idx();
  if (s.writes_hdf5()) s.write_hdf5();

  if (s.writes_hdf5()) s.h5_temp->commit();
  if (s.writes_megatron()) {
    if (std::remove(s.idx_final.c_str()) != 0 && errno != ENOENT) {
      throw Error(s.idx_final, "cannot remove the previous index: " + errno_text());
    }
    s.spool_temp->commit();
    kill_between_renames_if_asked();
    s.idx_temp->commit();
  } else {
    s.spool_temp->discard();
  }
  s.finished = true;
}

int64_t TokenDatasetWriter::sequence_count() const { return static_cast<int64_t>(state_->sequence_lengths.size()); }
int64_t TokenDatasetWriter::document_count() const {
  return static_cast<int64_t>(state_->document_indices.size()) - 1;
}
int64_t TokenDatasetWriter::token_count() const { return state_->tokens; }
DType TokenDatasetWriter::dtype() const { return state_->dtype; }

std::vector<std::string> TokenDatasetWriter::final_paths() const {
  std::vector<std::string> paths;
  if (state_->writes_hdf5()) paths.push_back(state_->h5_final);
  if (state_->writes_megatron()) {
    paths.push_back(state_->bin_final);
    paths.push_back(state_->idx_final);
  }
  return paths;
}

// ---- reader ----

struct TokenDataset::State {
  TokenDatasetFormat format = TokenDatasetFormat::hdf5;
  std::string path;
  DType dtype = DType::i32;
  int64_t vocab_size = -1;
  TokenDatasetMetadata metadata;
  std::vector<int32_t> sequence_lengths;
  std::vector<int64_t> sequence_offsets;
  std::vector<int64_t> document_indices;
  int64_t token_count = 0;
  Mapping tokens;

  void open_megatron(const std::string& bin_path, const std::string& idx_path);
  void open_hdf5(const std::string& path);
};

void TokenDataset::State::open_megatron(const std::string& bin_path, const std::string& idx_path) {
  State& s = *this;
  s.format = TokenDatasetFormat::megatron;
  s.path = bin_path;
  FileDescriptor idx_fd(open_input_fd(idx_path));
  const uint64_t idx_size = file_size(idx_path, idx_fd.get());
  if (idx_size < kIdxHeaderBytes) {
    throw Error(idx_path, "truncated: " + std::to_string(idx_size) + " bytes, shorter than the " +
                              std::to_string(kIdxHeaderBytes) + "-byte header");
  }
  const Mapping idx(idx_path, idx_fd.get(), 0, idx_size);
  const std::byte* bytes = idx.data();
  if (std::memcmp(bytes, kIdxMagic, sizeof kIdxMagic) != 0) {
    throw Error(idx_path, "not a Megatron index: wrong magic (expected MMIDIDX\\0\\0)");
  }
  uint64_t version = 0, sequence_count = 0, document_count = 0;
  uint8_t code = 0;
  std::memcpy(&version, bytes + 9, 8);
  std::memcpy(&code, bytes + 17, 1);
  std::memcpy(&sequence_count, bytes + 18, 8);
  std::memcpy(&document_count, bytes + 26, 8);
  if (version != kIdxVersion) throw Error(idx_path, "unsupported index version " + std::to_string(version));
  const std::optional<DType> dtype = dtype_from_megatron_code(code);
  if (!dtype) throw Error(idx_path, "unknown dtype code " + std::to_string(code));
  s.dtype = *dtype;
  if (!is_integer(s.dtype)) {
    throw Error(idx_path, "dtype " + std::string(dtype_name(s.dtype)) + " does not hold token ids");
  }
  const uint64_t body = idx_size - kIdxHeaderBytes;
  if (sequence_count > body / 12 || document_count > body / 8 ||
      sequence_count * 12 + document_count * 8 > body) {
    throw Error(idx_path, "truncated: " + std::to_string(idx_size) + " bytes cannot hold " +
                              std::to_string(sequence_count) + " sequences and " + std::to_string(document_count) +
                              " document indices");
  }
  s.sequence_lengths.resize(sequence_count);
  std::vector<int64_t> pointers(sequence_count);
  s.document_indices.resize(document_count);
  const std::byte* cursor = bytes + kIdxHeaderBytes;
  copy_bytes(s.sequence_lengths.data(), cursor, sequence_count * 4);
  cursor += sequence_count * 4;
  copy_bytes(pointers.data(), cursor, sequence_count * 8);
  cursor += sequence_count * 8;
  copy_bytes(s.document_indices.data(), cursor, document_count * 8);

  const int64_t item = static_cast<int64_t>(dtype_size(s.dtype));
  s.sequence_offsets.resize(sequence_count);
  for (size_t i = 0; i < pointers.size(); ++i) {
    if (pointers[i] % item != 0) {
      throw Error(idx_path, "sequence " + std::to_string(i) + " pointer " + std::to_string(pointers[i]) +
                                " is not a multiple of the " + std::to_string(item) + "-byte token size");
    }
    s.sequence_offsets[i] = pointers[i] / item;
  }

  FileDescriptor bin_fd(open_input_fd(bin_path));
  const uint64_t bin_size = file_size(bin_path, bin_fd.get());
  const int64_t storage_tokens = static_cast<int64_t>(bin_size / static_cast<uint64_t>(item));
  validate_index(idx_path + " with " + bin_path, s.sequence_lengths, s.sequence_offsets, s.document_indices,
                 storage_tokens);
  check_bin_size(idx_path, bin_path, bin_size, s.sequence_lengths, s.sequence_offsets, item);
  s.tokens = Mapping(bin_path, bin_fd.get(), 0, bin_size);
}

void TokenDataset::State::open_hdf5(const std::string& path) {
  State& s = *this;
  s.format = TokenDatasetFormat::hdf5;
  s.path = path;
  const io::Hdf5QuietErrors quiet;
  uint64_t tokens_offset = 0;
  uint64_t tokens_count = 0;
  {
    Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) throw Error(path, "cannot open as HDF5");
    const std::optional<std::string> format = read_string_attribute(file.get(), "mt_format");
    if (!format || *format != kHdf5Format) {
      throw Error(path, std::string("not an mt token dataset (root attribute mt_format is not \"") + kHdf5Format +
                            "\")");
    }
    const std::optional<int64_t> version = read_int_attribute(file.get(), "mt_format_version");
    if (!version || *version != kHdf5FormatVersion) {
      throw Error(path, "unsupported mt_format_version " + (version ? std::to_string(*version) : "(missing)") +
                            " (this build reads " + std::to_string(kHdf5FormatVersion) + ")");
    }
    const std::optional<int64_t> vocab_size = read_int_attribute(file.get(), "vocab_size");
    if (!vocab_size || *vocab_size < 1) throw Error(path, "attribute vocab_size is missing or not positive");
    s.vocab_size = *vocab_size;
    s.metadata.tokenizer = read_string_attribute(file.get(), "tokenizer").value_or("");
    s.metadata.tokenizer_hash = read_string_attribute(file.get(), "tokenizer_hash").value_or("");
    s.metadata.eod_id = read_int_attribute(file.get(), "eod_id").value_or(-1);

    s.sequence_lengths = read_index_dataset<int32_t>(path, file.get(), "sequence_lengths", H5T_NATIVE_INT32);
    s.sequence_offsets = read_index_dataset<int64_t>(path, file.get(), "sequence_offsets", H5T_NATIVE_INT64);
    s.document_indices = read_index_dataset<int64_t>(path, file.get(), "document_indices", H5T_NATIVE_INT64);
    if (s.sequence_offsets.size() != s.sequence_lengths.size()) {
      throw Error(path, "/sequence_offsets has " + std::to_string(s.sequence_offsets.size()) + " entries but " +
                            "/sequence_lengths has " + std::to_string(s.sequence_lengths.size()));
    }

    Hdf5Handle dataset(open_dataset(path, file.get(), "tokens"), H5Dclose);
    tokens_count = integer_1d_extent(path, dataset.get(), "tokens");
    Hdf5Handle type(H5Dget_type(dataset.get()), H5Tclose);
    s.dtype = dtype_from_hdf5(path, type.get());
    Hdf5Handle properties(H5Dget_create_plist(dataset.get()), H5Pclose);
    if (H5Pget_layout(properties.get()) != H5D_CONTIGUOUS || H5Pget_nfilters(properties.get()) != 0 ||
        H5Pget_external_count(properties.get()) != 0) {
      throw Error(path, "dataset /tokens is not stored contiguously inside the file, so it cannot be memory-mapped");
    }
    if (tokens_count > 0) {
      const haddr_t offset = H5Dget_offset(dataset.get());
      if (offset == HADDR_UNDEF) throw Error(path, "dataset /tokens has no storage in the file");
      tokens_offset = offset;
    }
  }
  validate_index(path, s.sequence_lengths, s.sequence_offsets, s.document_indices,
                 static_cast<int64_t>(tokens_count));
  if (tokens_count == 0) return;
  FileDescriptor fd(open_input_fd(path));
  const uint64_t size = file_size(path, fd.get());
  const uint64_t bytes = tokens_count * dtype_size(s.dtype);
  if (tokens_offset > size || bytes > size - tokens_offset) {
    throw Error(path, "truncated: dataset /tokens ends past the end of the file");
  }
  s.tokens = Mapping(path, fd.get(), tokens_offset, bytes);
}

TokenDataset::TokenDataset(std::unique_ptr<State> state) : state_(std::move(state)) {}
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;
TokenDataset::~TokenDataset() = default;

namespace {

// How two readings of one prefix differ (empty when they hold the same dataset): the sequence
// and document structure whole, and the tokens of up to 64 sequences spread over the dataset
// (the first and the last among them), each up to 4096 tokens.
std::string dataset_difference(const TokenDataset& a, const TokenDataset& b) {
  if (a.sequence_count() != b.sequence_count() || a.document_count() != b.document_count() ||
      a.token_count() != b.token_count()) {
    auto shape = [](const TokenDataset& d) {
      return std::to_string(d.document_count()) + " documents, " + std::to_string(d.sequence_count()) +
             " sequences, " + std::to_string(d.token_count()) + " tokens";
    };
    return shape(a) + " against " + shape(b);
  }
  const auto lengths_a = a.sequence_lengths(), lengths_b = b.sequence_lengths();
  if (!std::equal(lengths_a.begin(), lengths_a.end(), lengths_b.begin())) return "the sequence lengths differ";
  const auto documents_a = a.document_indices(), documents_b = b.document_indices();
  if (!std::equal(documents_a.begin(), documents_a.end(), documents_b.begin())) return "the document boundaries differ";
  const int64_t count = a.sequence_count();
  const int64_t samples = std::min<int64_t>(count, 64);
  for (int64_t k = 0; k < samples; ++k) {
    const int64_t sequence = samples == 1 ? 0 : k * (count - 1) / (samples - 1);
    const int64_t length = std::min<int64_t>(a.sequence_lengths()[static_cast<size_t>(sequence)], 4096);
    if (a.get(sequence, 0, length) != b.get(sequence, 0, length)) {
      return "the tokens of sequence " + std::to_string(sequence) + " differ";
    }
  }
  return {};
}

}  // namespace

TokenDataset TokenDataset::open(const std::string& path_prefix) {
  std::string prefix = path_prefix;
  // A path naming X.h5, X.bin or X.idx itself (and not a prefix of such files) picks that format.
  std::optional<TokenDatasetFormat> named;
  const bool is_prefix = path_kind(prefix + ".h5") != PathKind::missing ||
                         path_kind(prefix + ".bin") != PathKind::missing ||
                         path_kind(prefix + ".idx") != PathKind::missing;
  const PathKind kind = is_prefix ? PathKind::missing : path_kind(prefix);
  if (kind == PathKind::directory) {
    throw Error(path_prefix, "is a directory; a token dataset is named by its prefix X (of X.h5, or X.bin and X.idx)");
  }
  if (kind == PathKind::file) {
    for (const char* extension : {".h5", ".bin", ".idx"}) {
      if (ends_with(prefix, extension)) {
        prefix.resize(prefix.size() - std::strlen(extension));
        named = std::strcmp(extension, ".h5") == 0 ? TokenDatasetFormat::hdf5 : TokenDatasetFormat::megatron;
        break;
      }
    }
  }
  const std::string h5 = prefix + ".h5", bin = prefix + ".bin", idx = prefix + ".idx";
  for (const std::string* file : {&h5, &bin, &idx}) {
    if (path_kind(*file) == PathKind::directory) throw Error(*file, "is a directory, expected a file");
  }
  const bool has_h5 = is_regular_file(h5), has_bin = is_regular_file(bin), has_idx = is_regular_file(idx);
  auto open_state = [&](TokenDatasetFormat format) {
    auto state = std::make_unique<State>();
    if (format == TokenDatasetFormat::hdf5) {
      state->open_hdf5(h5);
    } else {
      state->open_megatron(bin, idx);
    }
    for (const int32_t length : state->sequence_lengths) state->token_count += length;
    return TokenDataset(std::move(state));
  };
  if (has_h5 && named != TokenDatasetFormat::megatron) {
    TokenDataset hdf5 = open_state(TokenDatasetFormat::hdf5);
    if (named || !has_bin || !has_idx) return hdf5;
    // Both kinds under one prefix: fine when they are one dataset (--output-format both), refused
    // when they are not, rather than silently reading one of them.
    const std::string difference = dataset_difference(hdf5, open_state(TokenDatasetFormat::megatron));
    if (difference.empty()) return hdf5;
    throw Error(path_prefix, "ambiguous: " + h5 + " and " + bin + " + " + idx + " hold different token datasets (" +
                                 difference + "); remove the stale one, or name the one to read (" + h5 + " or " + bin +
                                 ")");
  }
  if (has_bin && has_idx) return open_state(TokenDatasetFormat::megatron);
  if (has_bin || has_idx) {
    throw Error(path_prefix, (has_bin ? bin : idx) + " exists but " + (has_bin ? idx : bin) + " does not");
  }
  throw Error(path_prefix, "no token dataset: neither " + h5 + " nor " + bin + " + " + idx + " exists");
}

TokenDatasetFormat TokenDataset::format() const { return state_->format; }
const std::string& TokenDataset::path() const { return state_->path; }
int64_t TokenDataset::sequence_count() const { return static_cast<int64_t>(state_->sequence_lengths.size()); }
int64_t TokenDataset::document_count() const { return static_cast<int64_t>(state_->document_indices.size()) - 1; }
int64_t TokenDataset::token_count() const { return state_->token_count; }
DType TokenDataset::dtype() const { return state_->dtype; }
int64_t TokenDataset::vocab_size() const { return state_->vocab_size; }
const TokenDatasetMetadata& TokenDataset::metadata() const { return state_->metadata; }
std::span<const int32_t> TokenDataset::sequence_lengths() const { return state_->sequence_lengths; }
std::span<const int64_t> TokenDataset::sequence_offsets() const { return state_->sequence_offsets; }
std::span<const int64_t> TokenDataset::document_indices() const { return state_->document_indices; }
const std::byte* TokenDataset::token_storage() const { return state_->tokens.data(); }

std::vector<int32_t> TokenDataset::get(int64_t sequence_index, int64_t offset, std::optional<int64_t> length) const {
  if (sequence_index < 0 || sequence_index >= sequence_count()) {
    throw Error(state_->path, "sequence " + std::to_string(sequence_index) + " is out of range [0, " +
                                  std::to_string(sequence_count()) + ")");
  }
  const int64_t rest = state_->sequence_lengths[static_cast<size_t>(sequence_index)] - offset;
  const int64_t count = length.value_or(rest);
  if (count < 0) {
    throw Error(state_->path, "cannot read " + std::to_string(count) + " tokens at offset " + std::to_string(offset) +
                                  " of sequence " + std::to_string(sequence_index));
  }
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  read(sequence_index, offset, tokens);
  return tokens;
}

void TokenDataset::read(int64_t sequence_index, int64_t offset, std::span<int32_t> out) const {
  const State& s = *state_;
  if (sequence_index < 0 || sequence_index >= sequence_count()) {
    throw Error(s.path, "sequence " + std::to_string(sequence_index) + " is out of range [0, " +
                            std::to_string(sequence_count()) + ")");
  }
  const int64_t length = s.sequence_lengths[static_cast<size_t>(sequence_index)];
  const int64_t count = static_cast<int64_t>(out.size());
  if (offset < 0 || offset > length || count > length - offset) {
    throw Error(s.path, "tokens [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                            ") are outside sequence " + std::to_string(sequence_index) + " of length " +
                            std::to_string(length));
  }
  if (count == 0) return;
  const size_t item = dtype_size(s.dtype);
  const std::byte* source =
      s.tokens.data() + static_cast<size_t>(s.sequence_offsets[static_cast<size_t>(sequence_index)] + offset) * item;
  const auto convert = [&]<typename T>(T) {
    for (size_t i = 0; i < out.size(); ++i) {
      T value;
      std::memcpy(&value, source + i * sizeof(T), sizeof(T));
      if constexpr (sizeof(T) == 8) {
        if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
          throw Error(s.path, "token " + std::to_string(value) + " in sequence " + std::to_string(sequence_index) +
                                  " does not fit int32");
        }
      }
      out[i] = static_cast<int32_t>(value);
    }
  };
  switch (s.dtype) {
    case DType::i32: std::memcpy(out.data(), source, out.size() * sizeof(int32_t)); break;
    case DType::u16: convert(uint16_t{}); break;
    case DType::u8: convert(uint8_t{}); break;
    case DType::i8: convert(int8_t{}); break;
    case DType::i16: convert(int16_t{}); break;
    case DType::i64: convert(int64_t{}); break;
    case DType::f32:
    case DType::bf16:
    case DType::f16:
    case DType::f64: throw Error(s.path, "dtype does not hold token ids");
  }
}

std::vector<std::string> merge_token_datasets(const std::vector<std::string>& inputs, const std::string& output_prefix,
                                              TokenDatasetFormat format, int64_t vocab_size) {
  if (inputs.empty()) throw UsageError("--input", "no dataset to merge");
  std::vector<TokenDataset> datasets;
  std::optional<TokenDatasetMetadata> metadata;
  int64_t known_vocab = 0;
  std::string metadata_source;
  for (const std::string& input : inputs) {
    TokenDataset dataset = TokenDataset::open(input);
    if (dataset.vocab_size() > 0) {
      const TokenDatasetMetadata& m = dataset.metadata();
      if (!metadata) {
        metadata = m;
        known_vocab = dataset.vocab_size();
        metadata_source = dataset.path();
      } else if (m.tokenizer != metadata->tokenizer || m.tokenizer_hash != metadata->tokenizer_hash ||
                 m.eod_id != metadata->eod_id || dataset.vocab_size() != known_vocab) {
        throw Error(dataset.path(), "made with another tokenizer than " + metadata_source + " (" + m.tokenizer + " " +
                                        m.tokenizer_hash + ", vocab " + std::to_string(dataset.vocab_size()) + ")");
      }
    }
    datasets.push_back(std::move(dataset));
  }
  if (vocab_size > 0 && known_vocab > 0 && vocab_size != known_vocab) {
    throw UsageError("--vocab-size", "the inputs record vocab size " + std::to_string(known_vocab));
  }
  if (known_vocab == 0 && vocab_size <= 0) {
    throw UsageError("--vocab-size", "is required: .bin/.idx inputs do not record their vocabulary size");
  }
  TokenDatasetWriter writer = TokenDatasetWriter::create(output_prefix, format, known_vocab > 0 ? known_vocab : vocab_size,
                                                         metadata.value_or(TokenDatasetMetadata{}));
  for (const TokenDataset& dataset : datasets) writer.append_dataset(dataset);
  writer.finish();
  return writer.final_paths();
}

}  // namespace mt::data

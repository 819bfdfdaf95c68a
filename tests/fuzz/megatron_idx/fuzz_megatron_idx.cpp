// libFuzzer target: Megatron's .idx/.bin token dataset reader (data/token_dataset.h). The input is
// a 4-byte little-endian length L, then L bytes of .idx, then the .bin; both are written beside each
// other and opened by their prefix. A bad pair is an mt::Error; a pair that opens gives every
// sequence's tokens through get() within the storage, and its structure is consistent.
// Tested by the fuzz smoke runs and the replay tests of tests/fuzz/CMakeLists.txt.
#include <string>

#include "data/token_dataset.h"
#include "fuzz_support.h"

namespace {

void read_everything(const mt::data::TokenDataset& dataset) {
  const auto lengths = dataset.sequence_lengths();
  const auto offsets = dataset.sequence_offsets();
  const auto documents = dataset.document_indices();
  FUZZ_CHECK(static_cast<int64_t>(lengths.size()) == dataset.sequence_count());
  FUZZ_CHECK(offsets.size() == lengths.size());
  FUZZ_CHECK(!documents.empty() && documents.front() == 0 && documents.back() == dataset.sequence_count());
  // Sequences may leave gaps in the .bin, as Megatron's reader allows (its pointers are free), so
  // they are checked against each other, not against token_count() (the sum of the lengths);
  // get() copies every token, so a read past the storage is an AddressSanitizer report.
  int64_t tokens = 0;
  for (int64_t s = 0; s < dataset.sequence_count(); ++s) {
    FUZZ_CHECK(lengths[s] >= 0 && offsets[s] >= 0);
    FUZZ_CHECK(s == 0 || offsets[s] >= offsets[s - 1] + lengths[s - 1]);
    const auto sequence = dataset.get(s);
    FUZZ_CHECK(static_cast<int64_t>(sequence.size()) == lengths[s]);
    tokens += static_cast<int64_t>(sequence.size());
  }
  FUZZ_CHECK(tokens == dataset.token_count());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const size_t index_bytes = std::min<size_t>(size - 4, data[0] | data[1] << 8 | data[2] << 16 | uint32_t{data[3]} << 24);
  const std::string_view input = mt::fuzz::as_text(data + 4, size - 4);
  const std::string index_path = mt::fuzz::write_scratch_file(input.substr(0, index_bytes), ".idx");
  mt::fuzz::write_scratch_file(input.substr(index_bytes), ".bin");
  const std::string prefix = index_path.substr(0, index_path.size() - 4);
  mt::fuzz::refusals_only([&] { read_everything(mt::data::TokenDataset::open(prefix)); });
  return 0;
}

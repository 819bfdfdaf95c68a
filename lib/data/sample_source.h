// Where training samples come from: a sample is seq_length+1 consecutive tokens (inputs and the
// shifted labels) addressed by its global sample index, so any rank can fetch exactly its
// samples for a given consumed-samples count (resume and data parallelism depend on it).
// MockData draws tokens from Philox (the same formula as tests/golden/philox.py); ByteData is the
// UTF-8 bytes of a text file as tokens 0..255 (the demo's data until mt-tokenize/mt-shard land).
// Tested in tests/unit/train/test_data.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt::data {

enum class Split { train, valid };

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // tokens: seq_length + 1 entries for global sample `index` of `split`.
  virtual void sample(Split split, int64_t index, int32_t* tokens) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string describe() const = 0;
};

// token(s, t) = philox_block(seed, stream_id("mock-data"), s*(seq+1) + t)[0] % vocab. Validation
// samples are drawn from indices offset by 2^40 so they never repeat training samples.
std::unique_ptr<SampleSource> make_mock_data(int64_t vocab_size, int seq_length, uint64_t seed);

// The file's bytes as one token stream; training samples are consecutive windows over the first
// 99% of the bytes (wrapping around for further epochs), validation windows over the last 1%.
// Throws mt::Error when the file cannot be read or is too short for one sample per split.
std::unique_ptr<SampleSource> make_byte_data(const std::string& path, int seq_length);

}  // namespace mt::data

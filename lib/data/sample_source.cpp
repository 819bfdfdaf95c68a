// Sample sources (see sample_source.h).
#include "data/sample_source.h"

#include "kernels/common/philox.h"
#include "core/error.h"
#include "core/input_file.h"

namespace mt::data {
namespace {

class MockData : public SampleSource {
 public:
  MockData(int64_t vocab, int seq, uint64_t seed) : vocab_(vocab), seq_(seq), seed_(seed) {}
  void sample(Split split, int64_t index, int32_t* tokens) const override {
    const int64_t global = split == Split::train   ? index
                           : split == Split::valid ? index + (int64_t{1} << 40)
                                                   : index + (int64_t{1} << 41);
    const uint64_t stream = kernels::stream_id("mock-data");
    for (int t = 0; t <= seq_; ++t) {
      const uint64_t block = static_cast<uint64_t>(global) * static_cast<uint64_t>(seq_ + 1) + static_cast<uint64_t>(t);
      tokens[t] = static_cast<int32_t>(kernels::philox_block(seed_, stream, block).v[0] % static_cast<uint64_t>(vocab_));
    }
  }
  int64_t vocab_size() const override { return vocab_; }
  std::string describe() const override { return "mock data (Philox tokens, vocabulary " + std::to_string(vocab_) + ")"; }

 private:
  int64_t vocab_;
  int seq_;
  uint64_t seed_;
};

class ByteData : public SampleSource {
 public:
  ByteData(std::vector<unsigned char> bytes, int seq, std::string path)
      : bytes_(std::move(bytes)), seq_(seq), path_(std::move(path)) {
    const int64_t total = static_cast<int64_t>(bytes_.size());
    valid_begin_ = total - total / 100;
    if (valid_begin_ < seq_ + 1 || total - valid_begin_ < seq_ + 1) {
      throw Error(path_, "too short: " + std::to_string(total) + " bytes give no " + std::to_string(seq_ + 1) +
                             "-byte sample in both the training (99%) and validation (1%) parts");
    }
  }
  void sample(Split split, int64_t index, int32_t* tokens) const override {
    const int64_t begin = split == Split::train ? 0 : valid_begin_;
    const int64_t end = split == Split::train ? valid_begin_ : static_cast<int64_t>(bytes_.size());
    const int64_t windows = (end - begin - 1) / seq_;  // windows share their boundary token
    const int64_t start = begin + (index % windows) * seq_;
    for (int t = 0; t <= seq_; ++t) tokens[t] = bytes_[static_cast<size_t>(start + t)];
  }
  int64_t vocab_size() const override { return 256; }
  std::string describe() const override {
    return "bytes of " + path_ + " (" + std::to_string(bytes_.size()) + " tokens, vocabulary 256)";
  }

 private:
  std::vector<unsigned char> bytes_;
  int seq_;
  std::string path_;
  int64_t valid_begin_ = 0;
};

}  // namespace

void SampleSource::rows(Split split, int64_t index, int seq_length, const SampleRows& out) const {
  thread_local std::vector<int32_t> text;
  text.resize(static_cast<size_t>(seq_length) + 1);  // (seq + 1,)
  sample(split, index, text.data());
  for (int t = 0; t < seq_length; ++t) {
    out.tokens[t] = text[static_cast<size_t>(t)];
    out.labels[t] = text[static_cast<size_t>(t) + 1];
    out.loss_mask[t] = 1.0f;
    out.positions[t] = t;
    out.doc_start[t] = 0;
  }
}

std::unique_ptr<SampleSource> make_mock_data(int64_t vocab_size, int seq_length, uint64_t seed) {
  return std::make_unique<MockData>(vocab_size, seq_length, seed);
}

std::unique_ptr<SampleSource> make_byte_data(const std::string& path, int seq_length) {
  const std::string text = read_input_file(path, "--byte-data");
  return std::make_unique<ByteData>(std::vector<unsigned char>(text.begin(), text.end()), seq_length, path);
}

}  // namespace mt::data

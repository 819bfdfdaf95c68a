// Where training samples come from: a sample is seq_length+1 consecutive tokens (inputs and the
// shifted labels) addressed by its global sample index, so any rank can fetch exactly its
// samples for a given consumed-samples count (resume and data parallelism depend on it).
// MockData draws tokens from Philox (the same formula as tests/golden/philox.py); ByteData is the
// UTF-8 bytes of a text file as tokens 0..255; GptSampleSource (data/gpt_dataset.h) reads token
// datasets through an mt-shard sample index and adds Megatron's loss mask, position ids and
// per-document attention. Tested in tests/unit/train/test_trainer.cpp (mock, bytes) and
// tests/unit/data/test_gpt_dataset.cpp (rows()).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/megatron_indices.h"  // Split: train, valid, test

namespace mt::data {

// One sample as the model takes it: seq_length entries each (MicroBatch rows of one sample).
struct SampleRows {
  int32_t* tokens = nullptr;
  int32_t* labels = nullptr;
  float* loss_mask = nullptr;   // 1 counts in the loss, 0 does not
  int32_t* positions = nullptr;  // position ids
  int32_t* doc_start = nullptr;  // first position of each token's document (attention window)
  // BERT sources (SampleSource::bert()) only, else null: token types (seq_length, 0 / 1), and one
  // value each for the sample: its valid tokens (padding after them) and the sentence-order
  // target (is_random, 0 / 1).
  int32_t* token_types = nullptr;
  int32_t* key_length = nullptr;
  int32_t* sentence_order = nullptr;
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // tokens: seq_length + 1 entries for global sample `index` of `split`.
  virtual void sample(Split split, int64_t index, int32_t* tokens) const = 0;
  // Inputs, labels, loss mask, positions and document starts of sample `index` (seq_length rows).
  // The default: the tokens of sample() shifted by one, every token counted, positions 0.., the
  // whole sample one document.
  virtual void rows(Split split, int64_t index, int seq_length, const SampleRows& out) const;
  // Samples a split holds (the sampler's total); -1 when unbounded, 0 when the split is absent.
  virtual int64_t split_size(Split) const { return -1; }
  // True when rows() gives documents narrower than the sample (per-document attention).
  virtual bool document_attention() const { return false; }
  // True for BERT's masked samples (data/bert_sample_source.h): rows() also fills SampleRows'
  // token types, key length and sentence-order target.
  virtual bool bert() const { return false; }
  virtual int64_t vocab_size() const = 0;
  virtual std::string describe() const = 0;
};

// token(s, t) = philox_block(seed, stream_id("mock-data"), s*(seq+1) + t)[0] % vocab. Validation
// and test samples are drawn from indices offset by 2^40 and 2^41 so they never repeat training
// samples.
std::unique_ptr<SampleSource> make_mock_data(int64_t vocab_size, int seq_length, uint64_t seed);

// The file's bytes as one token stream; training samples are consecutive windows over the first
// 99% of the bytes (wrapping around for further epochs), validation (and test) windows over the
// last 1%.
// Throws mt::Error when the file cannot be read or is too short for one sample per split.
std::unique_ptr<SampleSource> make_byte_data(const std::string& path, int seq_length);

}  // namespace mt::data

// Random token samples for the model tests that run a stage by hand (tests/unit/model/test_stage.cpp,
// test_mla.cpp, test_mtp.cpp): tokens and labels uniform over the vocabulary, positions counting
// within each sequence, every seventh row masked out, row ids counting from 0.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "model/config.h"
#include "model/stage.h"

namespace mt::testing {

struct Samples {
  std::vector<int32_t> tokens, labels, positions;  // (samples * T)
  std::vector<float> mask;                         // (samples * T)
  std::vector<int64_t> row_ids;                    // (samples * T)

  // Micro-batch `index` of `batch` sequences of `seq` tokens.
  model::MicroBatch micro_batch(int index, int batch, int seq) const {
    const size_t row0 = static_cast<size_t>(index) * batch * seq;
    return model::MicroBatch{batch, seq, tokens.data() + row0, labels.data() + row0, mask.data() + row0,
                             positions.data() + row0, nullptr, row_ids.data() + row0};
  }
};

inline Samples make_samples(const model::ModelConfig& c, int samples, uint32_t seed) {
  std::mt19937 rng(seed);
  Samples s;
  for (int r = 0; r < samples * c.seq_length; ++r) {
    s.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    s.labels.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    s.positions.push_back(r % c.seq_length);
    s.mask.push_back(r % 7 == 3 ? 0.0f : 1.0f);
    s.row_ids.push_back(r);
  }
  return s;
}

}  // namespace mt::testing

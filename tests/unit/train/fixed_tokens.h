// A data::SampleSource over fixed token rows (a golden's committed ones), shared by the golden
// suites test_golden.cpp and the HF logits goldens (hf_logits_golden.h): sample i is row i modulo the rows, its
// label position (the row's last token) 0, as those suites never read labels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/sample_source.h"

namespace mt::testing {

class FixedTokens : public data::SampleSource {
 public:
  FixedTokens(std::vector<int32_t> tokens, int seq_length, int64_t vocab_size)
      : tokens_(std::move(tokens)), seq_length_(seq_length), vocab_size_(vocab_size) {}
  void sample(data::Split, int64_t index, int32_t* tokens) const override {
    const int64_t rows = static_cast<int64_t>(tokens_.size()) / seq_length_;
    const int32_t* row = tokens_.data() + (index % rows) * seq_length_;
    std::copy(row, row + seq_length_, tokens);
    tokens[seq_length_] = 0;
  }
  int64_t vocab_size() const override { return vocab_size_; }
  std::string describe() const override { return "fixed tokens"; }

 private:
  std::vector<int32_t> tokens_;
  int seq_length_;
  int64_t vocab_size_;
};

}  // namespace mt::testing

// The smallest and largest token id a token dataset holds, read through its memory map (all
// threads), for datasets that record no vocabulary (Megatron's .bin/.idx): mt-train checks them
// against the model's vocabulary before training instead of failing at the first bad sample.
// Tested in tests/unit/data/test_token_range.cpp and tests/tools/bad-input.bats (issue 11 case 11).
#pragma once

#include <cstdint>

#include "data/token_dataset.h"

namespace mt::data {

struct TokenRange {
  int64_t min = 0, max = -1;  // max < min: no tokens
  bool empty() const { return max < min; }
};

// Throws mt::Error (naming the file) for a stored value that does not fit int32.
TokenRange token_range(const TokenDataset& dataset);

}  // namespace mt::data

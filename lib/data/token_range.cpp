// Token id range of a dataset (see token_range.h).
#include "data/token_range.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <vector>

namespace mt::data {

TokenRange token_range(const TokenDataset& dataset) {
  const auto lengths = dataset.sequence_lengths();
  const int64_t sequences = static_cast<int64_t>(lengths.size());
  constexpr int64_t kBlock = int64_t{1} << 16;
  int64_t low = std::numeric_limits<int64_t>::max(), high = std::numeric_limits<int64_t>::min();
  std::exception_ptr failure;
#pragma omp parallel
  {
    std::vector<int32_t> block(static_cast<size_t>(kBlock));
    int64_t local_low = std::numeric_limits<int64_t>::max(), local_high = std::numeric_limits<int64_t>::min();
#pragma omp for schedule(dynamic, 256)
    for (int64_t s = 0; s < sequences; ++s) {
      try {
        for (int64_t offset = 0; offset < lengths[static_cast<size_t>(s)]; offset += kBlock) {
          const int64_t count = std::min(kBlock, lengths[static_cast<size_t>(s)] - offset);
          dataset.read(s, offset, std::span<int32_t>(block.data(), static_cast<size_t>(count)));
          const auto [smallest, largest] = std::minmax_element(block.begin(), block.begin() + count);
          local_low = std::min<int64_t>(local_low, *smallest);
          local_high = std::max<int64_t>(local_high, *largest);
        }
      } catch (...) {
#pragma omp critical(token_range_failure)
        if (!failure) failure = std::current_exception();
      }
    }
#pragma omp critical(token_range_merge)
    {
      low = std::min(low, local_low);
      high = std::max(high, local_high);
    }
  }
  if (failure) std::rethrow_exception(failure);
  if (high < low) return TokenRange{};
  return TokenRange{low, high};
}

}  // namespace mt::data

// Token id ranges of token datasets (data/token_range.h), read through the memory map, for both
// formats and for an empty dataset (issue 11 case 11).
#include <gtest/gtest.h>

#include <vector>

#include "../temp_dir.h"
#include "data/token_dataset.h"
#include "data/token_range.h"

using namespace mt::data;

TEST(TokenRange, Issue11Case11SmallestAndLargestIdOfEitherFormat) {
  mt::testing::TempDir dir;
  for (TokenDatasetFormat format : {TokenDatasetFormat::hdf5, TokenDatasetFormat::megatron}) {
    const std::string prefix = dir.file(format == TokenDatasetFormat::hdf5 ? "h5" : "bin");
    TokenDatasetWriter writer = TokenDatasetWriter::create(prefix, format, 70000);
    std::vector<int32_t> long_sequence(200000, 5);  // longer than one read block
    long_sequence[150000] = 69999;
    writer.add_sequence(long_sequence);
    writer.end_document();
    writer.add_sequence(std::vector<int32_t>{3, 4});
    writer.add_sequence({});
    writer.end_document();
    writer.finish();
    const TokenRange range = token_range(TokenDataset::open(prefix));
    EXPECT_EQ(range.min, 3);
    EXPECT_EQ(range.max, 69999);
    EXPECT_FALSE(range.empty());
  }
  TokenDatasetWriter empty = TokenDatasetWriter::create(dir.file("empty"), TokenDatasetFormat::megatron, 10);
  empty.end_document();
  empty.finish();
  EXPECT_TRUE(token_range(TokenDataset::open(dir.file("empty"))).empty());
}

// ParallelConfig JSON (parallel/parallel_config.h): a round trip keeps every degree; bad values
// are usage errors naming the key.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/parallel_config.h"

using namespace mt::parallel;

TEST(ParallelConfig, JsonRoundTrip) {
  ParallelConfig c;
  c.tensor_model_parallel_size = 4;
  c.pipeline_model_parallel_size = 2;
  c.data_parallel_size = 3;
  c.context_parallel_size = 2;
  c.expert_model_parallel_size = 8;
  c.sequence_parallel = true;
  const ParallelConfig back = parallel_config_from_json(to_json(c));
  EXPECT_EQ(to_json(back), to_json(c));
  EXPECT_EQ(back.tensor_model_parallel_size, 4);
  EXPECT_TRUE(back.sequence_parallel);
  EXPECT_EQ(to_json(c)["pipeline_model_parallel_size"], 2);
}

TEST(ParallelConfig, JsonRefusesBadDegreesAndUnknownKeys) {
  EXPECT_THROW(parallel_config_from_json({{"tensor_model_parallel_size", 0}}), mt::UsageError);
  EXPECT_THROW(parallel_config_from_json({{"tensor_model_parallel_size", "2"}}), mt::UsageError);
  EXPECT_THROW(parallel_config_from_json({{"tensor_parallel", 2}}), mt::UsageError);
  EXPECT_EQ(parallel_config_from_json(nlohmann::json::object()).data_parallel_size, 1);
}

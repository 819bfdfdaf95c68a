// TrainConfig JSON (train/trainer.h, train_config.cpp): a round trip keeps every field; unknown
// keys, unknown names and invalid values are usage errors naming the key.
#include <gtest/gtest.h>

#include "core/error.h"
#include "train/trainer.h"

using namespace mt;

TEST(TrainConfig, JsonRoundTrip) {
  train::TrainConfig c;
  c.micro_batch_size = 2;
  c.global_batch_size = 8;
  c.train_iters = 100;
  c.lr = 3e-4;
  c.min_lr = 3e-5;
  c.lr_decay_style = optim::LrDecayStyle::cosine;
  c.lr_warmup_fraction = 0.1;
  c.adam.weight_decay = 0.1;
  c.adam.beta2 = 0.95;
  c.precision = Precision::fp16;
  c.loss_scale = 1024;
  c.check_for_nan_in_loss_and_grad = false;
  c.log_throughput = true;
  c.seed = 4294967295u;
  c.recompute.granularity = model::RecomputeGranularity::full;
  c.recompute.method = model::RecomputeMethod::block;
  c.recompute.num_layers = 3;
  c.flops_convention = perf::FlopsConvention::megatron;
  const train::TrainConfig back = train::train_config_from_json(train::to_json(c));
  EXPECT_EQ(train::to_json(back), train::to_json(c));
  EXPECT_EQ(back.seed, 4294967295u);
  EXPECT_EQ(back.recompute.method, model::RecomputeMethod::block);
  EXPECT_EQ(back.precision, Precision::fp16);
  EXPECT_DOUBLE_EQ(back.lr_warmup_fraction, 0.1);

  train::TrainConfig plain;  // unset fraction and dynamic scale stay unset
  plain.train_iters = 1;
  const nlohmann::ordered_json json = train::to_json(plain);
  EXPECT_TRUE(json["lr_warmup_fraction"].is_null());
  EXPECT_TRUE(json["recompute_granularity"].is_null());
  const train::TrainConfig plain_back = train::train_config_from_json(json);
  EXPECT_LT(plain_back.lr_warmup_fraction, 0);
  EXPECT_EQ(plain_back.recompute.granularity, model::RecomputeGranularity::none);
  EXPECT_TRUE(plain_back.check_for_nan_in_loss_and_grad);
}

TEST(TrainConfig, JsonNamesEveryFlopsConvention) {
  train::TrainConfig c;
  c.train_iters = 1;
  for (perf::FlopsConvention convention : perf::flops_conventions()) {
    c.flops_convention = convention;
    EXPECT_EQ(train::to_json(c)["flops_convention"], perf::convention_name(convention));
    EXPECT_EQ(train::train_config_from_json(train::to_json(c)).flops_convention, convention);
  }
}

TEST(TrainConfig, JsonRefusesUnknownKeysNamesAndInvalidValues) {
  train::TrainConfig c;
  c.train_iters = 1;
  nlohmann::json json = train::to_json(c);
  json["learning_rate"] = 1;
  EXPECT_THROW(train::train_config_from_json(json), UsageError);
  json = train::to_json(c);
  json["lr_decay_style"] = "WSD";
  EXPECT_THROW(train::train_config_from_json(json), UsageError);
  json = train::to_json(c);
  json["seed"] = -1;
  EXPECT_THROW(train::train_config_from_json(json), UsageError);
  json = train::to_json(c);
  json["lr"] = -1;
  EXPECT_THROW(train::train_config_from_json(json), UsageError);
  json = train::to_json(c);
  json["train_iters"] = 0;
  EXPECT_THROW(train::train_config_from_json(json), UsageError);
}

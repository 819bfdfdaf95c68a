// A trainer's checkpoints (train/checkpointing.h): N steps straight equal k steps, save, load into a
// fresh trainer, N - k more (loss, grad norm and loss scale bit for bit, fp32, bf16 and fp16 with
// a dynamic scaler that grows and overflows inside the run); --finetune and --no-load-optim load
// what they say; another model, a parameters-only file and a file without optimizer state are
// refused naming the field.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "../error_text.h"
#include "../temp_dir.h"
#include "../tiny_models.h"
#include "io/hdf5_attributes.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "core/error.h"
#include "data/sample_source.h"
#include "train/checkpointing.h"
#include "train/trainer.h"

using namespace mt;

namespace {

model::ModelConfig tiny() {
  model::ModelConfig c = mt::testing::tiny_llama();
  c.hidden_dropout = 0.1f;  // dropout masks are keyed by iteration: a resumed run must draw the same
  return c;
}

train::TrainConfig config(int iters, Precision precision) {
  train::TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 4;
  t.train_iters = iters;
  t.lr = 1e-2;
  t.lr_decay_style = optim::LrDecayStyle::cosine;
  t.lr_warmup_iters = 2;
  t.eval_iters = 1;
  t.eval_interval = 3;
  t.precision = precision;
  // A dynamic scale that grows every 2 clean steps and overflows when it has: its trackers matter.
  t.initial_loss_scale = 1e6;
  t.loss_scale_window = 2;
  t.hysteresis = 1;
  return t;
}

struct Trace {
  std::vector<double> loss, grad_norm, scale;
  std::vector<bool> skipped;
};

void run_steps(train::Trainer& trainer, int steps, Trace& trace) {
  for (int i = 0; i < steps; ++i) {
    const train::StepStats s = trainer.train_step();
    trace.loss.push_back(s.lm_loss);
    trace.grad_norm.push_back(s.grad_norm);
    trace.scale.push_back(s.loss_scale);
    trace.skipped.push_back(s.skipped);
    if (trainer.iteration() % 3 == 0) trace.loss.push_back(trainer.evaluate().lm_loss);
  }
}

// The values' bits: NaN grad norms of skipped fp16 steps compare equal too.
std::vector<uint64_t> bits(const std::vector<double>& values) {
  std::vector<uint64_t> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * sizeof(double));
  return out;
}

}  // namespace

TEST(Checkpointing, AResumedRunEqualsTheStraightRunBitForBit) {
  mt::testing::TempDir dir("mt_test_resume");
  const model::ModelConfig c = tiny();
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  for (Precision precision : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    const std::string name = precision_name(precision);
    Trace straight;
    {
      train::Trainer trainer(c, config(8, precision), *data, backend::cpu_ops());
      run_steps(trainer, 8, straight);
    }
    if (precision == Precision::fp16) {
      ASSERT_NE(std::find(straight.skipped.begin() + 4, straight.skipped.end(), true), straight.skipped.end())
          << "the fp16 case should overflow after the cut";
      ASSERT_NE(std::find(straight.skipped.begin(), straight.skipped.end(), false), straight.skipped.end());
    }
    Trace resumed;
    const std::string directory = dir.file(name);
    {
      train::Trainer first(c, config(8, precision), *data, backend::cpu_ops());
      run_steps(first, 4, resumed);
      train::save_checkpoint(directory, first, {});
    }
    train::Trainer second(c, config(8, precision), *data, backend::cpu_ops());
    const io::CheckpointReader checkpoint(io::checkpoint_path(directory, *io::read_tracker(directory)));
    train::load_checkpoint(checkpoint, second, {});
    EXPECT_EQ(second.iteration(), 4);
    EXPECT_EQ(second.consumed_samples(), 16);
    run_steps(second, 4, resumed);
    EXPECT_EQ(bits(resumed.loss), bits(straight.loss)) << name;
    EXPECT_EQ(bits(resumed.grad_norm), bits(straight.grad_norm)) << name;
    EXPECT_EQ(resumed.scale, straight.scale) << name;
  }
}

TEST(Checkpointing, FinetuneAndNoLoadOptimLoadWhatTheySay) {
  mt::testing::TempDir dir("mt_test_finetune");
  const model::ModelConfig c = tiny();
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  train::Trainer source(c, config(6, Precision::fp32), *data, backend::cpu_ops());
  for (int i = 0; i < 3; ++i) source.train_step();
  train::save_checkpoint(dir.path().string(), source, {});
  const io::CheckpointReader checkpoint(io::checkpoint_path(dir.path().string(), 3));
  const std::vector<float> params(source.parameters(), source.parameters() + source.layout().total_elements);

  train::Trainer finetuned(c, config(6, Precision::fp32), *data, backend::cpu_ops());
  train::LoadOptions finetune;
  finetune.finetune = true;
  train::load_checkpoint(checkpoint, finetuned, finetune);
  EXPECT_EQ(finetuned.iteration(), 0);
  EXPECT_EQ(finetuned.consumed_samples(), 0);
  EXPECT_EQ(finetuned.optimizer().steps(), 0);
  EXPECT_EQ(std::vector<float>(finetuned.parameters(), finetuned.parameters() + params.size()), params);

  train::Trainer fresh_optimizer(c, config(6, Precision::fp32), *data, backend::cpu_ops());
  train::LoadOptions no_optim;
  no_optim.optimizer = false;
  train::load_checkpoint(checkpoint, fresh_optimizer, no_optim);
  EXPECT_EQ(fresh_optimizer.iteration(), 3);
  EXPECT_EQ(fresh_optimizer.optimizer().steps(), 0);
  EXPECT_EQ(fresh_optimizer.optimizer().exp_avg()[0], 0.0f);

  train::Trainer full(c, config(6, Precision::fp32), *data, backend::cpu_ops());
  train::load_checkpoint(checkpoint, full, {});
  EXPECT_EQ(full.optimizer().steps(), 3);
  EXPECT_EQ(full.optimizer().exp_avg()[0], source.optimizer().exp_avg()[0]);
}

// A checkpoint written before mt knew a model field (its model_config lacks it) loads when the
// run keeps that field's default, which is what the older mt meant, and is named otherwise; an
// MoE loss weight (a training setting) may differ.
TEST(Checkpointing, AFieldTheCheckpointPredatesMeansItsDefault) {
  mt::testing::TempDir dir("mt_test_older_config");
  const model::ModelConfig c = tiny();
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  train::Trainer source(c, config(4, Precision::fp32), *data, backend::cpu_ops());
  source.train_step();
  const std::string path = dir.file("older.h5");
  train::save_checkpoint_file(path, source, {});
  const auto rewrite_model_config = [&](const std::vector<std::string>& dropped, double aux_loss_coeff = 0.0) {
    nlohmann::json saved = nlohmann::json::parse(io::CheckpointReader(path).state().model_config);
    for (const std::string& field : dropped) ASSERT_TRUE(saved.erase(field)) << field;
    saved["moe_aux_loss_coeff"] = aux_loss_coeff;
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    H5Adelete(file, "model_config");
    io::write_string_attribute(path, file, "model_config", saved.dump());
    H5Fclose(file);
  };
  const auto load_error = [&] {
    train::Trainer resumed(c, config(4, Precision::fp32), *data, backend::cpu_ops());
    return mt::testing::error_text([&] { train::load_checkpoint(io::CheckpointReader(path), resumed, {}); });
  };
  rewrite_model_config({"qk_layernorm"}, 0.5);  // the run keeps its default (false): loads
  EXPECT_EQ(load_error(), "");                  // and a loss weight may differ
  ASSERT_NE(c.ffn_hidden_size, model::ModelConfig{}.ffn_hidden_size);
  rewrite_model_config({"ffn_hidden_size"});  // the run does not keep it: named
  EXPECT_NE(load_error().find("model_config has no field ffn_hidden_size (written before mt knew it, which means " +
                              std::to_string(model::ModelConfig{}.ffn_hidden_size) + "), " +
                              std::to_string(c.ffn_hidden_size) + " in this run"),
            std::string::npos);
}

TEST(Checkpointing, RefusesAnotherModelAndMissingState) {
  mt::testing::TempDir dir("mt_test_refuse");
  const model::ModelConfig c = tiny();
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  train::Trainer source(c, config(4, Precision::fp32), *data, backend::cpu_ops());
  source.train_step();
  train::SaveOptions without_optimizer;
  without_optimizer.optimizer = false;
  train::save_checkpoint_file(dir.file("params_state.h5"), source, without_optimizer);
  train::SaveOptions parameters_only = without_optimizer;
  parameters_only.resumable = false;
  train::save_checkpoint_file(dir.file("final.h5"), source, parameters_only);
  train::save_checkpoint_file(dir.file("full.h5"), source, {});

  model::ModelConfig wider = c;
  wider.ffn_hidden_size = 64;
  train::Trainer other(wider, config(4, Precision::fp32), *data, backend::cpu_ops());
  EXPECT_NE(mt::testing::error_text([&] { train::load_checkpoint(io::CheckpointReader(dir.file("full.h5")), other, {}); })
                .find("written for another model: ffn_hidden_size is 48 there, 64 in this run"),
            std::string::npos);

  train::Trainer same(c, config(4, Precision::fp32), *data, backend::cpu_ops());
  EXPECT_NE(mt::testing::error_text([&] { train::load_checkpoint(io::CheckpointReader(dir.file("params_state.h5")), same, {}); })
                .find("holds no optimizer state"),
            std::string::npos);
  train::LoadOptions no_optim;
  no_optim.optimizer = false;
  EXPECT_EQ(mt::testing::error_text([&] { train::load_checkpoint(io::CheckpointReader(dir.file("params_state.h5")), same, no_optim); }),
            "");
  EXPECT_NE(mt::testing::error_text([&] { train::load_checkpoint(io::CheckpointReader(dir.file("final.h5")), same, no_optim); })
                .find("holds parameters only"),
            std::string::npos);
  train::LoadOptions finetune;
  finetune.finetune = true;
  EXPECT_EQ(mt::testing::error_text([&] { train::load_checkpoint(io::CheckpointReader(dir.file("final.h5")), same, finetune); }), "");
}

// A checkpoint whose config attributes are not JSON, or not the JSON mt writes (a damaged or
// hand-edited file): --load names the file and the attribute in an mt::Error, never letting
// nlohmann's parse_error or type_error through with no file named (issue 28). One trainer serves
// every case: each load is refused before it changes anything.
TEST(Checkpointing, ConfigAttributesThatAreNotJsonAreNamedWithTheFile) {
  mt::testing::TempDir dir("mt_test_corrupt_config");
  const model::ModelConfig c = tiny();
  auto data = data::make_mock_data(c.vocab_size, c.seq_length, 3);
  train::Trainer trainer(c, config(4, Precision::fp32), *data, backend::cpu_ops());
  trainer.train_step();
  const std::string saved = dir.file("saved.h5"), path = dir.file("damaged.h5");
  train::save_checkpoint_file(saved, trainer, {});
  for (const char* attribute : {"model_config", "train_config", "counters_origin"}) {
    for (const std::string text : {"{\"hidden_size\": 3", "not json", "[1, 2]", "{\"precision\": 3}"}) {
      std::filesystem::copy_file(saved, path, std::filesystem::copy_options::overwrite_existing);
      const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      ASSERT_GE(file, 0);
      H5Adelete(file, attribute);
      io::write_string_attribute(path, file, attribute, text);
      H5Fclose(file);
      const std::string where = std::string(attribute) + " = " + text + ": ";
      std::string error;
      try {
        error = mt::testing::error_text([&] { train::load_checkpoint(io::CheckpointReader(path), trainer, {}); });
      } catch (const std::exception& e) {
        ADD_FAILURE() << where << "not an mt::Error: " << e.what();
        continue;
      }
      EXPECT_EQ(error.rfind(path + ": ", 0), 0u) << where << error;
      EXPECT_NE(error.find(attribute), std::string::npos) << where << error;
    }
  }
}

// The pre-allocation memory check (lib/perf/memory.h): the floor never exceeds the plan and stays
// within a small factor of it (so planning after a representable floor cannot overflow), the plan
// counts the layout's elements, and configurations far too big or overflowing 64 bits are
// refused from the floor alone (issue 11 case 2); a parallel layout plans one rank's shard and the
// check counts every rank sharing the node; under TP, SP and PP the activations are the rank's
// stage's, so a layout that fits only because of them is not refused.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "core/error.h"
#include "model/config.h"
#include "model/layout.h"
#include "perf/memory.h"

using namespace mt;

namespace {

model::ModelConfig tiny() {
  model::ModelConfig c = model::preset("tiny-gpt");
  c.vocab_size = 97;
  return c;
}

void expect_floor_below_plan(const model::ModelConfig& model, const perf::MemoryOptions& options) {
  const perf::TrainingMemory floor = perf::memory_floor(model, options);
  const perf::TrainingMemory plan = perf::planned_memory(model, options);
  EXPECT_FALSE(floor.overflow);
  EXPECT_LE(floor.weights, plan.weights);
  EXPECT_LE(floor.grads, plan.grads);
  EXPECT_LE(floor.optimizer, plan.optimizer);
  EXPECT_LE(floor.activations, plan.activations);
  EXPECT_LE(floor.total(), plan.total());
  EXPECT_LE(plan.activations, 5 * floor.activations + (int64_t{1} << 20));
}

}  // namespace

TEST(Memory, TheFloorIsBelowThePlanForEveryRecomputeAndPrecision) {
  for (const char* name : {"tiny-gpt", "tiny-llama"}) {
    model::ModelConfig c = model::preset(name);
    c.num_layers = 5;
    for (Precision precision : {Precision::fp32, Precision::bf16, Precision::fp16}) {
      perf::MemoryOptions options;
      options.precision = precision;
      options.micro_batch_size = 3;
      options.staged_samples = 6;
      expect_floor_below_plan(c, options);
      options.recompute.granularity = model::RecomputeGranularity::selective;
      expect_floor_below_plan(c, options);
      options.recompute.granularity = model::RecomputeGranularity::full;
      for (int k : {1, 2, 5, 9}) {
        options.recompute.num_layers = k;
        options.recompute.method = model::RecomputeMethod::uniform;
        expect_floor_below_plan(c, options);
        options.recompute.method = model::RecomputeMethod::block;
        expect_floor_below_plan(c, options);
      }
    }
  }
}

TEST(Memory, ThePlanCountsTheLayoutAndAdamsTwoMoments) {
  const model::ModelConfig c = model::preset("llama3-70b");
  perf::MemoryOptions options;
  const perf::TrainingMemory plan = perf::planned_memory(c, options);
  EXPECT_EQ(plan.weights, 70553706496LL * 4 + (model::build_layout(c).total_elements - 70553706496LL) * 4);
  EXPECT_EQ(plan.grads, plan.weights);
  EXPECT_EQ(plan.optimizer, 2 * plan.grads);
  options.precision = Precision::fp16;
  EXPECT_EQ(perf::planned_memory(c, options).weights, 2 * plan.weights);  // fp16-rounded fp32 copy
}

TEST(Memory, Issue11Case2FarTooBigIsRefusedFromTheFloorWithoutPlanning) {
  model::ModelConfig c = tiny();
  c.num_layers = 1000000;
  const auto start = std::chrono::steady_clock::now();
  try {
    perf::check_training_memory(c, {}, int64_t{16} << 30);
    FAIL() << "a million layers fit 16 GiB";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("model tiny-gpt: needs at least ", 0), 0u) << what;
    EXPECT_NE(what.find("but only 16.00 GiB is available"), std::string::npos) << what;
  }
  // Building the million-entry layout takes seconds; the floor microseconds.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.5);
}

TEST(Memory, Issue11Case2CountsBeyond64BitsAreRefusedAsOverflow) {
  model::ModelConfig c = tiny();
  c.hidden_size = 65536;
  c.num_attention_heads = 1;
  c.num_query_groups = 1;
  c.kv_channels = 0;
  c.ffn_hidden_size = 4 * 65536;
  c.num_layers = 2147483647;
  const perf::TrainingMemory floor = perf::memory_floor(c, {});
  EXPECT_TRUE(floor.overflow);
  EXPECT_GT(floor.exact_total, 9.3e18L);
  for (int64_t available : {int64_t{-1}, int64_t{1} << 40}) {
    try {
      perf::check_training_memory(c, {}, available);
      FAIL() << "an overflowing model was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("overflow 64-bit arithmetic"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(perf::planned_memory(c, {}), Error);
}

TEST(Memory, AModelThatFitsPassesWithItsPlan) {
  const model::ModelConfig c = tiny();
  perf::MemoryOptions options;
  const perf::TrainingMemory plan = perf::check_training_memory(c, options, int64_t{1} << 30);
  EXPECT_EQ(plan.total(), perf::planned_memory(c, options).total());
  EXPECT_GT(plan.activations, 0);
  EXPECT_GT(plan.other, 0);
}

TEST(Memory, ARanksShareIsItsShardAndTheNodeCountsEveryRank) {
  model::ModelConfig c = model::preset("tiny-llama");
  c.num_layers = 3;
  perf::MemoryOptions one;
  const perf::TrainingMemory whole = perf::planned_memory(c, one);

  perf::MemoryOptions sharded;
  sharded.parallel.tensor_model_parallel_size = 2;
  sharded.parallel.data_parallel_size = 2;
  sharded.parallel.use_distributed_optimizer = true;
  expect_floor_below_plan(c, sharded);
  const perf::TrainingMemory rank = perf::planned_memory(c, sharded);
  // Half the model and more (replicated norms); Adam's moments of one DP shard of that.
  EXPECT_LT(rank.weights, whole.weights);
  EXPECT_GE(2 * rank.weights, whole.weights);
  EXPECT_EQ(rank.optimizer, rank.grads);  // two fp32 moments of half the elements
  EXPECT_GE(4 * rank.optimizer, whole.optimizer);

  // What fits one rank is refused for two ranks sharing the node, naming them.
  const int64_t available = whole.total() + whole.total() / 2;
  EXPECT_NO_THROW(perf::check_training_memory(c, one, available));
  perf::MemoryOptions two = one;
  two.ranks_per_node = 2;
  try {
    perf::check_training_memory(c, two, available);
    FAIL() << "two ranks of " << whole.total() << " bytes fit in " << available;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("per rank x 2 ranks on this node"), std::string::npos) << e.what();
  }
}

// Megatron-FSDP: the floor stays below the plan for every grad-sharding strategy, prefetch and
// overlap; the plan counts the grad shard (and under optim_grads_params the weight shard) plus the
// units in use, so a layout the distributed optimizer alone does not fit passes under FSDP. (The
// plan against the measured ledger: tests/tools/mt-train-fsdp.bats.)
TEST(Memory, MegatronFsdpCountsItsShardAndTheUnitsInUse) {
  model::ModelConfig c = model::preset("tiny-llama");
  c.num_layers = 8;
  perf::MemoryOptions optim;
  optim.parallel.data_parallel_size = 4;
  optim.parallel.use_distributed_optimizer = true;
  const perf::TrainingMemory distributed = perf::planned_memory(c, optim);
  for (const char* strategy : {"optim_grads", "optim_grads_params"}) {
    for (bool overlap : {false, true}) {
      for (bool no_prefetch : {false, true}) {
        perf::MemoryOptions fsdp = optim;
        fsdp.parallel.use_megatron_fsdp = true;
        fsdp.parallel.data_parallel_sharding_strategy = strategy;
        fsdp.parallel.overlap_grad_reduce = overlap;
        fsdp.parallel.no_fsdp_prefetch = no_prefetch && std::string(strategy) == "optim_grads_params";
        SCOPED_TRACE(std::string(strategy) + (overlap ? " overlapped" : "") + (no_prefetch ? " no prefetch" : ""));
        expect_floor_below_plan(c, fsdp);
        const perf::TrainingMemory plan = perf::planned_memory(c, fsdp);
        EXPECT_LT(2 * plan.grads, distributed.grads);  // a quarter and two layers' worth, not the whole table
        EXPECT_EQ(plan.optimizer, distributed.optimizer);
        if (std::string(strategy) == "optim_grads_params") {
          EXPECT_LT(2 * plan.weights, distributed.weights);
          EXPECT_NO_THROW(perf::check_training_memory(c, fsdp, (distributed.total() + plan.total()) / 2));
          EXPECT_THROW(perf::check_training_memory(c, optim, (distributed.total() + plan.total()) / 2), Error);
        } else {
          EXPECT_EQ(plan.weights, distributed.weights);
        }
      }
    }
  }
}

TEST(Memory, ARanksActivationsAreItsStagesTensorAndSequenceParallelShare) {
  model::ModelConfig c = model::preset("tiny-llama");
  c.num_layers = 4;
  perf::MemoryOptions one;
  one.micro_batch_size = 4;
  one.staged_samples = 4;
  const perf::TrainingMemory whole = perf::planned_memory(c, one);

  // TP 2 with SP: every activation is split over the two ranks (the residual stream by SP, the
  // rest by TP) except the SP full-row buffers.
  perf::MemoryOptions tp = one;
  tp.parallel.tensor_model_parallel_size = 2;
  tp.parallel.sequence_parallel = true;
  expect_floor_below_plan(c, tp);
  const perf::TrainingMemory rank = perf::planned_memory(c, tp);
  EXPECT_LT(rank.activations, whole.activations * 6 / 10);
  // A layout that fits only because TP splits the activations is not refused: the node holds two
  // ranks of the TP plan, not two ranks that would each hold one rank's activations.
  tp.ranks_per_node = 2;
  const int64_t available = 2 * rank.total();
  EXPECT_GT(2 * (rank.total() - rank.activations + whole.activations), available);
  EXPECT_NO_THROW(perf::check_training_memory(c, tp, available));
  EXPECT_THROW(perf::check_training_memory(c, tp, available - 1), Error);

  // PP 2 with one micro-batch: each stage holds half the layers (and its end), so the larger
  // stage is below the whole model in weights and activations; with four micro-batches the
  // first stage keeps two in flight.
  perf::MemoryOptions pp = one;
  pp.parallel.pipeline_model_parallel_size = 2;
  expect_floor_below_plan(c, pp);
  const perf::TrainingMemory stage = perf::planned_memory(c, pp);
  EXPECT_LT(stage.weights, whole.weights);
  EXPECT_LT(stage.activations, whole.activations);
  pp.staged_samples = 16;
  expect_floor_below_plan(c, pp);
  EXPECT_GT(perf::planned_memory(c, pp).activations, stage.activations);
}

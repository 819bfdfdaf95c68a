// The distributed optimizer and its buckets under mpirun (every rank one DP rank of the tiny
// LLaMA's layout, in buckets of 3000 elements): with overlap, grad reductions start as backward
// signals their layers (not at finish), and the sums and slices are exact on integer-valued grads;
// the parameter all-gather leaves every slice with its owner's values; the overlapped gather
// (waited layer by layer as a forward would, the rest at once) gives the parameters and GEMM copy
// of the blocking one, equal on every rank to AdamW over the summed grads; and the ranks' checkpoint
// runs cover every element of every tensor exactly once, with and without sharding. And per
// reduction group: expert tensors of a hand-made MoE layout over their own group (each rank alone,
// as EP = world) beside dense ones over the world: only the dense buckets are sliced and gathered.
// Run under mpirun at 2 and 3 ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "model/layout.h"
#include "model/precision_gemm.h"
#include "optim/adamw.h"
#include "optim/distributed_optimizer.h"
#include "optim/param_and_grad_buffer.h"
#include "../unit/moe_declarations.h"
#include "../unit/tiny_models.h"
#include "training_equivalence.h"

using namespace mt;

namespace {

const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new equivalence::WorldEnvironment);

// The tiny LLaMA's one-chunk layout for DP = the world, in buckets of 3000 elements.
model::ParamLayout bucketed_layout(bool distributed_optimizer) {
  const model::ModelConfig model = mt::testing::trainer_model(true);
  parallel::ParallelConfig parallel;
  parallel.data_parallel_size = equivalence::world().size();
  parallel.use_distributed_optimizer = distributed_optimizer;
  parallel.overlap_grad_reduce = true;
  parallel.ddp_bucket_size = 3000;
  return model::build_layout(model, parallel, {}, {model::ChunkSpec{0, model.num_layers, true, true}},
                             optim::DistributedOptimizer::bucket_options(parallel));
}

// Rank r's grads: small integers, so the sums over ranks are exact.
std::vector<float> integer_grads(const model::ParamLayout& layout, int rank) {
  std::vector<float> grads(static_cast<size_t>(layout.total_elements), 0.0f);
  for (const model::ParamEntry& e : layout.entries) {
    for (int64_t i = 0; i < e.numel; ++i) grads[static_cast<size_t>(e.offset + i)] = static_cast<float>(rank + 1 + i % 5);
  }
  return grads;
}

std::vector<float> starting_parameters(const model::ParamLayout& layout) {
  std::vector<float> params(static_cast<size_t>(layout.total_elements), 0.0f);
  for (int64_t i = 0; i < layout.total_elements; ++i) {
    params[static_cast<size_t>(i)] = 0.02f * static_cast<float>(i % 11) - 0.1f;
  }
  return params;
}

}  // namespace

TEST(ParamAndGradBuffer, OverlapStartsBucketsFromGradsReadySignalsAndSumsExactly) {
  const int world = equivalence::world().size(), rank = equivalence::world().rank();
  const model::ModelConfig model = mt::testing::trainer_model(true);
  for (bool shard : {false, true}) {
    SCOPED_TRACE(shard ? "reduce-scatter" : "all-reduce");
    const model::ParamLayout layout = bucketed_layout(shard);
    ASSERT_GE(layout.buckets.size(), 3u);
    const auto single = comm::make_single_communicator();
    optim::ParamAndGradBuffer buffer(layout, optim::ReductionGroups{&equivalence::world(), single.get(), single.get()},
                                     shard, /*overlap_grad_reduce=*/true);
    std::vector<float> grads = integer_grads(layout, rank);
    buffer.begin_grad_sync(grads.data());
    buffer.layer_ready(model::head_layer(model));  // not armed: an earlier micro-batch only accumulates
    EXPECT_EQ(buffer.started_buckets(), 0);
    buffer.arm(0);
    int started = 0;
    for (int layer = model::head_layer(model); layer >= model::kEmbeddingLayer; --layer) {
      buffer.layer_ready(layer);
      EXPECT_GE(buffer.started_buckets(), started) << "layer " << layer;
      started = buffer.started_buckets();
      if (layer == model.num_layers - 1) {
        EXPECT_GT(started, 0) << "nothing started before the embedding's signal";
      }
    }
    EXPECT_EQ(started, static_cast<int>(layout.buckets.size()));
    buffer.finish_grad_sync();
    const float rank_sum = static_cast<float>(world * (world + 1) / 2);
    for (size_t b = 0; b < layout.buckets.size(); ++b) {
      const model::FlatRange range = buffer.owned_range(static_cast<int>(b));
      for (const model::ParamEntry& e : layout.entries) {
        for (int64_t i = std::max(range.begin, e.offset); i < std::min(range.end, e.offset + e.numel); ++i) {
          ASSERT_EQ(grads[static_cast<size_t>(i)], rank_sum + static_cast<float>(world * ((i - e.offset) % 5)))
              << e.name << " element " << i - e.offset;
        }
      }
    }
    // The parameter all-gather: every slice ends up holding its owner's values.
    EXPECT_EQ(buffer.gathers_any(), shard);
    std::vector<float> params(grads.size(), static_cast<float>(rank));
    buffer.gather_parameters(params.data());
    for (size_t b = 0; b < layout.buckets.size(); ++b) {
      for (int owner = 0; owner < world; ++owner) {
        const model::FlatRange range = shard ? layout.bucket_shard(static_cast<int>(b), owner, world)
                                              : buffer.owned_range(static_cast<int>(b));
        for (int64_t i = range.begin; i < range.end; ++i) {
          ASSERT_EQ(params[static_cast<size_t>(i)], static_cast<float>(shard ? owner : rank));
        }
      }
    }
  }
}

TEST(DistributedOptimizer, OverlappedParameterGatherEqualsTheBlockingOneAndAdamWOverTheSums) {
  const int world = equivalence::world().size(), rank = equivalence::world().rank();
  const model::ParamLayout layout = bucketed_layout(true);
  const auto single = comm::make_single_communicator();
  const optim::ReductionGroups groups{&equivalence::world(), single.get(), single.get()};
  const backend::Ops& ops = backend::cpu_ops();
  std::vector<float> sums(static_cast<size_t>(layout.total_elements), 0.0f);
  for (int r = 0; r < world; ++r) {
    const std::vector<float> grads = integer_grads(layout, r);
    for (size_t i = 0; i < sums.size(); ++i) sums[i] += grads[i];
  }
  std::vector<float> reference = starting_parameters(layout);
  optim::AdamW(layout, optim::AdamWConfig{}, ops).step(reference.data(), nullptr, sums.data(), 1e-2, 0.5);

  std::vector<std::vector<float>> results;
  std::vector<std::vector<unsigned char>> copies;
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped gather" : "blocking gather");
    std::vector<float> params = starting_parameters(layout), grads(params.size());
    model::GemmWeights copy(ops, Precision::bf16, layout.total_elements);
    optim::DistributedOptimizerOptions options;
    options.sharding = optim::ShardingStrategy::optim;
    options.overlap_grad_reduce = options.overlap_param_gather = overlap;
    optim::DistributedOptimizer optimizer(layout, options, groups, ops, params.data(), grads.data(), &copy);
    optimizer.begin_grad_sync();
    const std::vector<float> mine = integer_grads(layout, rank);
    std::copy(mine.begin(), mine.end(), grads.begin());
    optimizer.arm_grad_sync(0);
    for (int layer = layout.last_layer; layer >= model::kEmbeddingLayer; --layer) optimizer.grads_ready(layer);
    optimizer.finish_grad_sync();
    optimizer.step(1e-2, 0.5);
    if (overlap) {
      // The embedding and the first layer waited as a forward would, the rest all at once.
      optimizer.wait_for_parameters(0, model::kEmbeddingLayer);
      optimizer.wait_for_parameters(0, 0);
      optimizer.finish_parameter_gather();
    }
    for (const model::ParamEntry& e : layout.entries) {
      ASSERT_EQ(std::memcmp(params.data() + e.offset, reference.data() + e.offset, sizeof(float) * e.numel), 0) << e.name;
    }
    results.push_back(params);
    const size_t operand_bytes = copy.operand_type() == DType::f32 ? 4 : 2;
    const auto* bytes = static_cast<const unsigned char*>(copy.operand(params.data(), 0));
    copies.emplace_back(bytes, bytes + operand_bytes * layout.total_elements);
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(copies[0], copies[1]) << "the GEMM copy after the overlapped gather differs from the blocking one";
}

TEST(DistributedOptimizer, TheRanksCheckpointRunsCoverEveryElementOnce) {
  const auto single = comm::make_single_communicator();
  for (bool shard : {false, true}) {
    SCOPED_TRACE(shard ? "sharded" : "unsharded");
    const model::ParamLayout layout = bucketed_layout(shard);
    std::vector<float> params(static_cast<size_t>(layout.total_elements)), grads(params.size());
    optim::DistributedOptimizerOptions options;
    options.sharding = shard ? optim::ShardingStrategy::optim : optim::ShardingStrategy::no_shard;
    const optim::DistributedOptimizer optimizer(layout, options,
                                                optim::ReductionGroups{&equivalence::world(), single.get(), single.get()},
                                                backend::cpu_ops(), params.data(), grads.data(), nullptr);
    // Per flat element of the layout: how many ranks write it.
    std::vector<int64_t> writers(static_cast<size_t>(layout.total_elements), 0);
    for (const optim::TensorRun& run : optimizer.checkpoint_runs()) {
      const model::ParamEntry& e = layout.entries[run.entry];
      ASSERT_EQ(run.flat, e.offset + run.begin);
      for (int64_t i = run.begin; i < run.end; ++i) ++writers[static_cast<size_t>(e.offset + i)];
    }
    equivalence::world().all_reduce(writers.data(), layout.total_elements, DType::i64, comm::ReduceOp::sum);
    for (const model::ParamEntry& e : layout.entries) {
      for (int64_t i = 0; i < e.numel; ++i) ASSERT_EQ(writers[static_cast<size_t>(e.offset + i)], 1) << e.name << " " << i;
    }
    int64_t state = 0;
    for (const optim::TensorRun& run : optimizer.state_runs()) {
      EXPECT_GE(run.state, state);
      state = run.state + (run.end - run.begin);
    }
    EXPECT_LE(state * 2 * static_cast<int64_t>(sizeof(float)), optimizer.state_bytes());
  }
}

TEST(DistributedOptimizer, ExpertBucketsReduceOverTheirOwnGroupBesideTheDenseOnes) {
  const int world = equivalence::world().size(), rank = equivalence::world().rank();
  parallel::ParallelConfig parallel;
  parallel.data_parallel_size = world;
  parallel.expert_model_parallel_size = world;  // expert-DP 1: each rank updates its own experts
  parallel.use_distributed_optimizer = parallel.overlap_grad_reduce = parallel.overlap_param_gather = true;
  parallel.ddp_bucket_size = 3000;
  const model::ParamLayout layout = model::lay_out(mt::testing::moe_declarations(), {model::ChunkBlocks{{0, 2, true, true}, {}, {}, {}}},
                                                   optim::DistributedOptimizer::bucket_options(parallel));
  const auto single = comm::make_single_communicator();
  const backend::Ops& ops = backend::cpu_ops();
  std::vector<float> params = starting_parameters(layout), grads(params.size());
  model::GemmWeights copy(ops, Precision::bf16, layout.total_elements);
  copy.refresh(params.data());
  optim::DistributedOptimizer optimizer(layout, optim::DistributedOptimizer::options(parallel, optim::AdamWConfig{}),
                                        optim::ReductionGroups{&equivalence::world(), single.get(), single.get()}, ops,
                                        params.data(), grads.data(), &copy);
  optimizer.begin_grad_sync();
  const std::vector<float> mine = integer_grads(layout, rank);
  std::copy(mine.begin(), mine.end(), grads.begin());
  optimizer.arm_grad_sync(0);
  for (int layer = 2; layer >= model::kEmbeddingLayer; --layer) optimizer.grads_ready(layer);
  optimizer.finish_grad_sync();
  optimizer.step(1e-2, 0.5);
  for (int layer = model::kEmbeddingLayer; layer <= 2; ++layer) optimizer.wait_for_parameters(0, layer);

  // What every rank must hold: AdamW over dense grads summed over the world, expert grads its own.
  std::vector<float> sums = mine;
  for (const model::ParamEntry& e : layout.entries) {
    if (e.data_parallel_group == model::DataParallelGroup::expert) continue;
    for (int r = 0; r < world; ++r) {
      if (r == rank) continue;
      const std::vector<float> theirs = integer_grads(layout, r);
      for (int64_t i = e.offset; i < e.offset + e.numel; ++i) sums[static_cast<size_t>(i)] += theirs[static_cast<size_t>(i)];
    }
  }
  std::vector<float> reference = starting_parameters(layout);
  optim::AdamW(layout, optim::AdamWConfig{}, ops).step(reference.data(), nullptr, sums.data(), 1e-2, 0.5);
  model::GemmWeights reference_copy(ops, Precision::bf16, layout.total_elements);
  reference_copy.refresh(reference.data());
  const size_t operand_bytes = copy.operand_type() == DType::f32 ? 4 : 2;
  for (const model::ParamEntry& e : layout.entries) {
    EXPECT_EQ(std::memcmp(params.data() + e.offset, reference.data() + e.offset, sizeof(float) * e.numel), 0) << e.name;
    EXPECT_EQ(std::memcmp(copy.operand(params.data(), e.offset), reference_copy.operand(reference.data(), e.offset),
                          operand_bytes * e.numel),
              0)
        << e.name << "'s GEMM copy";
  }
  // Dense tensors: one writer over the world; expert tensors: every rank its own.
  std::vector<int64_t> writers(static_cast<size_t>(layout.total_elements), 0);
  for (const optim::TensorRun& run : optimizer.checkpoint_runs()) {
    for (int64_t i = run.flat; i < run.flat + (run.end - run.begin); ++i) ++writers[static_cast<size_t>(i)];
  }
  equivalence::world().all_reduce(writers.data(), layout.total_elements, DType::i64, comm::ReduceOp::sum);
  for (const model::ParamEntry& e : layout.entries) {
    const int64_t expected = e.data_parallel_group == model::DataParallelGroup::expert ? world : 1;
    for (int64_t i = e.offset; i < e.offset + e.numel; ++i) {
      ASSERT_EQ(writers[static_cast<size_t>(i)], expected) << e.name;
    }
  }
}

// The distributed optimizer on ranks that are threads of this process (tests/unit/thread_communicator.h):
// the bucket options Megatron's flags give; per reduction group (a hand-made layout with expert
// tensors, reduced over expert-DP groups of 2 inside a dense group of 4) the owned slices, the
// reduce-scatter and all-reduce sums, the grad norm's shares and the checkpoint writers; the
// sharded step equal, bit for bit, to one AdamW over the summed grads; --overlap-param-gather
// leaving a bucket stale until the forward of its layers waits for it (and its GEMM copy with it);
// one rank; the FSDP strategies refused over buckets holding several layers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "model/layout.h"
#include "model/precision_gemm.h"
#include "optim/adamw.h"
#include "optim/distributed_optimizer.h"
#include "../moe_declarations.h"
#include "../thread_communicator.h"

using namespace mt;
using optim::DistributedOptimizer;
using optim::ShardingStrategy;
using model::DataParallelGroup;

namespace {

// DP = 4 with EP = 2: dense grads over 4 ranks, expert grads over expert-DP groups of 2.
parallel::ParallelConfig moe_parallel(bool distributed_optimizer) {
  parallel::ParallelConfig parallel;
  parallel.data_parallel_size = 4;
  parallel.expert_model_parallel_size = 2;
  parallel.use_distributed_optimizer = distributed_optimizer;
  parallel.overlap_grad_reduce = true;
  parallel.ddp_bucket_size = 3000;
  return parallel;
}

model::ParamLayout moe_layout(bool distributed_optimizer) {
  const model::ChunkSpec chunk{0, 2, true, true};
  return model::lay_out(mt::testing::moe_declarations(), {model::ChunkBlocks{chunk, {}, {}, {}}},
                        DistributedOptimizer::bucket_options(moe_parallel(distributed_optimizer)));
}

// The value element i of a tensor gets from a rank: small integers, so every sum is exact.
float grad_value(int rank, int64_t i) { return static_cast<float>(rank + 1 + i % 5); }

// Rank r's expert-DP group (ranks r mod 2) and its place in it.
int expert_group(int rank) { return rank % 2; }
int expert_rank(int rank) { return rank / 2; }

// The per-rank reduction groups of 4 thread ranks: one dense group, two expert-DP groups.
struct MoeGroups {
  mt::testing::ThreadGroup dense{4};
  mt::testing::ThreadGroup expert[2] = {mt::testing::ThreadGroup(2), mt::testing::ThreadGroup(2)};
};

std::vector<float> initial_parameters(const model::ParamLayout& layout) {
  std::vector<float> params(static_cast<size_t>(layout.total_elements), 0.0f);
  for (const model::ParamEntry& e : layout.entries) {
    for (int64_t i = 0; i < e.numel; ++i) {
      params[static_cast<size_t>(e.offset + i)] = 0.01f * static_cast<float>(i % 13) - 0.05f;
    }
  }
  return params;
}

// What rank `rank` holds after the grad sync: each element summed over the ranks of its group.
std::vector<float> summed_grads(const model::ParamLayout& layout, int rank) {
  std::vector<float> grads(static_cast<size_t>(layout.total_elements), 0.0f);
  for (const model::ParamEntry& e : layout.entries) {
    const bool expert = e.data_parallel_group == DataParallelGroup::expert;
    for (int64_t i = 0; i < e.numel; ++i) {
      float sum = 0;
      for (int r = 0; r < 4; ++r) {
        if (!expert || expert_group(r) == expert_group(rank)) sum += grad_value(r, i);
      }
      grads[static_cast<size_t>(e.offset + i)] = sum;
    }
  }
  return grads;
}

constexpr double kLr = 1e-2, kGradScale = 0.5;

}  // namespace

TEST(DistributedOptimizer, BucketOptionsFollowMegatronsFlags) {
  // Buckets only with --overlap-grad-reduce; without the distributed optimizer every group keeps
  // the 16-element alignment, with it each group pads to lcm(its size, 128).
  parallel::ParallelConfig flags;
  flags.data_parallel_size = 3;
  flags.ddp_bucket_size = 20000;
  EXPECT_EQ(DistributedOptimizer::sharding_strategy(flags), ShardingStrategy::no_shard);
  EXPECT_EQ(DistributedOptimizer::bucket_options(flags).bucket_elements, 0);
  EXPECT_EQ(DistributedOptimizer::bucket_options(flags).pad(DataParallelGroup::dense), model::kParamAlignElements);
  flags.use_distributed_optimizer = true;
  EXPECT_EQ(DistributedOptimizer::sharding_strategy(flags), ShardingStrategy::optim);
  EXPECT_EQ(DistributedOptimizer::bucket_options(flags).bucket_elements, 0);
  flags.overlap_grad_reduce = true;
  EXPECT_EQ(DistributedOptimizer::bucket_options(flags).bucket_elements, 20000);
  EXPECT_EQ(DistributedOptimizer::bucket_options(flags).pad(DataParallelGroup::dense), 384);  // lcm(3, 128)
  // DP x CP for dense tensors; the expert grid's DP for expert tensors: DP 6 with EP 3 leaves 2.
  parallel::ParallelConfig folded;
  folded.data_parallel_size = 3;
  folded.context_parallel_size = 2;
  folded.expert_model_parallel_size = 3;
  folded.use_distributed_optimizer = true;
  const model::BucketOptions options = DistributedOptimizer::bucket_options(folded);
  EXPECT_EQ(options.pad(DataParallelGroup::dense), 384);   // lcm(6, 128)
  EXPECT_EQ(options.pad(DataParallelGroup::expert), 128);  // lcm(2, 128)
}

TEST(DistributedOptimizer, RefusesFsdpWithoutOneBucketPerLayer) {
  const model::ParamLayout layout = moe_layout(true);
  auto single = comm::make_single_communicator();
  std::vector<float> params(static_cast<size_t>(layout.total_elements)), grads(params.size());
  // The FSDP strategies need the layout's one bucket per layer id (their units).
  for (ShardingStrategy strategy : {ShardingStrategy::optim_grads, ShardingStrategy::optim_grads_params}) {
    optim::DistributedOptimizerOptions options;
    options.sharding = strategy;
    try {
      DistributedOptimizer(layout, options, optim::ReductionGroups::single(*single), backend::cpu_ops(), params.data(),
                           grads.data(), nullptr);
      ADD_FAILURE() << optim::sharding_strategy_name(strategy) << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FSDP units need one bucket per layer"), std::string::npos) << e.what();
    }
  }
  optim::DistributedOptimizerOptions plain;
  plain.overlap_param_gather = true;
  EXPECT_THROW(DistributedOptimizer(layout, plain, optim::ReductionGroups::single(*single), backend::cpu_ops(),
                                    params.data(), grads.data(), nullptr),
               UsageError);
}

// Four ranks, sharded, overlapped: per-group slices, sums, norm shares and writers, and the
// parameter gather waited bucket by bucket.
TEST(DistributedOptimizer, ShardsEachGroupsBucketsOverItsOwnRanks) {
  const model::ParamLayout layout = moe_layout(true);
  ASSERT_GE(layout.buckets.size(), 4u);
  MoeGroups groups;
  const backend::Ops& ops = backend::cpu_ops();
  std::mutex lock;
  double norm_shares = 0;
  std::map<std::string, std::vector<int>> written;  // per tensor and element: writers (expert: per group)
  std::vector<std::string> failures;
  auto fail = [&](const std::string& what) {
    std::lock_guard<std::mutex> guard(lock);
    failures.push_back(what);
  };

  mt::testing::run_ranks(4, [&](int rank) {
    mt::testing::ThreadCommunicator dense(groups.dense, rank);
    mt::testing::ThreadCommunicator expert(groups.expert[expert_group(rank)], expert_rank(rank));
    const auto tensor_parallel = comm::make_single_communicator();
    const optim::ReductionGroups reduction{&dense, &expert, tensor_parallel.get()};
    std::vector<float> params = initial_parameters(layout);
    std::vector<float> grads(params.size(), -1.0f);
    model::GemmWeights copy(ops, Precision::bf16, layout.total_elements);
    copy.refresh(params.data());
    optim::DistributedOptimizerOptions options = DistributedOptimizer::options(moe_parallel(true), optim::AdamWConfig{});
    options.overlap_param_gather = true;
    DistributedOptimizer optimizer(layout, options, reduction, ops, params.data(), grads.data(), &copy);

    // Each rank's slice of each bucket, of its own group's size.
    for (size_t b = 0; b < layout.buckets.size(); ++b) {
      const model::GradBucket& bucket = layout.buckets[b];
      const int size = bucket.group == DataParallelGroup::expert ? 2 : 4;
      const int place = bucket.group == DataParallelGroup::expert ? expert_rank(rank) : rank;
      const model::FlatRange expected = layout.bucket_shard(static_cast<int>(b), place, size);
      const model::FlatRange owned = optimizer.owned_ranges().at(b);
      if (owned.begin != expected.begin || owned.end != expected.end) fail("bucket " + std::to_string(b) + " slice");
    }

    // Grads: zeroed by begin, reduced bucket by bucket as backward signals the layers.
    optimizer.begin_grad_sync();
    for (float g : grads) {
      if (g != 0.0f) {
        fail("begin_grad_sync left a grad unzeroed");
        break;
      }
    }
    for (const model::ParamEntry& e : layout.entries) {
      for (int64_t i = 0; i < e.numel; ++i) grads[static_cast<size_t>(e.offset + i)] = grad_value(rank, i);
    }
    optimizer.arm_grad_sync(0);
    for (int layer = 2; layer >= model::kEmbeddingLayer; --layer) optimizer.grads_ready(layer);
    if (optimizer.started_grad_buckets() != static_cast<int>(layout.buckets.size())) fail("a bucket did not start");
    optimizer.finish_grad_sync();
    const std::vector<float> sums = summed_grads(layout, rank);
    for (const model::FlatRange& range : optimizer.owned_ranges()) {
      for (int64_t i = range.begin; i < range.end; ++i) {
        if (grads[static_cast<size_t>(i)] != sums[static_cast<size_t>(i)]) {
          fail("rank " + std::to_string(rank) + " element " + std::to_string(i) + ": " +
               std::to_string(grads[static_cast<size_t>(i)]) + " not the group's sum " +
               std::to_string(sums[static_cast<size_t>(i)]));
          break;
        }
      }
    }
    {
      std::lock_guard<std::mutex> guard(lock);
      norm_shares += optimizer.grad_sum_squares();
      for (const optim::TensorRun& run : optimizer.checkpoint_runs()) {
        const model::ParamEntry& e = layout.entries[run.entry];
        const bool expert = e.data_parallel_group == DataParallelGroup::expert;
        // Expert tensors differ between the expert groups: name them per group.
        const std::string name = expert ? e.name + "@" + std::to_string(expert_group(rank)) : e.name;
        std::vector<int>& writers = written[name];
        writers.resize(static_cast<size_t>(e.numel), 0);
        for (int64_t i = run.begin; i < run.end; ++i) ++writers[static_cast<size_t>(i)];
      }
    }

    // The step, with the gathers left in flight: other ranks' slices are stale until waited.
    optim::AdamW reference_adamw(layout, optim::AdamWConfig{}, ops);
    std::vector<float> reference = initial_parameters(layout);
    reference_adamw.step(reference.data(), nullptr, sums.data(), kLr, kGradScale);
    model::GemmWeights reference_copy(ops, Precision::bf16, layout.total_elements);
    reference_copy.refresh(reference.data());
    const std::vector<float> before = initial_parameters(layout);
    model::GemmWeights before_copy(ops, Precision::bf16, layout.total_elements);
    before_copy.refresh(before.data());
    optimizer.step(kLr, kGradScale);
    // Whether bucket b holds the reference's parameters and GEMM copy once waited, and before:
    // the reference on this rank's own slice only, the old values elsewhere and an old copy.
    const auto bucket_holds = [&](size_t b, bool waited) {
      const model::FlatRange own = optimizer.owned_ranges()[b];
      const auto copy_bits = [&](const model::GemmWeights& weights, const float* values, int64_t i) {
        uint32_t bits = 0;
        std::memcpy(&bits, weights.operand(values, i), copy.operand_type() == DType::f32 ? 4 : 2);
        return bits;
      };
      for (const model::ParamEntry& e : layout.entries) {
        if (e.bucket != static_cast<int>(b)) continue;
        for (int64_t i = e.offset; i < e.offset + e.numel; ++i) {
          const bool updated = waited || (i >= own.begin && i < own.end);
          const float want = updated ? reference[static_cast<size_t>(i)] : before[static_cast<size_t>(i)];
          const uint32_t want_bits = waited ? copy_bits(reference_copy, reference.data(), i)
                                            : copy_bits(before_copy, before.data(), i);
          if (params[static_cast<size_t>(i)] != want || copy_bits(copy, params.data(), i) != want_bits) return false;
        }
      }
      return true;
    };
    // Layer by layer in forward order: a bucket is gathered (and its copy refreshed) once the
    // forward of its first layer waits for it, and not before.
    for (int layer = model::kEmbeddingLayer; layer <= 2; ++layer) {
      for (size_t b = 0; b < layout.buckets.size(); ++b) {
        if (layout.buckets[b].first_layer >= layer && !bucket_holds(b, false)) {
          fail("rank " + std::to_string(rank) + " bucket " + std::to_string(b) + " changed before its wait");
        }
      }
      optimizer.wait_for_parameters(0, layer);
      for (size_t b = 0; b < layout.buckets.size(); ++b) {
        if (layout.buckets[b].first_layer <= layer && !bucket_holds(b, true)) {
          fail("rank " + std::to_string(rank) + " bucket " + std::to_string(b) + " not the reference after its wait");
        }
      }
    }
  });

  for (const std::string& failure : failures) ADD_FAILURE() << failure;
  // The norm's shares add up to each tensor once: dense sums once, each expert group's sums once.
  double expected = 0;
  for (const model::ParamEntry& e : layout.entries) {
    const int copies = e.data_parallel_group == DataParallelGroup::expert ? 2 : 1;
    for (int c = 0; c < copies; ++c) {
      const std::vector<float> sums = summed_grads(layout, c);
      for (int64_t i = 0; i < e.numel; ++i) {
        const double sum = sums[static_cast<size_t>(e.offset + i)];
        expected += sum * sum;
      }
    }
  }
  EXPECT_NEAR(norm_shares, expected, 1e-12 * expected);
  // Every element of every tensor has exactly one writer (an expert tensor one per expert group).
  EXPECT_EQ(written.size(), layout.entries.size() + 4);
  for (const auto& [name, writers] : written) {
    for (size_t i = 0; i < writers.size(); ++i) ASSERT_EQ(writers[i], 1) << name << " element " << i;
  }
}

// Without sharding: every rank all-reduces and updates everything; rank 0 of each group counts
// and writes that group's tensors.
TEST(DistributedOptimizer, UnshardedGroupsAllReduceAndRankZeroOfEachGroupWrites) {
  const model::ParamLayout layout = moe_layout(false);
  MoeGroups groups;
  const backend::Ops& ops = backend::cpu_ops();
  std::mutex lock;
  std::vector<std::string> failures;
  std::map<std::string, int> writers;  // tensor (expert: per group) -> ranks writing it whole

  mt::testing::run_ranks(4, [&](int rank) {
    mt::testing::ThreadCommunicator dense(groups.dense, rank);
    mt::testing::ThreadCommunicator expert(groups.expert[expert_group(rank)], expert_rank(rank));
    const auto tensor_parallel = comm::make_single_communicator();
    std::vector<float> params = initial_parameters(layout), grads(params.size());
    DistributedOptimizer optimizer(layout, DistributedOptimizer::options(moe_parallel(false), optim::AdamWConfig{}),
                                   optim::ReductionGroups{&dense, &expert, tensor_parallel.get()}, ops, params.data(),
                                   grads.data(), nullptr);
    optimizer.begin_grad_sync();
    for (const model::ParamEntry& e : layout.entries) {
      for (int64_t i = 0; i < e.numel; ++i) grads[static_cast<size_t>(e.offset + i)] = grad_value(rank, i);
    }
    optimizer.finish_grad_sync();
    const std::vector<float> sums = summed_grads(layout, rank);
    std::vector<float> reference = initial_parameters(layout);
    optim::AdamW(layout, optim::AdamWConfig{}, ops).step(reference.data(), nullptr, sums.data(), kLr, kGradScale);
    optimizer.step(kLr, kGradScale);
    std::lock_guard<std::mutex> guard(lock);
    if (optimizer.owned_ranges().size() != 1 || optimizer.owned_ranges()[0].end != layout.total_elements) {
      failures.push_back("unsharded ranges are not the whole buffer");
    }
    for (const model::ParamEntry& e : layout.entries) {
      if (std::memcmp(params.data() + e.offset, reference.data() + e.offset, sizeof(float) * e.numel) != 0) {
        failures.push_back("rank " + std::to_string(rank) + " " + e.name + " differs from AdamW over the sums");
      }
    }
    const double share = optimizer.grad_sum_squares();
    const bool dense_writer = rank == 0, expert_writer = expert_rank(rank) == 0;
    if ((share > 0) != (dense_writer || expert_writer)) failures.push_back("rank " + std::to_string(rank) + " share");
    for (const optim::TensorRun& run : optimizer.checkpoint_runs()) {
      const model::ParamEntry& e = layout.entries[run.entry];
      if (run.begin != 0 || run.end != e.numel) failures.push_back(e.name + " written in part");
      const bool expert_tensor = e.data_parallel_group == DataParallelGroup::expert;
      ++writers[expert_tensor ? e.name + "@" + std::to_string(expert_group(rank)) : e.name];
    }
  });
  for (const std::string& failure : failures) ADD_FAILURE() << failure;
  EXPECT_EQ(writers.size(), layout.entries.size() + 4);
  for (const auto& [name, count] : writers) EXPECT_EQ(count, 1) << name;
}

// One rank: the sharded strategy owns every bucket whole and steps as the plain one; copies that
// are not primary (a tied embedding's second copy) are updated and read back but never written.
TEST(DistributedOptimizer, OneRankUpdatesEverythingAndWritesPrimaryCopiesOnly) {
  std::vector<model::DeclaredParam> declared = mt::testing::moe_declarations();
  declared.push_back(mt::testing::declared_tensor("embedding.word_embeddings.weight", {40, 24}, 2, 9));
  declared.back().entry.replica = 1;  // the head's tied copy
  const model::ParamLayout layout = model::lay_out(declared, {model::ChunkBlocks{{0, 2, true, true}, {}, {}, {}}},
                                                   DistributedOptimizer::bucket_options(moe_parallel(true)));
  auto single = comm::make_single_communicator();
  const backend::Ops& ops = backend::cpu_ops();
  std::vector<std::vector<float>> results;
  for (ShardingStrategy strategy : {ShardingStrategy::no_shard, ShardingStrategy::optim}) {
    std::vector<float> params = initial_parameters(layout), grads(params.size());
    optim::DistributedOptimizerOptions options;
    options.sharding = strategy;
    DistributedOptimizer optimizer(layout, options, optim::ReductionGroups::single(*single), ops, params.data(),
                                   grads.data(), nullptr);
    optimizer.begin_grad_sync();
    for (const model::ParamEntry& e : layout.entries) {
      for (int64_t i = 0; i < e.numel; ++i) grads[static_cast<size_t>(e.offset + i)] = grad_value(0, i);
    }
    optimizer.finish_grad_sync();
    optimizer.step(kLr, kGradScale);
    results.push_back(params);
    EXPECT_EQ(optimizer.state_runs().size(), layout.entries.size());
    EXPECT_EQ(optimizer.checkpoint_runs().size(), layout.entries.size() - 1);
    for (const optim::TensorRun& run : optimizer.checkpoint_runs()) {
      EXPECT_TRUE(layout.entries[run.entry].primary()) << layout.entries[run.entry].name;
      EXPECT_EQ(run.end - run.begin, layout.entries[run.entry].numel);
    }
  }
  EXPECT_EQ(results[0], results[1]);
}

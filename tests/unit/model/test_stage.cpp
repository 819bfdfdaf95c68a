// Stages (model/stage.h): a model split into two chunks on one rank, activations passed by hand,
// equals the one-chunk model bit for bit; several activation slots in flight (forward 0, forward
// 1, backward 0, backward 1) give the grads of running the micro-batches one after the other; the
// grads-ready signal names each layer once its grads are final; the before-forward signal names
// each layer before forward reads its parameters; and tensor parallelism of degree
// 2 (two ranks as two threads over an in-process communicator) matches degree 1, with and without
// sequence parallelism, so the layers really run on the layout's local widths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "model/init.h"
#include "model/stage.h"
#include "../random_samples.h"
#include "../thread_communicator.h"
#include "../tiny_models.h"

using namespace mt;
using namespace mt::model;

namespace {

using mt::testing::make_samples;
using mt::testing::Samples;

ModelConfig tiny(bool llama, int layers = 4) { return mt::testing::gradient_model(llama, layers, 0.1f); }

// A rank's model: its layout, parameters, grads, GEMM weight copy and one stage per chunk.
struct RankModel {
  RankModel(const ModelConfig& c, const ParamLayout& rank_layout, const ParallelContext& parallel,
            StageOptions options)
      : hidden(c.hidden_size),
        layout(rank_layout),
        params(static_cast<size_t>(layout.total_elements)),
        grads(params.size(), 0.0f),
        weights(backend::cpu_ops(), options.precision, layout.total_elements) {
    initialize_parameters(layout, 11, params.data());
    weights.refresh(params.data());
    for (size_t chunk = 0; chunk < layout.chunks.size(); ++chunk) {
      stages.push_back(std::make_unique<Stage>(c, layout, static_cast<int>(chunk), parallel, backend::cpu_ops(),
                                               weights, options));
      stages.back()->bind(params.data(), grads.data());
    }
  }
  // Forward of slot `slot` through every chunk, activations handed over by hand: received in
  // place into the next stage's input buffer, or (in_place false) passed from a buffer of ours.
  LossSums forward(int slot, const MicroBatch& micro_batch, uint64_t iteration, bool in_place = true) {
    const float* activation = nullptr;
    double sums[2] = {0, 0};  // the last stage adds to them (the CPU table's memory is the host's)
    MicroBatch batch = micro_batch;
    batch.loss_sums = sums;
    for (auto& stage : stages) {
      const float* input = activation;
      if (activation) {
        const int64_t count = static_cast<int64_t>(batch.batch) * batch.seq * hidden;
        float* receive = stage->input_buffer(slot);
        if (!in_place) {
          handed_over.resize(static_cast<size_t>(count));
          receive = handed_over.data();
        }
        std::copy(activation, activation + count, receive);
        input = receive;
      }
      const StageOutput out = stage->forward(slot, batch, input, ForwardPass{iteration, true});
      activation = out.activation;
    }
    return LossSums{sums[0], sums[1]};
  }
  void backward(int slot, float dloss_scale) {
    const float* grad = nullptr;
    for (auto stage = stages.rbegin(); stage != stages.rend(); ++stage) {
      grad = (*stage)->backward(slot, grad, dloss_scale);
    }
  }
  // Grads of every parameter by name.
  std::vector<float> grad_of(const std::string& name) const {
    const ParamEntry& e = layout.find(name);
    return {grads.begin() + e.offset, grads.begin() + e.offset + e.numel};
  }

  int hidden;
  ParamLayout layout;
  std::vector<float> params, grads, handed_over;
  GemmWeights weights;
  std::vector<std::unique_ptr<Stage>> stages;
};

ParamLayout chunked_layout(const ModelConfig& c, const std::vector<ChunkSpec>& chunks, int tp = 1, int tp_rank = 0,
                           bool sequence_parallel = false) {
  parallel::ParallelConfig parallel;
  parallel.tensor_model_parallel_size = tp;
  parallel.sequence_parallel = sequence_parallel;
  parallel::RankCoordinates rank;
  rank.tp = tp_rank;
  return build_layout(c, parallel, rank, chunks);
}

std::vector<ChunkSpec> one_chunk(const ModelConfig& c) { return {{0, c.num_layers, true, true}}; }
std::vector<ChunkSpec> two_chunks(const ModelConfig& c, int k) {
  return {{0, k, true, false}, {k, c.num_layers, false, true}};
}

void expect_same_grads(const RankModel& a, const RankModel& b, const std::string& what) {
  ASSERT_EQ(a.layout.entries.size(), b.layout.entries.size()) << what;
  for (const ParamEntry& e : a.layout.entries) {
    EXPECT_EQ(a.grad_of(e.name), b.grad_of(e.name)) << what << ": " << e.name;
  }
}

const RecomputeConfig kRecomputePolicies[] = {
    {},
    {RecomputeGranularity::selective, RecomputeMethod::uniform, 1},
    {RecomputeGranularity::full, RecomputeMethod::uniform, 2},
    {RecomputeGranularity::full, RecomputeMethod::block, 1},
};

}  // namespace

TEST(Stage, TwoChunksOnOneRankEqualOneChunkBitForBit) {
  for (bool llama : {false, true}) {
    for (Precision precision : {Precision::fp32, Precision::bf16}) {
      for (const RecomputeConfig& recompute : kRecomputePolicies) {
        const ModelConfig c = tiny(llama);
        SCOPED_TRACE(std::string(llama ? "llama " : "gpt ") + precision_name(precision) + " recompute " +
                     std::to_string(static_cast<int>(recompute.granularity)));
        const Samples samples = make_samples(c, 2, 3);
        const ParallelContext single;
        StageOptions options{.precision = precision, .recompute = recompute, .micro_batch_size = 2, .seed = 5};
        RankModel whole(c, chunked_layout(c, one_chunk(c)), single, options);
        RankModel split(c, chunked_layout(c, two_chunks(c, 1)), single, options);
        ASSERT_EQ(split.stages.size(), 2u);
        EXPECT_TRUE(split.stages[0]->is_first() && !split.stages[0]->is_last());
        EXPECT_TRUE(!split.stages[1]->is_first() && split.stages[1]->is_last());
        const MicroBatch batch = samples.micro_batch(0, 2, c.seq_length);
        const LossSums a = whole.forward(0, batch, 7);
        const LossSums b = split.forward(0, batch, 7, /*in_place=*/false);
        EXPECT_EQ(a.loss, b.loss);
        EXPECT_EQ(a.tokens, b.tokens);
        whole.backward(0, 0.5f);
        split.backward(0, 0.5f);
        expect_same_grads(whole, split, "two chunks");
      }
    }
  }
}

TEST(Stage, SlotsInFlightGiveTheGradsOfSequentialMicroBatches) {
  for (bool llama : {false, true}) {
    for (const RecomputeConfig& recompute : kRecomputePolicies) {
      const ModelConfig c = tiny(llama);
      SCOPED_TRACE(std::string(llama ? "llama" : "gpt") + " recompute " +
                   std::to_string(static_cast<int>(recompute.granularity)));
      const Samples samples = make_samples(c, 4, 4);
      const ParallelContext single;
      const MicroBatch first = samples.micro_batch(0, 2, c.seq_length);
      const MicroBatch second = samples.micro_batch(1, 2, c.seq_length);

      const StageOptions one_slot{.recompute = recompute, .micro_batch_size = 2, .seed = 5};
      StageOptions two_slots = one_slot;
      two_slots.activation_slots = 2;
      RankModel sequential(c, chunked_layout(c, two_chunks(c, 2)), single, one_slot);
      const LossSums a0 = sequential.forward(0, first, 3);
      sequential.backward(0, 0.25f);
      const LossSums a1 = sequential.forward(0, second, 3);
      sequential.backward(0, 0.75f);

      RankModel in_flight(c, chunked_layout(c, two_chunks(c, 2)), single, two_slots);
      EXPECT_EQ(in_flight.stages[0]->activation_slots(), 2);
      const LossSums b0 = in_flight.forward(0, first, 3);
      const LossSums b1 = in_flight.forward(1, second, 3);
      in_flight.backward(0, 0.25f);
      in_flight.backward(1, 0.75f);
      EXPECT_EQ(a0.loss, b0.loss);
      EXPECT_EQ(a1.loss, b1.loss);
      expect_same_grads(sequential, in_flight, "two slots");
      // Twice the slots, twice the kept activations; the shared workspace is not doubled.
      EXPECT_GT(in_flight.stages[0]->activation_bytes(), sequential.stages[0]->activation_bytes());
      EXPECT_LT(in_flight.stages[0]->activation_bytes(), 2 * sequential.stages[0]->activation_bytes());
      EXPECT_THROW(in_flight.stages[1]->backward(1, nullptr, 1.0f), Error);  // slot 1 already went backward
      EXPECT_THROW(in_flight.forward(2, first, 3), Error);                   // no third slot
    }
  }
}

TEST(Stage, GradsReadyNamesEachLayerOnceItsGradsAreFinal) {
  for (const RecomputeConfig& recompute : kRecomputePolicies) {
    const ModelConfig c = tiny(true);
    const Samples samples = make_samples(c, 2, 5);
    const ParallelContext single;
    const StageOptions options{.recompute = recompute, .micro_batch_size = 2, .seed = 5};
    RankModel model(c, chunked_layout(c, two_chunks(c, 2)), single, options);
    std::vector<int> signalled;
    std::vector<std::vector<float>> snapshots;  // the layer's grads when it was signalled
    auto on_ready = [&](int layer) {
      signalled.push_back(layer);
      std::vector<float> grads;
      for (const ParamEntry& e : model.layout.entries) {
        if (e.layer == layer) {
          const auto g = model.grad_of(e.name);
          grads.insert(grads.end(), g.begin(), g.end());
        }
      }
      snapshots.push_back(grads);
    };
    for (auto& stage : model.stages) stage->on_grads_ready(on_ready);
    model.forward(0, samples.micro_batch(0, 2, c.seq_length), 1);
    model.backward(0, 1.0f);
    EXPECT_EQ(signalled, (std::vector<int>{head_layer(c), 3, 2, 1, 0, kEmbeddingLayer}));
    for (size_t i = 0; i < signalled.size(); ++i) {
      std::vector<float> final_grads;
      for (const ParamEntry& e : model.layout.entries) {
        if (e.layer == signalled[i]) {
          const auto g = model.grad_of(e.name);
          final_grads.insert(final_grads.end(), g.begin(), g.end());
        }
      }
      ASSERT_FALSE(final_grads.empty());
      EXPECT_EQ(snapshots[i], final_grads) << "layer " << signalled[i] << " changed after its signal";
      double norm = 0;
      for (float g : final_grads) norm += g * g;
      EXPECT_GT(norm, 0.0) << "layer " << signalled[i] << " signalled before its grads were computed";
    }
  }
}

// Parameters that arrive late (an overlapped all-gather) are in time when each layer's arrive in
// its before-forward signal: every parameter starts zeroed, the signal copies in the layer's real
// values, and forward and backward give the reference's numbers bit for bit.
TEST(Stage, BeforeForwardNamesEachLayerBeforeItsParametersAreRead) {
  for (const RecomputeConfig& recompute : kRecomputePolicies) {
    const ModelConfig c = tiny(true);
    const Samples samples = make_samples(c, 2, 5);
    const MicroBatch batch = samples.micro_batch(0, 2, c.seq_length);
    const ParallelContext single;
    const StageOptions options{.precision = Precision::bf16, .recompute = recompute, .micro_batch_size = 2, .seed = 5};
    RankModel reference(c, chunked_layout(c, two_chunks(c, 2)), single, options);
    RankModel late(c, chunked_layout(c, two_chunks(c, 2)), single, options);
    const std::vector<float> real = late.params;
    std::fill(late.params.begin(), late.params.end(), 0.0f);
    late.weights.refresh(late.params.data());
    std::vector<int> signalled;
    for (auto& stage : late.stages) {
      stage->on_before_forward([&](int layer) {
        signalled.push_back(layer);
        for (const ParamEntry& e : late.layout.entries) {
          if (e.layer != layer) continue;
          std::copy(real.begin() + e.offset, real.begin() + e.offset + e.numel, late.params.begin() + e.offset);
          late.weights.refresh(late.params.data(), e.offset, e.offset + e.numel);
        }
      });
    }
    const LossSums expected = reference.forward(0, batch, 1);
    const LossSums got = late.forward(0, batch, 1);
    EXPECT_EQ(signalled, (std::vector<int>{kEmbeddingLayer, 0, 1, 2, 3, head_layer(c)}));
    EXPECT_EQ(got.loss, expected.loss);
    reference.backward(0, 1.0f);
    late.backward(0, 1.0f);
    EXPECT_EQ(late.grads, reference.grads);
  }
}

// --- tensor parallelism over threads ------------------------------------------------------------

namespace {

using mt::testing::ThreadCommunicator;
using mt::testing::ThreadGroup;

// |a - b| <= tol * (|b| + rms(b)) + absolute, elementwise.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol, double absolute,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double squares = 0;
  for (float v : b) squares += double(v) * v;
  const double scale = std::sqrt(squares / std::max<size_t>(1, b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_LE(std::fabs(double(a[i]) - b[i]), tol * (std::fabs(b[i]) + scale) + absolute) << what << "[" << i << "]";
  }
}

// This rank's slice of a whole (single-rank) tensor: rows or columns of its shard.
std::vector<float> shard_of(const ParamEntry& shard, const ParamEntry& whole, const std::vector<float>& buffer) {
  std::vector<float> slice;
  const int64_t cols = whole.global_shape.size() == 2 ? whole.global_shape[1] : 1;
  const int64_t local_cols = shard.local_shape.size() == 2 ? shard.local_shape[1] : 1;
  for (int64_t i = 0; i < shard.numel; ++i) {
    const int64_t row = i / local_cols + (shard.shard_dim == 0 ? shard.shard_offset : 0);
    const int64_t col = i % local_cols + (shard.shard_dim == 1 ? shard.shard_offset : 0);
    slice.push_back(buffer[static_cast<size_t>(whole.offset + row * cols + col)]);
  }
  return slice;
}

void expect_tensor_parallel_matches_single_rank(bool llama, bool sequence_parallel,
                                                RecomputeGranularity granularity) {
  ModelConfig c = tiny(llama, 2);
  c.vocab_size = 45;  // the padded 48 splits 24 + 24: rank 1 holds 21 real columns and 3 of padding
  const Samples samples = make_samples(c, 2, 6);
  const MicroBatch batch = samples.micro_batch(0, 2, c.seq_length);
  const StageOptions options{.recompute = {granularity, RecomputeMethod::uniform, 1}, .micro_batch_size = 2, .seed = 5};
  const ParallelContext single;
  RankModel reference(c, chunked_layout(c, one_chunk(c)), single, options);
  const LossSums expected = reference.forward(0, batch, 2);
  reference.backward(0, 1.0f / 16);

  ThreadGroup group(2);
  LossSums losses[2];
  std::vector<std::unique_ptr<RankModel>> ranks(2);
  std::vector<std::thread> threads;
  std::exception_ptr failures[2];
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator tensor_group(group, r);
        const ParallelContext parallel(&tensor_group, sequence_parallel);
        auto& rank = ranks[static_cast<size_t>(r)];
        rank = std::make_unique<RankModel>(c, chunked_layout(c, one_chunk(c), 2, r, sequence_parallel), parallel,
                                           options);
        losses[r] = rank->forward(0, batch, 2);
        rank->backward(0, 1.0f / 16);
        rank->stages.clear();  // before the context goes
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }

  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(losses[r].loss, expected.loss, 1e-5 * std::fabs(expected.loss));
    EXPECT_EQ(losses[r].tokens, expected.tokens);
    const RankModel& rank = *ranks[static_cast<size_t>(r)];
    for (const ParamEntry& e : rank.layout.entries) {
      std::vector<float> local = rank.grad_of(e.name);
      if (e.reduce_over_tensor_parallel) {
        // Sequence parallelism leaves partial grads of replicated tensors: summed over TP
        // (Megatron's finalize_model_grads), they are the whole grad.
        const std::vector<float> other = ranks[static_cast<size_t>(1 - r)]->grad_of(e.name);
        for (size_t i = 0; i < local.size(); ++i) local[i] += other[i];
      }
      // The key bias's grad is analytically zero (it shifts every score of a row alike): both
      // sides hold round-off only, compared in absolute terms.
      const bool zero_gradient = e.name.find("linear_k.bias") != std::string::npos;
      expect_close(local, shard_of(e, reference.layout.find(e.name), reference.grads), 1e-4,
                   zero_gradient ? 1e-7 : 0.0, "rank " + std::to_string(r) + " " + e.name);
    }
  }
}

}  // namespace

TEST(Stage, TensorParallelOverTwoRanksMatchesOneRank) {
  for (bool llama : {false, true}) {
    for (bool sequence_parallel : {false, true}) {
      for (RecomputeGranularity granularity : {RecomputeGranularity::selective, RecomputeGranularity::full}) {
        SCOPED_TRACE(std::string(llama ? "llama" : "gpt") + (sequence_parallel ? " sp" : "") +
                     (granularity == RecomputeGranularity::full ? " full recompute" : " selective recompute"));
        expect_tensor_parallel_matches_single_rank(llama, sequence_parallel, granularity);
      }
    }
  }
}

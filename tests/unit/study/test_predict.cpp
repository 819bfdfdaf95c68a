// The step-time predictor (lib/study/predict.h) on a made-up cluster with round numbers, so each
// term can be worked out by hand: collectives by the alpha-beta formulas, NVLink without NVSwitch,
// the bubble, overlap, FSDP's reduce-scatters, eager element-wise work.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "study/predict.h"

using namespace mt::study;

namespace {

Cluster round_cluster() {
  Cluster c;
  c.name = "test";
  c.device = "h100";
  c.gpus_per_node = 8;
  c.nvlink_gbps = 100;   // 1e11 B/s
  c.network_gbps = 10;   // 1e10 B/s
  c.nvlink_latency_us = 0;
  c.network_latency_us = 0;
  return c;
}

PredictorConstants exact_links() {
  PredictorConstants k = fitted_constants();
  k.link_efficiency = 1.0;
  return k;
}

TrainingShape bf16_shape() {
  TrainingShape s;
  s.precision = mt::Precision::bf16;
  s.micro_batch_size = 1;
  return s;
}

}  // namespace

TEST(Predict, TensorParallelCollectivesByHand) {
  auto c = mt::model::preset("llama3-8b");
  c.num_layers = 4;
  c.seq_length = 1024;
  TrainingShape s = bf16_shape();
  s.parallel.tensor_model_parallel_size = 2;
  const StepPrediction p = predict_step(c, s, round_cluster(), exact_links());
  // Per layer two all-reduces of N h bf16 = 1024 x 4096 x 2 bytes over 2 ranks, 2(n-1)/n = 1:
  // 8,388,608 / 1e11 s each; forward and backward: x2; 4 layers.
  EXPECT_NEAR(p.tp_comm, 4 * 2 * 2 * 8388608 / 1e11, 1e-12);
  // With SP: all-gather + reduce-scatter, (n-1)/n = 1/2 each: the same bytes on the wire.
  s.parallel.sequence_parallel = true;
  EXPECT_NEAR(predict_step(c, s, round_cluster(), exact_links()).tp_comm, p.tp_comm, 1e-12);
  // Full recompute repeats the forward's two.
  s.recompute.granularity = mt::model::RecomputeGranularity::full;
  EXPECT_NEAR(predict_step(c, s, round_cluster(), exact_links()).tp_comm, 1.5 * p.tp_comm, 1e-12);
}

TEST(Predict, WithoutNvswitchAGroupRidesOnlyTheLinksToItsMembers) {
  // Four GPUs a node, each GPU's links split evenly over its 3 peers (an HGX 4-GPU board): TP 2
  // uses the one pair's third of the 1e11 B/s, TP 4 all of it.
  auto c = mt::model::preset("llama3-8b");
  c.num_layers = 4;
  c.seq_length = 1024;
  Cluster mesh = round_cluster();
  mesh.gpus_per_node = 4;
  mesh.nvswitch = false;
  Cluster switched = mesh;
  switched.nvswitch = true;
  TrainingShape s = bf16_shape();
  s.parallel.tensor_model_parallel_size = 2;
  // 4 layers x 2 passes x 2 all-reduces of 8,388,608 bytes, 2(n-1)/n = 1, at 1e11 / 3 B/s.
  EXPECT_NEAR(predict_step(c, s, mesh, exact_links()).tp_comm, 4 * 2 * 2 * 8388608 * 3 / 1e11, 1e-12);
  EXPECT_NEAR(predict_step(c, s, switched, exact_links()).tp_comm, 4 * 2 * 2 * 8388608 / 1e11, 1e-12);
  s.parallel.tensor_model_parallel_size = 4;
  EXPECT_NEAR(predict_step(c, s, mesh, exact_links()).tp_comm, predict_step(c, s, switched, exact_links()).tp_comm,
              1e-15);
}

TEST(Predict, EagerElementwiseWorkMovesMoreBytes) {
  // tiny-llama (h 64, q 64, k + v 64, ffn 176), 64 tokens, no TP: per token and layer the norms
  // 2 x 2 x 64, the residual adds 2 x 3 x 64, RoPE 2 x 128 and SwiGLU 3 x 176 bf16 values, 2,848
  // bytes; forward and backward (3 passes), 2 layers; the cross-entropy reads and writes the fp32
  // logits (64 x 256) 4 times. At 0.8 of the H100's 3.35 TB/s.
  const auto c = mt::model::preset("tiny-llama");
  const TrainingShape s = bf16_shape();
  const double hbm = 3.35e12 * 0.8, layers = 6 * 64 * 2848 / hbm, logits = 4 * 64 * 256 * 4 / hbm;
  const StepPrediction fused = predict_step(c, s, round_cluster(), exact_links());
  EXPECT_NEAR(fused.elementwise, layers + logits, 1e-18);
  // Eager PyTorch: the layers' element-wise work moves 3.2 times the bytes (the logits' do not change).
  RunOptions eager;
  eager.fused_elementwise = false;
  const StepPrediction slow = predict_step(c, s, round_cluster(), exact_links(), eager);
  EXPECT_NEAR(slow.elementwise, 3.2 * layers + logits, 1e-18);
  EXPECT_EQ(slow.gemm, fused.gemm);
}

TEST(Predict, DataParallelAllReduceAndItsOverlap) {
  auto c = mt::model::preset("tiny-llama");
  TrainingShape s = bf16_shape();
  s.parallel.data_parallel_size = 4;
  RunOptions no_overlap;
  no_overlap.overlap_grad_reduce = false;
  const StepPrediction p = predict_step(c, s, round_cluster(), exact_links(), no_overlap);
  // fp32 grads of every parameter (padded vocabulary), ring all-reduce over 4 ranks in a node:
  // 2 (3/4) x 4 bytes x params / 1e11.
  const double params = 2 * (128 + 12288 + 33792) + 2 * 256 * 64 + 64;
  EXPECT_NEAR(p.dp_comm, 1.5 * 4 * params / 1e11, 1e-15);
  // Overlapped with the backward: only the last bucket (here everything: one bucket) or what
  // outlasts the backward stays exposed.
  RunOptions small_buckets;
  small_buckets.bucket_elements = 1000;
  const StepPrediction overlapped = predict_step(c, s, round_cluster(), exact_links(), small_buckets);
  const double pass = overlapped.gemm + overlapped.attention + overlapped.elementwise;  // one micro-batch
  EXPECT_NEAR(overlapped.dp_comm, std::max(p.dp_comm * 1000 / params, p.dp_comm - pass * 2 / 3), 1e-15);
  EXPECT_LT(overlapped.dp_comm, p.dp_comm);
  // Across nodes the network's bandwidth applies: 8 ranks at stride 2 span 16 GPUs.
  s.parallel.data_parallel_size = 8;
  s.parallel.tensor_model_parallel_size = 2;
  const StepPrediction across = predict_step(c, s, round_cluster(), exact_links(), no_overlap);
  EXPECT_NEAR(across.dp_comm, 2.0 * 7 / 8 * 4 * (params - 2 * (12288 + 33792) / 2 - 2 * 256 * 64 / 2) / 1e10,
              across.dp_comm * 1e-9);
}

TEST(Predict, PipelineBubbleIsPMinusOneOverVM) {
  auto c = mt::model::preset("tiny-llama");
  c.num_layers = 8;
  TrainingShape s = bf16_shape();
  s.parallel.pipeline_model_parallel_size = 4;
  s.global_batch_size = 8;
  const StepPrediction p = predict_step(c, s, round_cluster(), exact_links());
  const double pipeline = p.gemm + p.attention + p.elementwise + p.tp_comm + p.cp_comm + p.ep_comm + p.pp_comm;
  EXPECT_NEAR(p.bubble / pipeline, 3.0 / 8, 1e-12);
  s.parallel.num_virtual_stages_per_pipeline_rank = 2;
  const StepPrediction v = predict_step(c, s, round_cluster(), exact_links());
  const double pipeline_v = v.gemm + v.attention + v.elementwise + v.tp_comm + v.cp_comm + v.ep_comm + v.pp_comm;
  EXPECT_NEAR(v.bubble / pipeline_v, 3.0 / (2 * 8), 1e-12);
}

TEST(Predict, UnevenStagesWithVirtualStages) {
  // 6 layers, 2 stages of 2 chunks, 2 layers on the first and 4 on the last (a layout mt-train
  // runs): the last stage, with twice the layers and the head, is the slowest, and the bubble is
  // (p - 1)/v of its pass.
  auto c = mt::model::preset("tiny-llama");
  c.num_layers = 6;
  TrainingShape s = bf16_shape();
  s.parallel.pipeline_model_parallel_size = 2;
  s.parallel.num_virtual_stages_per_pipeline_rank = 2;
  s.parallel.decoder_first_pipeline_num_layers = 2;
  s.parallel.decoder_last_pipeline_num_layers = 4;
  s.global_batch_size = 4;
  const StepPrediction p = predict_step(c, s, round_cluster(), exact_links());
  EXPECT_EQ(p.slowest_stage, 1);
  const double pipeline = p.gemm + p.attention + p.elementwise + p.tp_comm + p.cp_comm + p.ep_comm + p.pp_comm;
  EXPECT_NEAR(p.bubble / pipeline, 1.0 / (2 * 4), 1e-12);
}

TEST(Predict, GemmEfficiencyFallsWithSmallShapesAndBandwidthHelps) {
  const auto c = mt::model::preset("llama3-8b");
  TrainingShape s = bf16_shape();
  const StepPrediction one = predict_step(c, s, round_cluster(), exact_links());
  // 8 GPUs, TP 8: every GEMM 8 times narrower; compute per GPU more than an eighth.
  s.parallel.tensor_model_parallel_size = 8;
  const StepPrediction eight = predict_step(c, s, round_cluster(), exact_links());
  EXPECT_GT(eight.gemm, one.gemm / 8);
  Cluster fast = round_cluster();
  fast.nvlink_gbps = 1000;
  EXPECT_LT(predict_step(c, s, fast, exact_links()).step_seconds, eight.step_seconds);
  EXPECT_THROW(find_cluster("dgx-h1000"), mt::UsageError);
  EXPECT_EQ(find_cluster("dgx-h100").device, "h100");
}

TEST(Predict, FsdpExposesTheRootAndFirstLayerAndHidesTheRest) {
  // tiny-llama: 2 layers of 46,208 (norms 128, attention 12,288, MLP 33,792); the root holds the
  // embedding and the untied output layer (256 x 64 each, the padded vocabulary) and the final
  // norm (64): 32,832. 125,248 in all.
  auto c = mt::model::preset("tiny-llama");
  TrainingShape s = bf16_shape();
  s.parallel.data_parallel_size = 4;  // inside a node: 1e11 B/s
  s.fsdp = true;
  // Per micro-batch, each over 4 ranks ((n-1)/n = 3/4): a bf16 gather for forward and one for
  // backward, an fp32 reduce-scatter. The root and the first layer (79,040) have nothing to
  // overlap with: 3/4 x (2 + 4) x 79,040 / 1e11 = 3.5568 us. The rest, 3/4 x 8 x 125,248 / 1e11
  // - 3.5568 us = 3.95808 us, hides behind the micro-batch's compute.
  const double exposed = 3.5568e-6, hidden = 3.95808e-6;
  const StepPrediction one = predict_step(c, s, round_cluster(), exact_links());
  const double pass = one.gemm + one.attention + one.elementwise;
  EXPECT_NEAR(one.dp_comm, std::max(0.0, hidden - pass) + exposed, 1e-15);
  // With enough compute per micro-batch only the root and the first layer stay exposed, once
  // per micro-batch.
  s.micro_batch_size = 64;
  s.global_batch_size = 512;  // two micro-batches a rank
  const StepPrediction big = predict_step(c, s, round_cluster(), exact_links());
  ASSERT_GT((big.gemm + big.attention + big.elementwise) / 2, hidden);
  EXPECT_NEAR(big.dp_comm, 2 * exposed, 1e-15);
  // Grads reduce-scattered once a step (FSDP2's set_requires_gradient_sync(False) on the first
  // micro-batch): the root's and first layer's bf16 gather, 3/4 x 2 x 79,040 / 1e11 = 1.1856 us,
  // stays exposed on both micro-batches, their fp32 reduce-scatter, 2.3712 us, only on the last.
  RunOptions once;
  once.fsdp_reduce_every_microbatch = false;
  EXPECT_NEAR(predict_step(c, s, round_cluster(), exact_links(), once).dp_comm, 2 * 1.1856e-6 + 2.3712e-6, 1e-15);
}

TEST(Predict, FsdpGathersAnEmbeddingTpLeavesWhole) {
  // tiny-llama at TP 2 x FSDP 2 (stride 2, inside a node: 1e11 B/s, (n-1)/n = 1/2). A TP rank's
  // root: half the embedding and half the output layer (8,192 each) and the final norm (64);
  // its first layer: norms 128, half of attention 6,144 and of the MLP 16,896. 39,616 exposed,
  // 1/2 x (2 + 4) x 39,616 / 1e11 per micro-batch, two micro-batches.
  auto c = mt::model::preset("tiny-llama");
  TrainingShape s = bf16_shape();
  s.parallel.tensor_model_parallel_size = 2;
  s.parallel.data_parallel_size = 2;
  s.fsdp = true;
  s.micro_batch_size = 64;
  s.global_batch_size = 256;
  const StepPrediction sharded = predict_step(c, s, round_cluster(), exact_links());
  ASSERT_GT((sharded.gemm + sharded.attention + sharded.elementwise) / 2, 1e-5);  // every other unit hides
  EXPECT_NEAR(sharded.dp_comm, 2 * 3 * 39616 / 1e11, 1e-15);
  // The embedding whole on both TP ranks: the root gathers 8,192 more.
  RunOptions whole;
  whole.tp_sharded_embedding = false;
  EXPECT_NEAR(predict_step(c, s, round_cluster(), exact_links(), whole).dp_comm, 2 * 3 * (39616 + 8192) / 1e11, 1e-15);
  // Without TP there is nothing more to hold.
  s.parallel.tensor_model_parallel_size = 1;
  EXPECT_EQ(predict_step(c, s, round_cluster(), exact_links(), whole).dp_comm,
            predict_step(c, s, round_cluster(), exact_links()).dp_comm);
}

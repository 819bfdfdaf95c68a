// Step-time prediction for a configuration on a named cluster, without running it: a roofline
// per operation (GEMMs at a shape-dependent fraction of the dense peak, flash attention at its
// own fraction, element-wise work at the HBM bandwidth, fused or run op by op as eager PyTorch
// does), alpha-beta collectives on the links a process group spans (ring all-reduce 2(n-1)/n,
// all-gather and reduce-scatter (n-1)/n, p2p, all-to-all for EP; inside a node without NVSwitch
// a group gets only the links to its own members), the pipeline bubble (p-1)/(v m), Megatron's
// overlap of the data-parallel grad reduce-scatter with the last micro-batch's backward and of
// the param all-gather with the next forward (a bucket left exposed), FSDP's per-unit gathers and
// reduce-scatters (every micro-batch or once a step) overlapped with the micro-batch's compute
// except the root's (with the whole embedding when TP leaves it on every rank) and the first
// layer's, and the optimizer step. The constants are global (one set, fitted once on a named
// subset of published runs: docs/accounting.md, data/perf/published_runs.csv) and never per run.
// Tested in tests/unit/study/test_predict.cpp and tests/unit/study/test_published_runs.cpp.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"
#include "study/memory_model.h"

namespace mt::study {

struct Cluster {
  std::string name;
  std::string device;          // perf/peak.h device table
  int gpus_per_node = 8;
  double nvlink_gbps = 0;      // per GPU, one direction, GB/s
  double network_gbps = 0;     // per GPU (its NICs), one direction, GB/s
  double nvlink_latency_us = 0;
  double network_latency_us = 0;
  // true: NVSwitch, any group inside a node gets the GPU's whole NVLink bandwidth. false: each
  // GPU's links go directly to its peers, evenly (HGX 4-GPU boards: 18 links, 6 to each of 3), so
  // a group of g GPUs inside a node of G uses (g-1)/(G-1) of them.
  bool nvswitch = true;
  std::string source;
};

const std::vector<Cluster>& cluster_table();
// Throws mt::UsageError listing the known names.
const Cluster& find_cluster(const std::string& name);

// The predictor's constants; defaults are the fitted values (see fitted_constants()).
struct PredictorConstants {
  double gemm_efficiency = 0;       // fraction of the dense peak a large bf16 GEMM reaches
  double gemm_tile = 128;           // efficiency falls as eff / (1 + tile/m + tile/n + tile/k)
  double attention_efficiency = 0;  // flash attention, forward and backward
  double memory_efficiency = 0.8;   // achievable fraction of HBM bandwidth (element-wise work, optimizer)
  double link_efficiency = 0;       // achievable fraction of NVLink / network bandwidth (bus bandwidth)
  double eager_elementwise = 3.2;   // HBM traffic of a layer's element-wise work run op by op (eager
                                    // PyTorch) over the same work fused (docs/accounting.md)
};
// The constants fitted on the runs marked "fitted" in data/perf/published_runs.csv.
PredictorConstants fitted_constants();

// How the run overlaps communication (Megatron's flags; FSDP prefetches layer by layer) and how
// its software runs the step where stacks differ.
struct RunOptions {
  bool overlap_grad_reduce = true;   // --overlap-grad-reduce
  bool overlap_param_gather = true;  // --overlap-param-gather (with the distributed optimizer)
  bool tp_comm_overlap = false;      // --tp-comm-overlap: TP collectives hidden behind GEMMs
  int64_t bucket_elements = 40000000;  // --ddp-bucket-size: the last bucket is never hidden
  // Element-wise chains (norms, RoPE, activation, residual adds) fused into one kernel each
  // (mt's kernels, Megatron's fused kernels, torch.compile); false: eager PyTorch, op by op.
  bool fused_elementwise = true;
  // FSDP reduce-scatters each micro-batch's grads; false: the accumulation micro-batches keep
  // unsharded grads and only the step's last micro-batch reduce-scatters (PyTorch FSDP2's
  // set_requires_gradient_sync(False), FSDP1's no_sync()).
  bool fsdp_reduce_every_microbatch = true;
  // TP splits the input embedding over the vocabulary (Megatron's VocabParallelEmbedding); false:
  // every TP rank holds it whole (DTensor plans that leave it replicated), so FSDP's root unit
  // gathers and reduce-scatters all of it.
  bool tp_sharded_embedding = true;
};

struct StepPrediction {
  double step_seconds = 0;
  int slowest_stage = 0;
  // Per step, on the slowest stage (seconds): compute (GEMMs, attention, element-wise, recompute
  // included), exposed communication by kind, the pipeline bubble and the optimizer.
  double gemm = 0, attention = 0, elementwise = 0;
  double tp_comm = 0, cp_comm = 0, ep_comm = 0, pp_comm = 0, dp_comm = 0;
  double bubble = 0, optimizer = 0;
  double tokens_per_second = 0;  // the whole run
  int world_size = 0;
};

StepPrediction predict_step(const model::ModelConfig& model, const TrainingShape& shape, const Cluster& cluster,
                            const PredictorConstants& constants = fitted_constants(),
                            const RunOptions& options = {});

}  // namespace mt::study

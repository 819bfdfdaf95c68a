// The layout planner: for a model, a GPU count and a cluster, every valid layout (TP, PP, virtual
// stages, CP, EP, DP, micro-batch, recompute, distributed optimizer, FSDP) is enumerated, those
// whose predicted memory does not fit a device are dropped and the rest ranked by predicted
// throughput (study/predict.h), without trial runs. Tested in tests/unit/study/test_planner.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "study/memory_model.h"
#include "study/predict.h"

namespace mt::study {

enum class MemoryEstimate { mt, megatron };  // study/memory_model.h: mt's engine, or Megatron's formula

struct PlanRequest {
  int gpus = 0;
  std::string cluster;
  int global_batch_size = 0;              // sequences per step
  Precision precision = Precision::bf16;
  double memory_bytes = 0;                // per device; 0: the cluster device's memory
  MemoryEstimate memory = MemoryEstimate::mt;
  std::vector<int> micro_batch_sizes = {1, 2, 4, 8};
  int max_virtual_stages = 4;
  int top = 10;
};

struct PlanCandidate {
  TrainingShape shape;
  StepPrediction prediction;
  int64_t peak_bytes = 0;  // the most loaded stage's
  double mfu = 0;          // Megatron's convention, the device's dense peak
};

struct PlanResult {
  std::vector<PlanCandidate> best;  // ranked, at most `top`
  int64_t enumerated = 0;           // valid layouts
  int64_t fitting = 0;              // of those, the ones that fit
};

// Throws mt::UsageError for an unknown cluster or a GPU count or batch that no layout fits.
PlanResult plan_layouts(const model::ModelConfig& model, const PlanRequest& request);

}  // namespace mt::study

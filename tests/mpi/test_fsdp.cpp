// Megatron-FSDP (issue 25) in training against the single-rank run (tests/mpi/training_equivalence.h:
// the same tiny models, seed, data and schedule as tests/mpi/test_data_parallel.cpp, 10 steps,
// loss, grad norm and evaluation loss within the fp32 equivalence bound): --use-megatron-fsdp with
// --data-parallel-sharding-strategy optim_grads at DP=2 (2 ranks; tiny GPT, whose tied embedding's
// grads complete only after the embedding's backward, and tiny LLaMA, untied), DP=4 (tiny GPT) and
// TP=2 SP x DP=2 (tiny LLaMA) at 4 ranks, EOD-masked loss and hidden dropout 0.1, micro-batches
// accumulated (2 per DP rank at DP=2); the same for optim_grads_params (parameters sharded,
// gathered per unit; with prefetch, and at DP=2 without) and with --overlap-grad-reduce (each
// unit's reduce-scatter non-blocking during the next unit's backward: optim_grads_params at DP=2
// and TP=2 SP x DP=2, the MoE optim_grads layouts below). MoE: tiny-mixtral's routing and
// tiny-deepseek (dense and MoE layers, a shared expert) at EP=2 (optim_grads_params) and EP=1
// (optim_grads, overlapped) on 2 ranks, tiny-mixtral's at EP=2 x expert-DP=2 on 4 (both
// strategies, optim_grads overlapped); and
// runs in which EP rank 1's experts never receive a token
// (at 4 ranks while their expert-DP peer's do). Also: the unit grad reductions run on
// every micro-batch (Megatron-FSDP's grad_reduce_every_bprop), one per unit each; the unit gathers
// (twice per layer unit and micro-batch, the root once), prefetches and the share of their time
// hidden (none without prefetch, some with it); the memory the units hand
// back to their page pools (the ledger's grads and weights peaks against no_shard's, also with
// --overlap-grad-reduce; tests/unit/backend/test_device_memory.cpp tests the pool); the
// strategies the flags choose; and the refusals by name (PP with grad sharding, hybrid sharding,
// --no-fsdp-prefetch without optim_grads_params or with --overlap-param-gather).
// Run under mpirun at 2 and 4 ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/sample_source.h"
#include "optim/distributed_optimizer.h"
#include "parallel/process_groups.h"
#include "parallel/rank_grid.h"
#include "train/trainer.h"
#include "../unit/tiny_models.h"
#include "training_equivalence.h"

using namespace mt;

namespace {

const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new equivalence::WorldEnvironment);

struct FsdpLayout {
  std::string name;
  int tp = 1;
  bool sequence_parallel = false;
  std::string strategy = "optim_grads";
  std::vector<bool> llama_models{false, true};  // tiny GPT (tied embedding) and tiny LLaMA
  bool prefetch = true;                         // optim_grads_params: --no-fsdp-prefetch when false
  int ep = 1;                                   // --expert-model-parallel-size (MoE models)
  bool overlap_grad_reduce = false;             // --overlap-grad-reduce: unit reduce-scatters overlapped
};

parallel::ParallelConfig fsdp_config(const FsdpLayout& layout, const model::ModelConfig& model,
                                     const train::TrainConfig& config) {
  parallel::ParallelConfig parallel;
  parallel.tensor_model_parallel_size = layout.tp;
  parallel.sequence_parallel = layout.sequence_parallel;
  parallel.use_megatron_fsdp = true;
  parallel.data_parallel_sharding_strategy = layout.strategy;
  parallel.no_fsdp_prefetch = !layout.prefetch;
  parallel.expert_model_parallel_size = layout.ep;
  parallel.overlap_grad_reduce = layout.overlap_grad_reduce;
  parallel::validate(parallel, model::parallel_dimensions(model), {config.micro_batch_size, config.global_batch_size},
                     equivalence::world().size());
  return parallel;
}

// Mock data with documents (token 0 ends one) and Megatron's EOD-masked loss.
data::LoaderOptions eod_masked() {
  data::LoaderOptions options;
  options.eod_mask_loss = true;
  return options;
}

// The run of `layout` (its process groups over the world), `prepare` applied before it trains.
equivalence::RunNumbers fsdp_numbers(const FsdpLayout& layout, const model::ModelConfig& model,
                                     const train::TrainConfig& config, const data::SampleSource& data,
                                     const equivalence::PrepareTrainer& prepare = {}) {
  const parallel::ParallelConfig parallel = fsdp_config(layout, model, config);
  const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel), backend::cpu_ops(),
                                       backend::cpu_ops().default_stream());
  return equivalence::train_numbers(model, config, data, &groups, prepare);
}

std::vector<FsdpLayout> layouts_for_world(int world) {
  if (world == 2) return {{"FSDP=2 optim_grads"}};
  // At 4 ranks one model each (CI time): GPT's tied embedding at FSDP=4, LLaMA under TP=2 + SP.
  if (world == 4) {
    return {{"FSDP=4 optim_grads", 1, false, "optim_grads", {false}},
            {"TP=2 SP x FSDP=2 optim_grads", 2, true, "optim_grads", {true}}};
  }
  return {};
}

std::vector<FsdpLayout> param_sharding_layouts_for_world(int world) {
  if (world == 2) {
    return {{"FSDP=2 optim_grads_params", 1, false, "optim_grads_params"},
            {"FSDP=2 optim_grads_params --no-fsdp-prefetch", 1, false, "optim_grads_params", {false}, false},
            {"FSDP=2 optim_grads_params --overlap-grad-reduce", 1, false, "optim_grads_params", {false, true}, true, 1,
             true}};
  }
  if (world == 4) {
    return {{"FSDP=4 optim_grads_params", 1, false, "optim_grads_params", {false}},
            {"TP=2 SP x FSDP=2 optim_grads_params", 2, true, "optim_grads_params", {true}},
            {"TP=2 SP x FSDP=2 optim_grads_params --overlap-grad-reduce", 2, true, "optim_grads_params", {true}, true, 1,
             true}};
  }
  return {};
}

void expect_layouts_match_one_rank(const std::vector<FsdpLayout>& layouts) {
  ASSERT_FALSE(layouts.empty()) << "no FSDP layouts at this world size";
  for (const FsdpLayout& layout : layouts) {
    for (bool llama : layout.llama_models) {
      SCOPED_TRACE(layout.name + (llama ? ", tiny-llama" : ", tiny-gpt"));
      model::ModelConfig model = mt::testing::trainer_model(llama, 0.1f);
      const train::TrainConfig config = equivalence::ten_step_config();
      const equivalence::DocumentMockData data(model.vocab_size, model.seq_length, 7, eod_masked());
      const equivalence::RunNumbers reference = equivalence::one_rank_numbers(model, config, data);
      const equivalence::RunNumbers run = fsdp_numbers(layout, model, config, data);
      equivalence::expect_same_numbers(run, reference, config);
      EXPECT_EQ(run.eval_loss.size(), 2u);
    }
  }
}

// FSDP with experts: tiny-mixtral's routing on the trainer model (every layer MoE) and, at 2
// ranks (CI time), tiny-deepseek (MLA, the first layer dense, the second MoE with a shared expert
// and the expert bias) at the suite's sizes.
std::vector<model::ModelConfig> moe_models(int world) {
  if (world != 2) return {mt::testing::trainer_moe_model(false)};
  model::ModelConfig deepseek = model::preset("tiny-deepseek");
  const model::ModelConfig small = mt::testing::trainer_model(true);
  deepseek.vocab_size = small.vocab_size;
  deepseek.make_vocab_size_divisible_by = small.make_vocab_size_divisible_by;
  deepseek.seq_length = deepseek.max_position_embeddings = small.seq_length;
  return {mt::testing::trainer_moe_model(false), deepseek};
}

// At 2 ranks EP=2 (expert-DP 1: each rank its experts whole) and EP=1 (the experts sharded over
// DP=2 like the dense tensors); at 4 ranks EP=2 x expert-DP=2 beside DP=4.
std::vector<FsdpLayout> moe_layouts_for_world(int world) {
  if (world == 2) {
    return {{"EP=2 x FSDP=2 optim_grads_params", 1, false, "optim_grads_params", {}, true, 2},
            {"EP=1 x FSDP=2 optim_grads --overlap-grad-reduce", 1, false, "optim_grads", {}, true, 1, true}};
  }
  if (world == 4) {
    return {{"EP=2 x expert-DP=2 (FSDP=4) optim_grads_params", 1, false, "optim_grads_params", {}, true, 2},
            {"EP=2 x expert-DP=2 (FSDP=4) optim_grads --overlap-grad-reduce", 1, false, "optim_grads", {}, true, 2,
             true}};
  }
  return {};
}

// The expert bias of every MoE layer set so that experts [E/2, E) (EP rank 1's at EP=2) are
// never chosen: sigmoid scores are below 1, the bias -1000 (and no bias update).
void bias_out_upper_experts(train::Trainer& trainer) {
  for (const train::Trainer::ExpertBias& bias : trainer.expert_biases()) {
    const int experts = trainer.model_config().num_experts;
    std::vector<float> host(static_cast<size_t>(experts), 0.0f);
    std::fill(host.begin() + experts / 2, host.end(), -1000.0f);
    trainer.ops().copy(bias.data, host.data(), experts * static_cast<int64_t>(sizeof(float)),
                       backend::CopyKind::host_to_device, trainer.ops().default_stream());
    trainer.ops().synchronize(trainer.ops().default_stream());
  }
}

// A model whose units span many pages (a transformer layer of about 200k floats), for memory.
model::ModelConfig paged_model() {
  model::ModelConfig model = mt::testing::trainer_model(true);
  model.hidden_size = 128;
  model.num_attention_heads = 4;
  model.num_query_groups = 4;
  model.ffn_hidden_size = 384;
  model.num_layers = 4;
  model.vocab_size = 500;
  return model;
}

// Peaks of the weights and grads categories of this rank's ledger after one step under `strategy`.
struct UnitMemory {
  int64_t weights_peak = 0, grads_peak = 0, grads_live = 0, weights_live = 0;
  int64_t elements = 0, largest_bucket = 0, root_buckets = 0;
  int64_t gathers = 0, prefetched = 0, gathered_buckets = 0;
  double gather_seconds = 0, wait_seconds = 0;
};

UnitMemory one_step_memory(const std::string& strategy, bool prefetch = true, bool overlap_grad_reduce = false) {
  FsdpLayout layout{strategy, 1, false, strategy, {true}, prefetch, 1, overlap_grad_reduce};
  const model::ModelConfig model = paged_model();
  train::TrainConfig config = equivalence::ten_step_config();
  config.train_iters = 1;
  config.lr_warmup_iters = 0;
  const auto data = data::make_mock_data(model.vocab_size, model.seq_length, 77);
  const parallel::ParallelConfig parallel = fsdp_config(layout, model, config);
  const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel), backend::cpu_ops(),
                                       backend::cpu_ops().default_stream());
  train::Trainer trainer(model, config, *data, backend::cpu_ops(), &groups);
  trainer.train_step();
  UnitMemory m;
  m.weights_peak = trainer.memory().peak(backend::MemoryCategory::weights);
  m.grads_peak = trainer.memory().peak(backend::MemoryCategory::grads);
  m.weights_live = trainer.memory().live(backend::MemoryCategory::weights);
  m.grads_live = trainer.memory().live(backend::MemoryCategory::grads);
  m.elements = trainer.layout().total_elements;
  for (const model::GradBucket& bucket : trainer.layout().buckets) {
    const int64_t size = bucket.padded_end - bucket.begin;
    if (bucket.first_layer >= 0 && bucket.first_layer < model.num_layers) {
      m.largest_bucket = std::max(m.largest_bucket, size);
    } else {
      m.root_buckets += size;
    }
  }
  if (const optim::UnitParamGatherer* gatherer = trainer.optimizer().unit_params()) {
    m.gathers = gatherer->gathers();
    m.prefetched = gatherer->prefetched();
    m.gather_seconds = gatherer->gather_seconds();
    m.wait_seconds = gatherer->gather_wait_seconds();
    m.gathered_buckets = gatherer->resident_buckets();
  }
  return m;
}

}  // namespace

TEST(MegatronFsdp, OptimGradsMatchesOneRankInFp32) {
  expect_layouts_match_one_rank(layouts_for_world(equivalence::world().size()));
}

TEST(MegatronFsdp, OptimGradsParamsMatchesOneRankInFp32WithAndWithoutPrefetchAndOverlappedReduction) {
  expect_layouts_match_one_rank(param_sharding_layouts_for_world(equivalence::world().size()));
}

// FSDP with experts (issue 25): a layer's expert tensors are a unit of their own, sharded and
// reduce-scattered over expert-DP, its dense tensors over DP x CP, each after the layer's
// backward (both all-to-alls done): the same numbers as one rank.
TEST(MegatronFsdp, MoeUnderExpertParallelismMatchesOneRankInFp32) {
  const std::vector<FsdpLayout> layouts = moe_layouts_for_world(equivalence::world().size());
  ASSERT_FALSE(layouts.empty()) << "no FSDP layouts at this world size";
  const train::TrainConfig config = equivalence::ten_step_config();
  for (const model::ModelConfig& model : moe_models(equivalence::world().size())) {
    const equivalence::DocumentMockData data(model.vocab_size, model.seq_length, 7, eod_masked());
    const equivalence::RunNumbers reference = equivalence::one_rank_numbers(model, config, data);
    for (const FsdpLayout& layout : layouts) {
      SCOPED_TRACE(layout.name + ", " + model.name);
      equivalence::expect_same_numbers(fsdp_numbers(layout, model, config, data), reference, config);
    }
  }
}

// Experts that receive no token still reduce-scatter their zero grads with their expert-DP peers:
// the steps neither hang nor differ. At 2 ranks (EP=2) every rank biases experts [E/2, E) out, so
// EP rank 1 receives nothing, as one rank routes; at 4 ranks (EP=2 x expert-DP=2) only world
// ranks 0 and 1 (expert-DP rank 0's EP group) do, so world rank 1's experts receive nothing while
// their expert-DP peer, world rank 3, receives tokens: one rank cannot route that way, so the
// reference is the same layout under optim (the distributed optimizer, no FSDP units).
TEST(MegatronFsdp, MoeWithIdleExpertsAndAnIdleExpertRankMatchesTheRunWithoutFsdp) {
  const int world = equivalence::world().size();
  const FsdpLayout layout = moe_layouts_for_world(world).front();  // optim_grads_params at EP=2
  model::ModelConfig model = mt::testing::trainer_moe_model(true);  // sigmoid scores with the expert bias
  model.moe_router_bias_update_rate = 0.0f;
  train::TrainConfig config = equivalence::ten_step_config();
  config.train_iters = 4;
  config.eval_iters = 0;
  const equivalence::DocumentMockData data(model.vocab_size, model.seq_length, 7, eod_masked());
  const auto prepare = [world](train::Trainer& trainer) {
    if (world == 2 || equivalence::world().rank() < 2) bias_out_upper_experts(trainer);
  };
  FsdpLayout without_units = layout;
  without_units.strategy = "optim";
  const equivalence::RunNumbers reference = world == 2 ? equivalence::one_rank_numbers(model, config, data, prepare)
                                                       : fsdp_numbers(without_units, model, config, data, prepare);
  const equivalence::RunNumbers run = fsdp_numbers(layout, model, config, data, prepare);
  equivalence::expect_same_numbers(run, reference, config);
  ASSERT_EQ(run.fewest_expert_tokens.size(), 4u);
  if (world == 2) {
    for (int64_t fewest : run.fewest_expert_tokens) EXPECT_EQ(fewest, 0);
  }
}

// Released units go back to their buffer's page pool (backend/memory.h): the ledger's grads
// (optim_grads) and weights (optim_grads_params) peaks are the shard plus the units in use, not the
// whole flat buffer no_shard holds; after the step no unit is gathered and the pools hold those
// peaks, no more (they grow only when more pages are in use at once than before). Overlapped
// reductions hold one more layer unit's full-size grads. Each layer unit is gathered twice per
// micro-batch (forward, backward), the root once; prefetch starts every layer unit's early.
TEST(MegatronFsdp, UnitBuffersAreReleasedAndTheLedgerCountsWhatIsHeld) {
  const int dp = equivalence::world().size();
  if (dp != 2) GTEST_SKIP() << "run at DP=2 only (CI time)";
  const int64_t page = backend::ReleasableMemory::page_bytes();
  const UnitMemory whole = one_step_memory("no_shard");
  const UnitMemory grads = one_step_memory("optim_grads");
  const UnitMemory params = one_step_memory("optim_grads_params");
  const int64_t shard_bytes = whole.elements * 4 / dp;
  const int64_t slack = 4 * page * static_cast<int64_t>(paged_model().num_layers + 2);  // page edges per bucket
  // Of a gathered unit (or one whose full-size grads are held) a rank adds what it does not own.
  auto not_owned = [&](int64_t elements) { return elements * 4 * (dp - 1) / dp; };
  EXPECT_EQ(whole.grads_peak, whole.elements * 4);
  // Grads: the shard, plus the root's full-size grads (the head's backward writes the tied
  // embedding's) and one layer unit's (reduced before the next layer's backward starts).
  EXPECT_LE(grads.grads_peak, shard_bytes + not_owned(grads.root_buckets + grads.largest_bucket) + slack);
  EXPECT_GE(grads.grads_peak, shard_bytes + not_owned(grads.largest_bucket));
  EXPECT_EQ(grads.grads_live, grads.grads_peak);
  EXPECT_LT(grads.grads_peak, whole.grads_peak * 3 / 4);
  EXPECT_EQ(grads.weights_peak, whole.weights_peak);
  // Weights: the shard, the root and two layer units (the one computing and the one prefetched).
  EXPECT_LE(params.weights_peak, shard_bytes + not_owned(params.root_buckets + 2 * params.largest_bucket) + slack);
  EXPECT_GE(params.weights_peak, shard_bytes + not_owned(params.root_buckets + 2 * params.largest_bucket) - slack);
  EXPECT_EQ(params.weights_live, params.weights_peak);
  EXPECT_EQ(params.gathered_buckets, 0);
  EXPECT_LT(params.weights_peak, whole.weights_peak);
  EXPECT_LE(params.grads_peak, grads.grads_peak);
  // Overlapped: a layer unit's reduce-scatter runs during the next one's backward, both held.
  const UnitMemory overlapped = one_step_memory("optim_grads", true, true);
  EXPECT_LE(overlapped.grads_peak,
            shard_bytes + not_owned(overlapped.root_buckets + 2 * overlapped.largest_bucket) + slack);
  EXPECT_GE(overlapped.grads_peak, shard_bytes + not_owned(2 * overlapped.largest_bucket) - slack);
  EXPECT_GT(overlapped.grads_peak, grads.grads_peak);
  EXPECT_EQ(overlapped.grads_live, overlapped.grads_peak);
  const model::ModelConfig model = paged_model();
  const train::TrainConfig config = equivalence::ten_step_config();
  const int64_t micro_batches = config.global_batch_size / (config.micro_batch_size * dp);
  const int64_t per_micro_batch = 2 * model.num_layers + 2;  // root: the embedding's and the head's buckets once
  EXPECT_EQ(params.gathers, per_micro_batch * micro_batches);
  // Prefetched: every layer unit's gathers (forward after the embedding's or the previous layer's,
  // backward after the head's or the next layer's); the root's wait.
  EXPECT_EQ(params.prefetched, 2 * model.num_layers * micro_batches);
  const UnitMemory waiting = one_step_memory("optim_grads_params", false);
  EXPECT_EQ(waiting.gathers, params.gathers);
  EXPECT_EQ(waiting.prefetched, 0);
  EXPECT_LE(waiting.weights_peak, shard_bytes + not_owned(waiting.root_buckets + waiting.largest_bucket) + slack);
  // The gathers' time and the rank's time blocked on them: a blocking gather is all wait; a
  // prefetched one runs during the previous unit's compute, so a share of its time is hidden.
  const auto hidden = [](const UnitMemory& m) { return 1 - m.wait_seconds / m.gather_seconds; };
  EXPECT_GT(waiting.gather_seconds, 0);
  EXPECT_LT(hidden(waiting), 0.05) << waiting.wait_seconds << " s of " << waiting.gather_seconds << " s blocked";
  EXPECT_GT(params.gather_seconds, 0);
  EXPECT_LE(params.wait_seconds, params.gather_seconds);
  EXPECT_GT(hidden(params), hidden(waiting) + 0.05) << params.wait_seconds << " s of " << params.gather_seconds << " s blocked";
}

// Megatron-FSDP reduce-scatters a grad-sharding strategy's grads after every micro-batch's
// backward: per step, every bucket (one per unit) once per micro-batch of this rank.
TEST(MegatronFsdp, OptimGradsReducesEveryUnitOncePerMicroBatch) {
  const FsdpLayout layout = layouts_for_world(equivalence::world().size()).front();
  const model::ModelConfig model = mt::testing::trainer_model(false);
  const train::TrainConfig config = equivalence::ten_step_config();
  const auto data = data::make_mock_data(model.vocab_size, model.seq_length, 77);
  const parallel::ParallelConfig parallel = fsdp_config(layout, model, config);
  const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel), backend::cpu_ops(),
                                       backend::cpu_ops().default_stream());
  train::Trainer trainer(model, config, *data, backend::cpu_ops(), &groups);
  ASSERT_EQ(trainer.optimizer().sharding(), optim::ShardingStrategy::optim_grads);
  trainer.train_step();
  const int micro_batches = config.global_batch_size / (config.micro_batch_size * parallel.data_parallel_size);
  // Units: the embedding, each layer, the head: one bucket per layer id.
  const int units = model.num_layers + 2;
  EXPECT_EQ(trainer.layout().buckets.size(), static_cast<size_t>(units));
  EXPECT_EQ(trainer.optimizer().unit_grad_reductions(), int64_t{units} * micro_batches);
}

TEST(MegatronFsdp, FlagsChooseTheStrategyAndRefuseWhatIsNotBuilt) {
  const model::ModelConfig model = mt::testing::trainer_model(false);
  const parallel::ModelDimensions dimensions{model.num_layers, model.num_attention_heads, model.query_groups(),
                                             model.ffn_hidden_size, model.padded_vocab_size(), model.seq_length, 0};
  const int world = equivalence::world().size();
  auto validated = [&](parallel::ParallelConfig parallel, const parallel::ModelDimensions& dims) {
    std::vector<std::string> warnings = parallel::validate(parallel, dims, {2, 8}, world);
    return std::make_pair(parallel, warnings);
  };
  parallel::ParallelConfig alias;
  alias.use_custom_fsdp = true;
  const auto [folded, warnings] = validated(alias, dimensions);
  EXPECT_TRUE(folded.use_megatron_fsdp);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("--use-custom-fsdp is deprecated"), std::string::npos) << warnings[0];
  EXPECT_EQ(optim::DistributedOptimizer::sharding_strategy(folded), optim::ShardingStrategy::optim_grads_params);
  for (const char* name : {"no_shard", "optim", "optim_grads"}) {
    parallel::ParallelConfig c;
    c.use_megatron_fsdp = true;
    c.data_parallel_sharding_strategy = name;
    EXPECT_STREQ(optim::sharding_strategy_name(optim::DistributedOptimizer::sharding_strategy(c)), name);
  }
  auto refusal = [&](parallel::ParallelConfig c, const parallel::ModelDimensions& dims) -> std::string {
    try {
      validated(c, dims);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  parallel::ParallelConfig hybrid;
  hybrid.use_megatron_fsdp = true;
  hybrid.num_distributed_optimizer_instances = 2;
  EXPECT_NE(refusal(hybrid, dimensions).find("--num-distributed-optimizer-instances 2"), std::string::npos);
  parallel::ParallelConfig outer;
  outer.use_megatron_fsdp = true;
  outer.outer_dp_sharding_strategy = "optim";
  EXPECT_NE(refusal(outer, dimensions).find("--outer-dp-sharding-strategy optim"), std::string::npos);
  parallel::ParallelConfig pipelined;
  pipelined.use_megatron_fsdp = true;
  pipelined.data_parallel_sharding_strategy = "optim_grads";
  pipelined.pipeline_model_parallel_size = 2;
  EXPECT_NE(refusal(pipelined, dimensions).find("--pipeline-model-parallel-size 2"), std::string::npos);
  parallel::ParallelConfig overlapped;
  overlapped.use_megatron_fsdp = true;
  overlapped.overlap_grad_reduce = overlapped.overlap_param_gather = true;
  EXPECT_EQ(refusal(overlapped, dimensions), "");  // Megatron's scripts pass it: FSDP's gathers are prefetched
  overlapped.no_fsdp_prefetch = true;
  EXPECT_NE(refusal(overlapped, dimensions).find("--no-fsdp-prefetch with --overlap-param-gather"), std::string::npos);
  parallel::ParallelConfig unprefetched;
  unprefetched.use_megatron_fsdp = true;
  unprefetched.data_parallel_sharding_strategy = "optim_grads";
  unprefetched.no_fsdp_prefetch = true;
  EXPECT_NE(refusal(unprefetched, dimensions).find("--no-fsdp-prefetch"), std::string::npos);
  parallel::ModelDimensions experts = dimensions;
  experts.num_experts = 4;
  parallel::ParallelConfig moe;
  moe.use_megatron_fsdp = true;
  moe.data_parallel_sharding_strategy = "optim_grads";
  moe.expert_model_parallel_size = world;
  EXPECT_EQ(refusal(moe, experts), "");
  moe.pipeline_model_parallel_size = world;
  moe.expert_model_parallel_size = 1;
  EXPECT_NE(refusal(moe, experts).find("--pipeline-model-parallel-size"), std::string::npos);
  parallel::ParallelConfig bad;
  bad.use_megatron_fsdp = true;
  bad.data_parallel_sharding_strategy = "zero3";
  EXPECT_NE(refusal(bad, dimensions).find("--data-parallel-sharding-strategy zero3"), std::string::npos);
}

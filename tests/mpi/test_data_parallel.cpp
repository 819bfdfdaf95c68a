// Every layout the trainer runs over MPI against the single-rank run (trained once, on rank 0, and
// broadcast: tests/mpi/training_equivalence.h): tiny GPT and tiny LLaMA (GQA with query groups =
// TP), the same seed, data, learning rate and micro-batch size, 10 steps; per-step loss and grad
// norm, and the evaluation loss, within the fp32 equivalence bound of training_equivalence.h (2e-3
// relative in bf16). Layouts at 2 ranks: TP=2, TP=2 + SP, DP=2 with and without the distributed
// optimizer, with overlapped reduction over several buckets (and with the overlapped parameter
// all-gather, waited before each bucket's first forward use), PP=2 (1F1B) and PP=2 with 2 virtual
// stages (interleaved, overlapped buckets); at 4 ranks: TP=2 x DP=2 (plain, SP + distributed
// optimizer + overlap, and distributed optimizer with the overlapped parameter all-gather), PP=4
// with uneven first/last stages, PP=2 x DP=2 (plain, and interleaved with the distributed
// optimizer: the tied embedding's shard summed between stages, buckets armed chunk by chunk; also
// with the overlapped parameter all-gather, waited chunk by chunk), PP=2 x TP=2 + SP; at 8 ranks:
// TP=2 x PP=2 x DP=2. Tied embeddings (tiny GPT) and untied (tiny LLaMA). Hidden dropout 0.1 on
// the SP, DP and PP cases, EOD-masked loss on the DP and PP cases (micro-batches with different
// token counts), per-token loss, no / selective / full recompute; at 2 ranks --attention-dropout
// 0.1 on TP=2, DP=2 and PP=2 with no, selective and full recompute. The activation slots of an
// interleaved rank: its chunks share one pool of as many slots as the schedule keeps in flight,
// and the ledger's activation bytes are that pool plus the workspaces. (The optimizer's buckets on
// their own: tests/mpi/test_distributed_optimizer.cpp.) Every layout again with the trainer on the
// asynchronous CPU table (both models, fp32, no recompute). The params norm and zero count of
// every layout (tiny GPT) against one rank's, with the step timers on. Run under mpirun at 2, 4
// and 8 ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/gpt_dataset.h"
#include "data/sample_source.h"
#include "model/stage.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/process_groups.h"
#include "parallel/rank_grid.h"
#include "tests/backend/async_cpu_ops.h"
#include "train/trainer.h"
#include "../unit/tiny_models.h"
#include "training_equivalence.h"

using namespace mt;

namespace {

const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new equivalence::WorldEnvironment);

constexpr int32_t kEod = 0;

// Mock tokens with token 0 as the end of document and Megatron's EOD-masked loss: micro-batches
// count different numbers of tokens.
class EodMaskedMockData : public data::SampleSource {
 public:
  EodMaskedMockData(int64_t vocab, int seq) : inner_(data::make_mock_data(vocab, seq, 77)) {}
  void sample(data::Split split, int64_t index, int32_t* tokens) const override { inner_->sample(split, index, tokens); }
  void rows(data::Split split, int64_t index, int seq_length, const data::SampleRows& out) const override {
    inner_->rows(split, index, seq_length, out);
    data::LoaderOptions options;
    options.eod_mask_loss = true;
    data::ltor_masks_and_positions(std::span<const int32_t>(out.tokens, static_cast<size_t>(seq_length)), kEod,
                                   options, out.loss_mask, out.positions, out.doc_start);
  }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  std::string describe() const override { return "EOD-masked mock data"; }

 private:
  std::unique_ptr<data::SampleSource> inner_;
};

model::ModelConfig tiny(bool llama, double hidden_dropout) {
  return mt::testing::trainer_model(llama, static_cast<float>(hidden_dropout));
}

struct Layout {
  std::string name;
  int tp = 1;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  bool overlap = false;
  int pp = 1;
  int virtual_stages = 1;           // --num-virtual-stages-per-pipeline-rank
  int first_stage_layers = 0;       // --decoder-first-pipeline-num-layers (0: even)
  int last_stage_layers = 0;        // --decoder-last-pipeline-num-layers (0: even)
  int num_layers = 2;
  bool overlap_param_gather = false;  // --overlap-param-gather (with the distributed optimizer and overlap)
};

struct Case {
  bool llama = false;
  model::RecomputeGranularity recompute = model::RecomputeGranularity::none;
  Precision precision = Precision::fp32;
  bool per_token_loss = false;
  float attention_dropout = 0.0f;
};

using equivalence::expect_close;

// The layout's parallel config over the world, validated.
parallel::ParallelConfig parallel_config(const Layout& layout, const model::ModelConfig& model,
                                         const train::TrainConfig& config) {
  parallel::ParallelConfig parallel;
  parallel.tensor_model_parallel_size = layout.tp;
  parallel.sequence_parallel = layout.sequence_parallel;
  parallel.use_distributed_optimizer = layout.distributed_optimizer;
  parallel.overlap_grad_reduce = layout.overlap;
  parallel.overlap_param_gather = layout.overlap_param_gather;
  if (layout.overlap) parallel.ddp_bucket_size = 3000;  // several buckets, reduced during backward
  parallel.pipeline_model_parallel_size = layout.pp;
  if (layout.virtual_stages > 1) parallel.num_virtual_stages_per_pipeline_rank = layout.virtual_stages;
  if (layout.first_stage_layers > 0) parallel.decoder_first_pipeline_num_layers = layout.first_stage_layers;
  if (layout.last_stage_layers > 0) parallel.decoder_last_pipeline_num_layers = layout.last_stage_layers;
  parallel::ModelDimensions dimensions{model.num_layers, model.num_attention_heads, model.query_groups(),
                                       model.ffn_hidden_size, model.padded_vocab_size(), model.seq_length, 0};
  parallel::validate(parallel, dimensions, {config.micro_batch_size, config.global_batch_size},
                     equivalence::world().size());
  return parallel;
}

// `ops`: the table the layout's trainer runs on (its process groups' data communicators bound to
// its default stream); the one-rank reference always runs on the CPU table.
void expect_layout_matches_one_rank(const Layout& layout, const Case& c, const backend::Ops& ops = backend::cpu_ops()) {
  const bool data_parallel = equivalence::world().size() / (layout.tp * layout.pp) > 1;
  const bool masked_loss = data_parallel || layout.pp > 1;
  // Dropout on the SP, DP and PP cases, EOD-masked loss on the DP and PP cases.
  model::ModelConfig model = tiny(c.llama, layout.sequence_parallel || masked_loss ? 0.1 : 0.0);
  model.num_layers = layout.num_layers;
  model.attention_dropout = c.attention_dropout;
  train::TrainConfig config = equivalence::ten_step_config();
  config.precision = c.precision;
  config.calculate_per_token_loss = c.per_token_loss;
  config.recompute = {c.recompute, model::RecomputeMethod::uniform, 1};
  EodMaskedMockData masked(model.vocab_size, model.seq_length);
  const auto plain = data::make_mock_data(model.vocab_size, model.seq_length, 77);
  const data::SampleSource& data = masked_loss ? static_cast<const data::SampleSource&>(masked) : *plain;

  const parallel::ParallelConfig parallel = parallel_config(layout, model, config);
  const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel), ops, ops.default_stream());

  const equivalence::RunNumbers reference = equivalence::one_rank_numbers(model, config, data);
  const equivalence::RunNumbers run = equivalence::train_numbers(model, config, data, &groups);
  if (c.precision == Precision::fp32) {
    equivalence::expect_same_numbers(run, reference, config);
  } else {
    const double tolerance = 2e-3;
    expect_close(run.loss, reference.loss, tolerance, "lm loss");
    expect_close(run.grad_norm, reference.grad_norm, tolerance, "grad norm");
    expect_close(run.eval_loss, reference.eval_loss, tolerance, "eval loss");
  }
  EXPECT_EQ(run.eval_loss.size(), 2u);
}

std::vector<Layout> layouts_for_world(int world) {
  if (world == 2) {
    return {{"TP=2", 2},
            {"TP=2 SP", 2, true},
            {"DP=2", 1},
            {"DP=2 distributed optimizer", 1, false, true},
            {"DP=2 overlapped buckets", 1, false, false, true},
            {"DP=2 distributed optimizer, overlapped buckets", 1, false, true, true},
            {"DP=2 distributed optimizer, overlapped buckets and parameter gather", 1, false, true, true, 1, 1, 0, 0, 2,
             true},
            {"PP=2", 1, false, false, false, 2},
            {"PP=2 x 2 virtual stages, overlapped buckets", 1, false, false, true, 2, 2, 0, 0, 4}};
  }
  if (world == 4) {
    return {{"TP=2 x DP=2", 2},
            {"TP=2 SP x DP=2 distributed optimizer, overlapped buckets", 2, true, true, true},
            {"TP=2 x DP=2 distributed optimizer, overlapped buckets and parameter gather", 2, false, true, true, 1, 1, 0, 0,
             2, true},
            {"PP=4, first and last stage 1 layer of 6", 1, false, false, false, 4, 1, 1, 1, 6},
            {"PP=2 x DP=2", 1, false, false, false, 2},
            {"PP=2 x 2 virtual stages x DP=2 distributed optimizer, overlapped buckets", 1, false, true, true, 2, 2, 0,
             0, 4},
            {"PP=2 x 2 virtual stages x DP=2 distributed optimizer, overlapped buckets and parameter gather", 1, false,
             true, true, 2, 2, 0, 0, 4, true},
            {"PP=2 x TP=2 SP", 2, true, false, false, 2}};
  }
  if (world == 8) return {{"TP=2 x PP=2 x DP=2", 2, false, false, false, 2}};
  return {};
}

std::string describe(const Layout& layout, const Case& c) {
  const char* recompute = c.recompute == model::RecomputeGranularity::full        ? "full"
                          : c.recompute == model::RecomputeGranularity::selective ? "selective"
                                                                                   : "no";
  return layout.name + ", " + (c.llama ? "tiny-llama" : "tiny-gpt") + ", " + precision_name(c.precision) + ", " +
         recompute + " recompute" + (c.per_token_loss ? ", per-token loss" : "") +
         (c.attention_dropout > 0 ? ", attention dropout " + std::to_string(c.attention_dropout) : "");
}

}  // namespace

TEST(DataParallel, EveryLayoutMatchesOneRankInFp32) {
  ASSERT_FALSE(layouts_for_world(equivalence::world().size()).empty()) << "no layouts at this world size";
  for (const Layout& layout : layouts_for_world(equivalence::world().size())) {
    for (bool llama : {false, true}) {
      for (auto recompute : {model::RecomputeGranularity::none, model::RecomputeGranularity::selective,
                             model::RecomputeGranularity::full}) {
        const Case c{llama, recompute};
        SCOPED_TRACE(describe(layout, c));
        expect_layout_matches_one_rank(layout, c);
      }
    }
  }
}

// The same layouts with the trainer on the asynchronous CPU table (tests/backend/async_cpu_ops.h):
// ops, copies and the data groups' MPI run on a stream worker, device memory is unreadable from
// the host between ops, so a missing stream wait or a host read of device memory fails here. Every
// layout, both models (tiny GPT: tied embeddings summed between PP stages), one recompute mode
// (none) and fp32, to keep CI time small (about 10 s over 2, 4 and 8 ranks).
TEST(DataParallel, EveryLayoutMatchesOneRankOnTheAsynchronousTable) {
  ASSERT_FALSE(layouts_for_world(equivalence::world().size()).empty()) << "no layouts at this world size";
  for (const Layout& layout : layouts_for_world(equivalence::world().size())) {
    for (bool llama : {false, true}) {
      const Case c{llama, model::RecomputeGranularity::none};
      SCOPED_TRACE(describe(layout, c) + ", asynchronous table");
      expect_layout_matches_one_rank(layout, c, test_backend::async_cpu_ops());
    }
  }
}

// --attention-dropout 0.1: the mask is keyed by global token, global head and global key
// position, so TP=2 (heads split; tiny LLaMA: GQA), DP=2 and PP=2 drop what one rank drops, also
// when full or selective recompute runs the forward again. 2 ranks only, to keep CI time small.
TEST(DataParallel, AttentionDropoutMatchesOneRank) {
  if (equivalence::world().size() != 2) GTEST_SKIP() << "the attention dropout layouts run at 2 ranks";
  using G = model::RecomputeGranularity;
  const std::vector<std::pair<Layout, Case>> cases = {
      {{"TP=2", 2}, {true, G::none}},
      {{"TP=2", 2}, {false, G::full}},
      {{"DP=2", 1}, {false, G::none}},
      {{"DP=2", 1}, {true, G::full}},
      {{"PP=2", 1, false, false, false, 2}, {false, G::selective}},
  };
  for (auto [layout, c] : cases) {
    c.attention_dropout = 0.1f;
    SCOPED_TRACE(describe(layout, c));
    expect_layout_matches_one_rank(layout, c);
  }
}

TEST(DataParallel, PerTokenLossSumsTheTokenCountOverDataParallelRanks) {
  ASSERT_FALSE(layouts_for_world(equivalence::world().size()).empty()) << "no layouts at this world size";
  for (const Layout& layout : layouts_for_world(equivalence::world().size())) {
    const Case c{true, model::RecomputeGranularity::none, Precision::fp32, true};
    SCOPED_TRACE(describe(layout, c));
    expect_layout_matches_one_rank(layout, c);
  }
}

TEST(DataParallel, Bf16LayoutsMatchTheBf16OneRankRun) {
  ASSERT_FALSE(layouts_for_world(equivalence::world().size()).empty()) << "no layouts at this world size";
  for (const Layout& layout : layouts_for_world(equivalence::world().size())) {
    for (bool llama : {false, true}) {
      const Case c{llama, model::RecomputeGranularity::none, Precision::bf16};
      SCOPED_TRACE(describe(layout, c));
      expect_layout_matches_one_rank(layout, c);
    }
  }
}

// --log-params-norm and --log-num-zeros-in-grad count each tensor once over TP, PP (tied embedding
// on both end stages), DP and the distributed optimizer's shards: every layout's params norm within
// the fp32 equivalence bound of one rank's (after the step's update) and its zero count equal up
// to grads whose zero is rounding, every step, with Megatron's level-2 timers and the level-1 barrier on (no deadlock, numbers
// unchanged). On every rank the level-2 compute, batch and p2p timers sum to at most its
// forward-backward; a pipeline rank runs its sends and receives. Tiny GPT (tied embeddings).
TEST(DataParallel, ParamsNormZeroCountAndTimersOfEveryLayoutMatchOneRank) {
  const int world = equivalence::world().size();
  ASSERT_FALSE(layouts_for_world(world).empty()) << "no layouts at this world size";
  const char* const level_two[] = {"batch-generator", "forward-compute", "backward-compute", "forward-recv",
                                   "forward-send", "backward-recv", "backward-send"};
  for (const Layout& layout : layouts_for_world(world)) {
    SCOPED_TRACE(layout.name + ", tiny-gpt, watched");
    model::ModelConfig model = tiny(false, 0.0);
    model.num_layers = layout.num_layers;
    const train::TrainConfig config = equivalence::ten_step_config();
    EodMaskedMockData data(model.vocab_size, model.seq_length);
    const parallel::ParallelConfig parallel = parallel_config(layout, model, config);
    const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel));
    const std::vector<double> reference = equivalence::one_rank_norms_and_zeros(model, config, data);
    const std::vector<train::StepStats> steps = equivalence::watched_steps(model, config, data, &groups);
    equivalence::expect_norms_and_zeros_match(steps, reference, config, model);
    for (size_t i = 0; i < steps.size(); ++i) {
      for (int r = 0; r < world; ++r) {
        double inside = 0;
        for (const char* name : level_two) inside += equivalence::rank_ms(steps[i], name, r);
        EXPECT_GT(inside, 0) << "rank " << r;
        EXPECT_LE(inside, equivalence::rank_ms(steps[i], "forward-backward", r))
            << "rank " << r << ", iteration " << i + 1;
        if (layout.pp > 1) {
          const double sends = equivalence::rank_ms(steps[i], "forward-send", r) +
                               equivalence::rank_ms(steps[i], "backward-send", r);
          EXPECT_GT(sends, 0) << "rank " << r;
        }
      }
    }
  }
}

TEST(PipelineSlots, InterleavedChunksShareOnePoolOfTheSchedulesPeakInFlight) {
  if (equivalence::world().size() != 2) GTEST_SKIP() << "PP=2 x 2 virtual stages runs at 2 ranks";
  const int rank = equivalence::world().rank();
  model::ModelConfig model = tiny(false, 0.0);
  model.num_layers = 4;
  train::TrainConfig config;
  config.micro_batch_size = 2;
  config.global_batch_size = 8;  // 4 micro-batches
  config.train_iters = 1;
  config.eval_iters = 1;
  parallel::ParallelConfig parallel;
  parallel.pipeline_model_parallel_size = 2;
  parallel.num_virtual_stages_per_pipeline_rank = 2;
  parallel::ModelDimensions dimensions{model.num_layers, model.num_attention_heads, model.query_groups(),
                                       model.ffn_hidden_size, model.padded_vocab_size(), model.seq_length, 0};
  parallel::validate(parallel, dimensions, {config.micro_batch_size, config.global_batch_size}, 2);
  const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel));
  const auto data = data::make_mock_data(model.vocab_size, model.seq_length, 77);
  train::Trainer trainer(model, config, *data, groups.ops(), &groups);
  trainer.run({});

  // What this rank's chunks need, from the schedule and the slot shapes alone.
  const auto actions = parallel::pipeline_actions(parallel::pipeline_shape(parallel, model.num_layers, 4), rank);
  model::StageOptions options;
  options.micro_batch_size = config.micro_batch_size;
  std::vector<int64_t> slot_floats;
  int64_t workspaces = 0, per_chunk_slots = 0;
  for (int c = 0; c < 2; ++c) {
    slot_floats.push_back(model::activation_slot_floats(model, trainer.layout(), c, model::ParallelContext{}, options));
    workspaces += model::planned_activation_bytes(model, trainer.layout(), c, 2 * model.seq_length, 1,
                                                  Precision::fp32, {}, 1) -
                  slot_floats.back() * 4;
    per_chunk_slots += parallel::pipeline_activation_slots(actions, c) * slot_floats.back() * 4;
  }
  const auto pools = parallel::pipeline_slot_pools(actions, slot_floats);
  int64_t pooled_slots = 0;
  for (const auto& pool : pools) pooled_slots += pool.floats() * 4;
  EXPECT_EQ(trainer.memory().peak(backend::MemoryCategory::activations), workspaces + pooled_slots);
  if (rank == 0) {
    // Chunks 0 and 1 hold slots of one shape: one pool of 5 (F0.0 F1.0 F0.1 F1.1 F2.0 before
    // the first backward), where a pool per chunk would hold 4 + 2.
    ASSERT_EQ(pools.size(), 1u);
    EXPECT_EQ(pools[0].slots, 5);
    EXPECT_EQ(pools[0].slots, parallel::pipeline_activation_slots(actions));
    EXPECT_EQ(per_chunk_slots - pooled_slots, slot_floats[0] * 4);
    std::printf("rank 0 activations: %lld bytes (slots %lld, workspaces %lld); a pool per chunk: %lld\n",
                static_cast<long long>(workspaces + pooled_slots), static_cast<long long>(pooled_slots),
                static_cast<long long>(workspaces), static_cast<long long>(workspaces + per_chunk_slots));
  }
  EXPECT_LE(pooled_slots, per_chunk_slots);
}

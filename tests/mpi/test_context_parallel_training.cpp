// Context-parallel training against one rank: tiny GPT and tiny LLaMA, fp32, the same seed, data,
// learning rate and micro-batch size, 10 steps; per-step loss and grad norm and the evaluation
// loss within the fp32 equivalence bound (training_equivalence.h). At 2 ranks CP=2 on plain mock data, with --eod-mask-loss, and with
// documents (--reset-attention-mask, --reset-position-ids and --eod-mask-loss: documents cross
// the chunk borders, and micro-batches count different tokens on each CP rank), with
// --hidden-dropout 0.1 on the masked cases, and per-token loss; at 4 ranks CP=2 x TP=2 (with and
// without SP) and CP=2 x DP=2 with the distributed optimizer and overlapped buckets; at 8 ranks
// TP=2 x CP=2 x PP=2. Each with no, selective and full recompute; each layout again with the
// trainer on the asynchronous CPU table (tiny LLaMA, documents, no recompute). The params norm and
// zero count of every layout (tiny GPT, documents) against one rank's. At 2 ranks also
// --attention-dropout 0.1 (no and full recompute).
// Run under mpirun at 2, 4 and 8 ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/rank_grid.h"
#include "tests/backend/async_cpu_ops.h"
#include "training_equivalence.h"
#include "../unit/tiny_models.h"

using namespace mt;

namespace {

const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new equivalence::WorldEnvironment);

enum class Documents {
  none,           // plain mock data: every token counts, one document per sample
  eod_mask_loss,  // --eod-mask-loss
  masks,          // --reset-attention-mask --reset-position-ids --eod-mask-loss
};

struct Layout {
  std::string name;
  int tp = 1;
  int pp = 1;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  bool overlap = false;
};

struct Case {
  bool llama = false;
  model::RecomputeGranularity recompute = model::RecomputeGranularity::none;
  Documents documents = Documents::none;
  bool per_token_loss = false;
  float attention_dropout = 0.0f;
};

// The layout's parallel config (CP=2) over the world, validated.
parallel::ParallelConfig parallel_config(const Layout& layout, const model::ModelConfig& model,
                                         const train::TrainConfig& config) {
  parallel::ParallelConfig parallel;
  parallel.context_parallel_size = 2;
  parallel.tensor_model_parallel_size = layout.tp;
  parallel.pipeline_model_parallel_size = layout.pp;
  parallel.sequence_parallel = layout.sequence_parallel;
  parallel.use_distributed_optimizer = layout.distributed_optimizer;
  parallel.overlap_grad_reduce = layout.overlap;
  if (layout.overlap) parallel.ddp_bucket_size = 3000;  // several buckets, reduced during backward
  const parallel::ModelDimensions dimensions{model.num_layers,        model.num_attention_heads, model.query_groups(),
                                             model.ffn_hidden_size,   model.padded_vocab_size(), model.seq_length,
                                             0};
  parallel::validate(parallel, dimensions, {config.micro_batch_size, config.global_batch_size},
                     equivalence::world().size());
  return parallel;
}

// `ops`: the table the layout's trainer runs on; the one-rank reference runs on the CPU table.
void expect_context_parallel_matches_one_rank(const Layout& layout, const Case& c,
                                              const backend::Ops& ops = backend::cpu_ops()) {
  // Dropout wherever tokens are masked, so the masks and the dropout keys both cross chunks.
  model::ModelConfig model = mt::testing::trainer_model(c.llama, c.documents == Documents::none ? 0.0f : 0.1f);
  model.attention_dropout = c.attention_dropout;
  train::TrainConfig config = equivalence::ten_step_config();
  config.calculate_per_token_loss = c.per_token_loss;
  config.recompute = {c.recompute, model::RecomputeMethod::uniform, 1};
  data::LoaderOptions options;
  options.eod_mask_loss = c.documents != Documents::none;
  options.reset_attention_mask = options.reset_position_ids = c.documents == Documents::masks;
  // One token in five ends a document (none at all for plain data).
  const equivalence::DocumentMockData data(model.vocab_size, model.seq_length,
                                           c.documents == Documents::none ? 1 << 30 : 5, options);

  const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel_config(layout, model, config)),
                                       ops, ops.default_stream());

  const equivalence::RunNumbers reference = equivalence::one_rank_numbers(model, config, data);
  const equivalence::RunNumbers run = equivalence::train_numbers(model, config, data, &groups);
  equivalence::expect_same_numbers(run, reference, config);
  EXPECT_EQ(run.eval_loss.size(), 2u);
}

std::vector<Layout> layouts_for_world(int world) {
  if (world == 2) return {{"CP=2"}};
  if (world == 4) {
    return {{"CP=2 x TP=2", 2},
            {"CP=2 x TP=2 SP", 2, 1, true},
            {"CP=2 x DP=2 distributed optimizer, overlapped buckets", 1, 1, false, true, true}};
  }
  if (world == 8) return {{"TP=2 SP x CP=2 x PP=2", 2, 2, true}};
  return {};
}

// Every data case at 2 ranks; documents (the hardest) on the larger layouts.
std::vector<Documents> documents_for_world(int world) {
  if (world == 2) return {Documents::none, Documents::eod_mask_loss, Documents::masks};
  return {Documents::masks};
}

std::string describe(const Layout& layout, const Case& c) {
  const char* recompute = c.recompute == model::RecomputeGranularity::full        ? "full"
                          : c.recompute == model::RecomputeGranularity::selective ? "selective"
                                                                                   : "no";
  const char* documents = c.documents == Documents::masks           ? "document masks + EOD-masked loss + dropout"
                          : c.documents == Documents::eod_mask_loss ? "EOD-masked loss + dropout"
                                                                    : "plain";
  return layout.name + ", " + (c.llama ? "tiny-llama" : "tiny-gpt") + ", " + documents + ", " + recompute +
         " recompute" + (c.per_token_loss ? ", per-token loss" : "") +
         (c.attention_dropout > 0 ? ", attention dropout " + std::to_string(c.attention_dropout) : "");
}

}  // namespace

TEST(ContextParallelTraining, EveryLayoutMatchesOneRankInFp32) {
  const int world = equivalence::world().size();
  ASSERT_FALSE(layouts_for_world(world).empty()) << "no layouts for " << world << " ranks";
  for (const Layout& layout : layouts_for_world(world)) {
    for (Documents documents : documents_for_world(world)) {
      for (bool llama : {false, true}) {
        for (auto recompute : {model::RecomputeGranularity::none, model::RecomputeGranularity::selective,
                               model::RecomputeGranularity::full}) {
          const Case c{llama, recompute, documents};
          SCOPED_TRACE(describe(layout, c));
          expect_context_parallel_matches_one_rank(layout, c);
        }
      }
    }
  }
}

// The same layouts with the trainer on the asynchronous CPU table (tests/backend/async_cpu_ops.h),
// on the hardest data (document masks, EOD-masked loss, dropout), tiny LLaMA, no recompute.
TEST(ContextParallelTraining, EveryLayoutMatchesOneRankOnTheAsynchronousTable) {
  ASSERT_FALSE(layouts_for_world(equivalence::world().size()).empty());
  for (const Layout& layout : layouts_for_world(equivalence::world().size())) {
    const Case c{true, model::RecomputeGranularity::none, Documents::masks};
    SCOPED_TRACE(describe(layout, c) + ", asynchronous table");
    expect_context_parallel_matches_one_rank(layout, c, test_backend::async_cpu_ops());
  }
}

TEST(ContextParallelTraining, PerTokenLossSumsTheTokenCountOverContextParallelRanks) {
  ASSERT_FALSE(layouts_for_world(equivalence::world().size()).empty());
  for (const Layout& layout : layouts_for_world(equivalence::world().size())) {
    const Case c{true, model::RecomputeGranularity::none, Documents::masks, true};
    SCOPED_TRACE(describe(layout, c));
    expect_context_parallel_matches_one_rank(layout, c);
  }
}

// --log-params-norm and --log-num-zeros-in-grad over the CP ranks (each tensor once over DP x CP):
// every layout's params norm and zero count against one rank's (tiny GPT, documents), with the
// step timers on.
TEST(ContextParallelTraining, ParamsNormAndZeroCountOfEveryLayoutMatchOneRank) {
  ASSERT_FALSE(layouts_for_world(equivalence::world().size()).empty()) << "no layouts at this world size";
  for (const Layout& layout : layouts_for_world(equivalence::world().size())) {
    SCOPED_TRACE(layout.name + ", tiny-gpt, documents, watched");
    const model::ModelConfig model = mt::testing::trainer_model(false, 0.1f);
    const train::TrainConfig config = equivalence::ten_step_config();
    data::LoaderOptions options;
    options.eod_mask_loss = options.reset_attention_mask = options.reset_position_ids = true;
    const equivalence::DocumentMockData data(model.vocab_size, model.seq_length, 5, options);
    const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel_config(layout, model, config)));
    const std::vector<double> reference = equivalence::one_rank_norms_and_zeros(model, config, data);
    equivalence::expect_norms_and_zeros_match(equivalence::watched_steps(model, config, data, &groups), reference,
                                              config, model);
  }
}

// --attention-dropout 0.1 under ring attention: each chunk pair draws its part of the mask at the
// global query and key positions, so CP=2 drops what one rank drops (2 ranks only: tiny LLaMA
// with GQA on document masks, no and full recompute).
TEST(ContextParallelTraining, AttentionDropoutMatchesOneRank) {
  if (equivalence::world().size() != 2) GTEST_SKIP() << "CP=2 runs at 2 ranks";
  for (auto recompute : {model::RecomputeGranularity::none, model::RecomputeGranularity::full}) {
    Case c{true, recompute, Documents::masks};
    c.attention_dropout = 0.1f;
    SCOPED_TRACE(describe({"CP=2"}, c));
    expect_context_parallel_matches_one_rank({"CP=2"}, c);
  }
}

// Multi-latent attention (model/layers/mla_attention.h) trained over MPI against the single-rank
// run (trained once, on rank 0, and broadcast: tests/mpi/training_equivalence.h): a tiny MLA model
// (tiny LLaMA's shape, 4 heads, --q-lora-rank 8 --kv-lora-rank 6 --qk-head-dim 4
// --qk-pos-emb-head-dim 4 --v-head-dim 6 --qk-layernorm), the same seed, data, learning rate and
// micro-batch size, 10 steps; per-step loss and grad norm, and the evaluation loss, within the fp32
// equivalence bound. Layouts at 2 ranks: TP=2 (heads split, the replicated down projections' grads
// whole on each rank), TP=2 + SP (their grads summed over TP), PP=2, DP=2 with the distributed
// optimizer and CP=2 (ring attention over the zero-padded heads, q/k 8 wide and v 6; the RoPE part
// at each chunk's global positions); no and selective recompute. CP=2 also with YaRN
// (--rope-type yarn, factor 4, a concentration factor other than 1). Run under mpirun at 2 ranks
// (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/process_groups.h"
#include "parallel/rank_grid.h"
#include "training_equivalence.h"
#include "../unit/tiny_models.h"

using namespace mt;

namespace {

const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new equivalence::WorldEnvironment);

struct Layout {
  std::string name;
  int tp = 1;
  bool sequence_parallel = false;
  int pp = 1;
  bool distributed_optimizer = false;
  int cp = 1;
  bool yarn = false;
};

void expect_layout_matches_one_rank(const Layout& layout, model::RecomputeGranularity recompute) {
  const model::ModelConfig model = mt::testing::tiny_mla(layout.yarn);
  train::TrainConfig config = equivalence::ten_step_config();
  config.recompute = {recompute, model::RecomputeMethod::uniform, 1};
  const auto data = data::make_mock_data(model.vocab_size, model.seq_length, 77);
  parallel::ParallelConfig parallel;
  parallel.tensor_model_parallel_size = layout.tp;
  parallel.sequence_parallel = layout.sequence_parallel;
  parallel.pipeline_model_parallel_size = layout.pp;
  parallel.use_distributed_optimizer = layout.distributed_optimizer;
  parallel.context_parallel_size = layout.cp;
  parallel::ModelDimensions dimensions{model.num_layers, model.num_attention_heads, model.query_groups(),
                                       model.ffn_hidden_size, model.padded_vocab_size(), model.seq_length, 0};
  parallel::validate(parallel, dimensions, {config.micro_batch_size, config.global_batch_size},
                     equivalence::world().size());
  const backend::Ops& ops = backend::cpu_ops();
  const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel), ops, ops.default_stream());
  const equivalence::RunNumbers reference = equivalence::one_rank_numbers(model, config, *data);
  const equivalence::RunNumbers run = equivalence::train_numbers(model, config, *data, &groups);
  equivalence::expect_same_numbers(run, reference, config);
  EXPECT_EQ(run.loss.size(), 10u);
  EXPECT_EQ(run.eval_loss.size(), 2u);
}

}  // namespace

TEST(MlaTraining, EveryLayoutMatchesOneRankInFp32) {
  if (equivalence::world().size() != 2) GTEST_SKIP() << "the MLA layouts run at 2 ranks";
  const std::vector<Layout> layouts = {
      {"TP=2", 2},
      {"TP=2 SP", 2, true},
      {"PP=2", 1, false, 2},
      {"DP=2 distributed optimizer", 1, false, 1, true},
      {"CP=2", 1, false, 1, false, 2},
      {"CP=2 YaRN", 1, false, 1, false, 2, true}};
  for (const Layout& layout : layouts) {
    for (auto recompute : {model::RecomputeGranularity::none, model::RecomputeGranularity::selective}) {
      SCOPED_TRACE(layout.name + (recompute == model::RecomputeGranularity::selective ? ", selective recompute" : ""));
      expect_layout_matches_one_rank(layout, recompute);
    }
  }
}

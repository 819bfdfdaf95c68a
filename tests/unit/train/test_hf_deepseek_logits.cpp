// mt's tiny-deepseek against transformers' DeepseekV3ForCausalLM: the committed logits of
// tests/golden/hf/tiny-deepseek-logits.h5 (make_hf_goldens.sh tiny-deepseek: mt-train --model
// tiny-deepseek --moe-router-topk 4 --mtp-num-layers 1 --save-init, exported by mt-ckpt export
// --format hf, run by transformers 4.53.3) equal mt's forward of the same initial parameters (same
// preset, same seed) within 1e-4 in fp32, the bound of the other HF goldens. The MLA projections'
// mapping, the interleaved rope part, the latent norms, the sigmoid router with its bias, groups
// and scaling, the shared expert and the dense first layer all show up in the logits. Needs no
// torch: only the .h5 golden.
#include <gtest/gtest.h>

#include "hf_logits_golden.h"
#include "model/config.h"

using namespace mt;

namespace {

// The golden's model: tiny-deepseek (MLA with the latent norms, a dense layer then a MoE layer with
// the sigmoid router, expert bias, 4 groups and a shared expert, one MTP depth) routing to 4
// experts, so that Megatron scores each group by its best top-k / group-topk = 2 experts, as HF does.
model::ModelConfig golden_model() {
  model::ModelConfig m = model::preset("tiny-deepseek");
  m.moe_router_topk = 4;
  m.mtp_num_layers = 1;
  return m;
}

}  // namespace

TEST(HfDeepseek, TinyDeepseekInitialParametersMatchTransformersLogits) {
  double largest = 0;
  const double worst = mt::testing::worst_hf_logits_difference("tiny-deepseek", golden_model(), &largest);
  EXPECT_LT(worst, 1e-4) << "max abs difference from transformers' logits (largest logit " << largest << ")";
}

// The golden sees the routing: keeping all 4 groups in mt (the golden keeps 2) chooses other
// experts, and the logits leave the bound.
TEST(HfDeepseek, RoutingToOtherGroupsLeavesTheBound) {
  model::ModelConfig m = golden_model();
  m.moe_router_group_topk = 4;
  double largest = 0;
  EXPECT_GT(mt::testing::worst_hf_logits_difference("tiny-deepseek", m, &largest), 1e-3);
}

// The MoE router, Megatron-Core's TopKRouter.routing (megatron/core/transformer/moe/router.py,
// helpers in moe_utils.py) on the router logits of one micro-batch: the options read from the
// model config's MoE fields (RouterOptions, Megatron's flag names), the Router a MoE layer calls
// (forward: logits -> probs and routing map after capacity dropping, the aux losses and z-loss
// attached; backward: dlogits), and the expert-bias update the trainer runs once per global batch.
// Every tensor is a device buffer of the backend op table the Router is given (fp32 unless said);
// the math runs in the table's moe_router_* entries (contracts in kernels/cpu/moe_router.h). The
// logits are fp32 (Megatron's --moe-router-dtype fp32; fp64 is not offered).
//
// Order of operations in forward, as Megatron's routing():
//   (a) z-loss on the logits (training only, --moe-z-loss-coeff set):
//       z = coeff / |tp_cp| * mean_t logsumexp(logits_t)^2 over this rank's rows;
//   (b) scores and top-k (moe_router_topk):
//       softmax: top-k on the logits, then softmax over the k (probs sum to 1 over the k);
//       softmax + pre_softmax: softmax over all E, then top-k, no renormalising;
//       sigmoid: s = sigmoid(logits); the choice is made on s + expert_bias when the bias is on
//       (the bias only chooses), the gate is the unbiased s, divided by (sum of the k s + 1e-20)
//       only when k > 1; pre_softmax has no effect;
//       then probs *= topk_scaling_factor (when set). Group-limited top-k (num_groups, group_topk)
//       chooses among the group_topk best groups of E / num_groups contiguous experts, a group's
//       score being the sum of its top (k / group_topk) choosing scores (others masked to -inf).
//   (c) capacity dropping (capacity_factor set): capacity = ceil(S k / E * cf) for the S rows of
//       this call; when capacity >= S nothing is dropped, else each expert keeps `capacity` rows:
//       policy probs keeps its highest probs (ties: lower row first), policy position its
//       earliest rows by row index; rows not routed to the expert count as prob 0 / position
//       value 0 and come after every routed row (then by row index). The kept map is ANDed with
//       the routing map, or with pad_expert_input_to_capacity replaces it (each expert then gets
//       exactly `capacity` rows, the padding rows with prob 0); probs are zeroed off the map.
//   (d) aux losses (training only, load_balancing_type != none, aux_loss_coeff > 0), on scores
//       recomputed from the logits independently of the routing (Megatron's
//       compute_routing_scores_for_aux_loss): P = softmax over E, or sigmoid normalised over E
//       (s / (sum_E s + 1e-20)); the map for the counts is a plain top-k on P (no expert bias, no
//       groups, no dropping). With c_i = tokens of expert i summed over the reduce group and T the
//       group's tokens (S x group size):
//         aux_loss:        aux = coeff E / (k T^2) sum_i (sum_{t local} P_ti) c_i, group tp_cp;
//         seq_aux_loss:    the same per sequence b (rows t with row_id / sequence_length == b,
//                          c and T = sequence_length per sequence), summed over the sequences and
//                          divided by num_sequences, group tp_cp;
//         global_aux_loss: c = the running mean over this global batch's micro-batches (so far)
//                          of the counts summed over tp_dp_cp, T = S x |tp_dp_cp|; the running
//                          sum restarts at reset_global_aux_counts() (Megatron's
//                          reset_global_aux_loss_tracker, in finalize_model_grads once per global
//                          batch). A recompute forward (activation recompute, `recompute`) adds
//                          nothing and weighs P with the mean its micro-batch's first forward used
//                          (recomputes run in the first forwards' order: Megatron counts in the
//                          recompute itself, its first forward running without grad, so each
//                          micro-batch counts once and in the same order either way).
//       Summed over the reduce group's ranks, aux = coeff E sum_i f_i Pbar_i, which is coeff for
//       perfectly balanced routing.
//   (e) expert-bias counts: tokens_per_expert += column sums of the final routing map (after
//       dropping), only when the caller passes a buffer (a forward that builds grads: never
//       under recompute, never in evaluation).
// The losses are attached as Megatron's MoEAuxLossAutoScaler: forward values are only logged;
// backward adds d(loss)/dlogits times the caller's factor d(objective)/d(loss value) (the
// trainer's main_loss_backward_scale), times S x |tp_cp| under calculate_per_token_loss.
//
// Tie-breaking in every top-k (routing, groups, aux map, capacity): a higher value first, equal
// values by lower index (expert, group or row), fixed so results never depend on the thread
// count. torch.topk does not specify its order for ties and does not prefer the lower index: on
// the CPU (torch 2.6) the top 3 of 8 equal values are experts 6, 5, 4, and its topk over a
// column's 0/1 map (Megatron's position policy) keeps later rows, not the earliest. mt keeps the
// earliest (as the issue asks); equal values are where mt and Megatron can differ, so goldens use
// tie-free inputs. One tie no input avoids: pad_expert_input_to_capacity's padding rows (prob 0,
// all equal) are mt's earliest unrouted rows and torch.topk's choice in Megatron, while the
// routed rows kept, the probs and the gradients are the same.
// Tested in tests/unit/model/test_router.cpp (double loops, finite differences through forward
// and backward, reductions over thread ranks) and tests/harness/cases_moe_router.cpp (every op
// entry against double loops); against Megatron-Core goldens by the MoE golden suite.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "comm/communicator.h"

namespace mt::model::moe {

enum class ScoreFunction { softmax, sigmoid };                                   // --moe-router-score-function
enum class LoadBalancingType { aux_loss, seq_aux_loss, global_aux_loss, none };  // --moe-router-load-balancing-type
enum class TokenDropPolicy { probs, position };                                  // --moe-token-drop-policy

// Flag values <-> enums. The parsers throw mt::UsageError naming the flag and the value.
const char* score_function_name(ScoreFunction function);  // "softmax"
ScoreFunction parse_score_function(std::string_view name);
const char* load_balancing_type_name(LoadBalancingType type);  // "aux_loss"
LoadBalancingType parse_load_balancing_type(std::string_view name);
const char* token_drop_policy_name(TokenDropPolicy policy);  // "probs"
TokenDropPolicy parse_token_drop_policy(std::string_view name);
// Megatron's log name of a type's loss: "load_balancing_loss", "seq_load_balancing_loss",
// "global_load_balancing_loss"; "" for none.
const char* load_balancing_log_name(LoadBalancingType type);

// The router's configuration, Megatron's flags (defaults as Megatron's, except num_experts).
struct RouterOptions {
  int num_experts = 0;                                    // --num-experts (E)
  int topk = 2;                                           // --moe-router-topk (k)
  ScoreFunction score_function = ScoreFunction::softmax;  // --moe-router-score-function
  bool pre_softmax = false;                               // --moe-router-pre-softmax
  int num_groups = 0;                                     // --moe-router-num-groups (0 = None)
  int group_topk = 0;                                     // --moe-router-group-topk (0 = None: no group limit)
  std::optional<float> topk_scaling_factor;               // --moe-router-topk-scaling-factor
  bool enable_expert_bias = false;                        // --moe-router-enable-expert-bias
  LoadBalancingType load_balancing_type = LoadBalancingType::aux_loss;  // --moe-router-load-balancing-type
  float aux_loss_coeff = 0.0f;                                          // --moe-aux-loss-coeff (0: no aux loss)
  std::optional<float> z_loss_coeff;                                    // --moe-z-loss-coeff (None: no z-loss)
  std::optional<double> capacity_factor;                                // --moe-expert-capacity-factor (None: dropless)
  TokenDropPolicy token_drop_policy = TokenDropPolicy::probs;           // --moe-token-drop-policy
  bool pad_expert_input_to_capacity = false;                            // --moe-pad-expert-input-to-capacity
  bool calculate_per_token_loss = false;  // --calculate-per-token-loss (aux/z grads x S |tp_cp|)
};

// Throws mt::UsageError naming the flag for what Megatron refuses or mt cannot run: E < 1; k
// outside [1, E]; k = 1 with post-softmax softmax (Megatron: "use --moe-router-pre-softmax when
// topk is 1"); group_topk without num_groups, num_groups not dividing E, group_topk above
// num_groups or above k (k / group_topk = 0 scores per group), k above the experts of group_topk
// groups; expert bias with softmax (Megatron allows it with sigmoid only); a capacity factor
// <= 0 (Megatron reads a negative one as None: the config mapping does that before);
// pad_expert_input_to_capacity without a capacity factor; a negative coefficient; a scaling
// factor <= 0.
void validate_router_options(const RouterOptions& options);

// Megatron's get_capacity(S k, E, cf) = ceil(S k / E * cf) for a call on S rows (capacity_factor
// must be set).
int64_t expert_capacity(const RouterOptions& options, int64_t rows);

// The rank groups the router reduces over (data communicators of the Router's op table; null or
// size 1 = this rank alone): tp_cp for aux_loss, seq_aux_loss and the z-loss's logged value,
// tp_dp_cp for global_aux_loss.
struct RouterGroups {
  comm::Communicator* tp_cp = nullptr;
  comm::Communicator* tp_dp_cp = nullptr;
};

// The rows of one router call. row_ids, sequence_length and num_sequences are read by
// seq_aux_loss only: row_ids (S) device int64, each row's token id in the micro-batch
// (sample * sequence_length + position, LayerPass::sequence_row_ids), so row t belongs to
// sequence row_ids[t] / sequence_length < num_sequences (the micro-batch's samples); needed by a
// training forward and the backward only. Megatron's sequence total (its local rows x |tp_cp|)
// is sequence_length: the same whenever the group's ranks hold equal shares of each sequence, as
// SP and CP split them.
struct RouterRows {
  int64_t rows = 0;  // S
  const int64_t* row_ids = nullptr;
  int64_t sequence_length = 0;
  int64_t num_sequences = 0;
};

// What forward leaves for backward, in caller buffers (one set per micro-batch in flight):
// topk_indices (Router::saved_index_count(S) int32: each row's k chosen experts before dropping)
// and aux_weights (Router::aux_weight_count(rows) fp32: the counts c the aux loss weighed P with;
// null when that count is 0).
struct RouterSaved {
  int32_t* topk_indices = nullptr;
  float* aux_weights = nullptr;
};

// Megatron's logged values of one forward (absent when the loss did not run): the aux loss over
// its coefficient summed over its reduce group (tp_cp, or tp_dp_cp for global_aux_loss; about
// 1.0 when balanced), and the z-loss over its coefficient averaged over tp_cp (mean over rows of
// logsumexp^2; finite for a coefficient of 0). The trainer averages them over micro-batches, DP
// (not the global aux loss) and layers.
struct RouterLossValues {
  std::optional<double> load_balancing;
  std::optional<double> z_loss;
};

class Router {
 public:
  // Validates the options (validate_router_options). The Router keeps `ops`, `stream` and the
  // groups' pointers; it owns a few small device buffers (E x num_sequences floats at most).
  Router(const RouterOptions& options, const backend::Ops& ops, backend::Stream stream, RouterGroups groups);

  const RouterOptions& options() const { return options_; }
  // Sizes of the RouterSaved buffers for a call on `rows`.
  int64_t saved_index_count(int64_t rows) const;           // S * k
  int64_t aux_weight_count(const RouterRows& rows) const;  // E (num_sequences * E for seq_aux_loss); 0 without aux loss

  // logits (S, E) -> probs (S, E), zero off the map, and routing_map (S, E) 0/1, both after
  // capacity dropping. expert_bias (E) is read when enable_expert_bias (else may be null).
  // `training`: a forward whose backward will run (the losses are computed, reduced and saved;
  // every rank of the groups must pass the same). tokens_per_expert (E, nullable): the final
  // map's column sums are added to it (step (e)). Returns the logged loss values (synchronizes
  // the stream when a loss ran). Collectives: with aux losses one all-reduce over the loss's
  // group (2 x aux_weight_count floats), with the z-loss one of 1 float over tp_cp.
  // `recompute`: a training forward repeating an earlier one of the same rows before its backward
  // (activation recompute); only global_aux_loss reads it (see (d) above).
  RouterLossValues forward(const float* logits, const float* expert_bias, const RouterRows& rows, bool training,
                           float* tokens_per_expert, float* probs, uint8_t* routing_map, const RouterSaved& saved,
                           bool recompute = false);

  // dlogits (S, E) written: the gradient of the probs through the top-k (dprobs (S, E), read
  // where routing_map is 1 and the row's top-k chose the expert), plus, when they ran in
  // forward, the aux loss's and z-loss's gradients times aux_loss_grad_factor (d objective /
  // d loss value). logits, routing_map and `saved` are those of the training forward of the
  // same rows. No collectives.
  void backward(const float* logits, const uint8_t* routing_map, const RouterSaved& saved, const RouterRows& rows,
                const float* dprobs, float aux_loss_grad_factor, float* dlogits) const;

  // global_aux_loss: restarts the running count sum (Megatron's reset_global_aux_loss_tracker in
  // finalize_model_grads, once per global batch after the backward passes). A no-op otherwise.
  void reset_global_aux_counts();
  // global_aux_loss: the micro-batches in the running sum (Megatron's ga_steps); 0 otherwise.
  int64_t global_aux_steps() const { return global_steps_; }

 private:
  void check_rows(const RouterRows& rows, bool training) const;
  double apply_z_loss(const float* logits, int64_t rows);                                        // the logged z value
  double apply_aux_loss(const float* logits, const RouterRows& rows, const RouterSaved& saved,
                        bool recompute);  // aux / coeff
  // global_aux_loss: the weights (running mean of the counts) of this forward, into `weights`.
  void global_aux_weights(const float* counts, bool recompute, std::vector<float>& weights);
  double aux_total_tokens(const RouterRows& rows) const;
  comm::Communicator* aux_group() const;

  RouterOptions options_;
  const backend::Ops& ops_;
  backend::Stream stream_;
  RouterGroups groups_;
  backend::DeviceBuffer<float> aux_sums_;       // (2 G E): counts | column sums of P, G row groups
  backend::DeviceBuffer<float> global_counts_;  // (E): global_aux_loss running sum
  backend::DeviceBuffer<double> z_sum_;         // (1)
  backend::DeviceBuffer<float> z_mean_;         // (1): the logged z value, reduced over tp_cp
  int64_t global_steps_ = 0;                    // micro-batches in the running sum
  std::vector<std::vector<float>> global_means_;  // the weights of each counted forward, in order
  size_t global_recomputed_ = 0;                  // recompute forwards since the reset
};

// The expert-bias update of the aux-loss-free balancing (Megatron's get_updated_expert_bias):
// expert_bias[i] += rate * sign(mean(c) - c[i]) for the E device floats, c = tokens_per_expert
// already summed over TP x DP x CP (sign(0) = 0). The caller zeroes the counts afterwards.
void update_expert_bias(const backend::Ops& ops, backend::Stream stream, float* expert_bias,
                        const float* tokens_per_expert, int num_experts, float rate);

}  // namespace mt::model::moe

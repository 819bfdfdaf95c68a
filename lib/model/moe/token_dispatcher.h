// Megatron's all-to-all token dispatcher (MoEAlltoAllTokenDispatcher) for a MoE layer under expert
// parallelism (EP) and expert-tensor parallelism (ETP): it sends each routed copy of a token to the
// EP rank that holds its expert, hands the experts their rows grouped by local expert, and brings
// the experts' outputs back to token order. Tested in tests/unit/model/test_token_dispatcher.cpp
// (ranks as threads: EP 2, 4, ETP 2, EP 2 x ETP 2 against the reference over all tokens, forward
// and backward, an empty expert, an EP rank receiving none, a rank sending none, EP giving the
// one-rank bits, micro-batches in flight, the one host wait, refusals) and
// tests/mpi/test_token_dispatcher.cpp (EP 2, 4 and EP 2 x ETP 2 over MPI ranks, on the CPU table
// and the asynchronous test table). A dispatcher and its states are used by one thread at a time.
//
// Shapes (fp32 device memory of the dispatcher's backend; C the hidden width):
//   S    tokens this rank routes (its sequence-parallel rows), E experts, EP x ETP ranks;
//   E_local = E / EP experts per EP rank: EP rank p holds global experts [p E_local, (p+1) E_local);
//   R_send  routed copies this rank sends (ones of its routing map);
//   R       rows this rank's local experts receive (from every (etp, ep) rank of expert_tp_ep).
//
// Forward, Megatron's steps (facts note sec. 1.5):
//   dispatch: per-expert counts of the routing map (E), all-gathered over expert_tp_ep as
//     [ETP][EP][E] (group rank etp + ETP ep), copied to the host with ONE device-to-host copy and
//     one stream synchronize (the only host wait of a micro-batch; every later split is computed on
//     the host from it); permute the rows expert-major, token-ascending inside an expert (stable,
//     which is already grouped by destination EP rank); all_to_allv of the rows and, separately,
//     of their probs over ep; when ETP > 1 an all-gather-v over expert_tp (made of all_to_allv);
//     then the chunk sort from [etp][ep source][local expert] to [local expert][etp][ep source].
//     Output: expert input rows (R, C) in that local-expert-major order, tokens ascending inside
//     each (etp, ep source, expert) chunk; their probs (R); tokens_per_local_expert (E_local, host).
//   combine: the experts' output rows (R, C) in the same order (under ETP > 1 each etp rank's rows
//     are partial sums over its share of the ffn width): the chunk sort back, a reduce-scatter-v
//     over expert_tp (made of all_to_allv, the ETP pieces summed in etp rank order), all_to_allv
//     back over ep, and the unpermute: y (S, C) row t = the sum, in expert order, of the rows of
//     token t's routed copies; zero for a token routed nowhere. No prob multiply here: the
//     experts apply the probs (moe-design.md).
// Backward, the transposes:
//   combine_backward(dy (S, C)) -> d expert output rows (R, C): the rows of dy gathered as dispatch
//     gathers x (an etp rank receives every etp rank's rows, as combine's reduce-scatter summed them).
//   dispatch_backward(d rows (R, C), d probs (R)) -> dx (S, C) and dprobs (S, E): reduce-scatter-v
//     over expert_tp of both (each etp rank's partial grads summed), all_to_allv back, then dx =
//     the sum of a token's copies' grads (in expert order) and dprobs dense, (t, e) the grad of
//     token t's copy at expert e, zero off-route.
//
// Collectives, all on the data communicators given (comm/communicator.h), in this order on every
// rank of a group whatever the counts (zero-size pieces included: a rank whose experts receive no
// token still takes part):
//   dispatch:          all_gather(i64, expert_tp_ep); rows: all_to_allv(ep), then ETP > 1:
//                      all_to_allv(expert_tp); then probs the same two.
//   combine:           ETP > 1: all_to_allv(expert_tp); all_to_allv(ep).
//   combine_backward:  all_to_allv(ep); ETP > 1: all_to_allv(expert_tp).
//   dispatch_backward: rows: ETP > 1: all_to_allv(expert_tp), then all_to_allv(ep); then the
//                      prob grads the same two.
// A null communicator, or one of size 1, is no parallelism on that dimension (no call is issued
// on it); the sizes given must match the communicators' sizes (checked at construction).
//
// Per-micro-batch state: what a micro-batch's combine and backward need (the host splits and
// counts, the row-to-token index, the chunk tables, its expert input rows and probs) lives in a
// DispatchState the caller holds from dispatch to dispatch_backward, one per micro-batch in flight
// (pipeline schedules keep several). A state may be reused for a later micro-batch once its
// backward has run (its buffers are kept and grown on demand).
//
// Memory (backend::DeviceBuffer, reported to the MemoryLedger given, nullable):
//   - a DispatchState's buffers are `activations` (they live from forward to backward): expert
//     input rows (R, C) and probs (R), the row-to-token index (R_send), the per-expert counts (E)
//     and the chunk tables; they grow when a micro-batch needs more than they hold and never
//     shrink, so the ledger's peak is the largest micro-batch seen.
//   - the dispatcher's own workspace is `comm_buffers`: send and receive rows of the collectives,
//     used within one call only and shared by every micro-batch; it grows on demand the same way.
// R varies step to step (dropless routing): size a caller's (R, C) buffers from state.rows().
//
// Bad input throws mt::Error naming it: E not a multiple of EP, sizes that disagree with the
// communicators, an expert_tp_ep rank that is not etp + ETP ep, a state used before its dispatch.
// The backend must fill the dispatcher's entries of its op table (backend/ops.h, block "MoE token
// dispatcher": moe_expert_counts, moe_route_index, moe_permute_rows, moe_unpermute_rows,
// moe_unroute_probs, moe_sort_chunks); the CPU and CUDA tables do, and the constructor refuses a
// table without them by name.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "comm/communicator.h"

namespace mt::model {

// Where this rank sits in the expert grid and the groups it dispatches over.
struct DispatcherGroups {
  int expert_parallel = 1;         // EP
  int expert_tensor_parallel = 1;  // ETP
  int ep_rank = 0;                 // this rank's ep coordinate, in [0, EP)
  int etp_rank = 0;                // this rank's etp coordinate, in [0, ETP)
  comm::Communicator* ep = nullptr;            // size EP, rank ep_rank (null when EP = 1)
  comm::Communicator* expert_tp = nullptr;     // size ETP, rank etp_rank (null when ETP = 1)
  comm::Communicator* expert_tp_ep = nullptr;  // size ETP EP, rank etp_rank + ETP ep_rank (null when both 1)
};

// One micro-batch's dispatch, from dispatch to dispatch_backward (see the header comment).
class DispatchState {
 public:
  DispatchState() = default;
  DispatchState(const DispatchState&) = delete;
  DispatchState& operator=(const DispatchState&) = delete;
  DispatchState(DispatchState&&) = default;
  DispatchState& operator=(DispatchState&&) = default;

  bool dispatched() const { return dispatched_; }
  int64_t tokens() const { return tokens_; }  // S
  int64_t rows() const { return rows_; }      // R: rows the local experts receive
  int64_t sent_rows() const { return sent_rows_; }  // R_send: routed copies this rank sent
  // Expert input rows (R, C), local-expert-major, and their probs (R): device memory valid until
  // the state's next dispatch.
  const float* expert_rows() const { return expert_rows_.data(); }
  const float* expert_probs() const { return expert_probs_.data(); }
  // Rows per local expert (E_local, host): local expert l's rows start at the sum of those before.
  const std::vector<int64_t>& tokens_per_local_expert() const { return tokens_per_local_expert_; }

 private:
  friend class TokenDispatcher;

  bool dispatched_ = false;
  int64_t tokens_ = 0, rows_ = 0, sent_rows_ = 0;
  std::vector<int64_t> tokens_per_local_expert_;  // (E_local)
  std::vector<int64_t> gathered_counts_;          // (ETP EP, E): every rank's per-expert counts
  std::vector<int64_t> send_splits_, recv_splits_;  // (EP): rows to / from each ep rank
  std::vector<int64_t> etp_splits_;                 // (ETP): rows from each etp rank after the gather
  backend::DeviceBuffer<int64_t> expert_counts_;    // (E): this rank's routed copies per expert
  backend::DeviceBuffer<int32_t> row_token_;        // (R_send): token of each sent row
  // The chunk sort to the experts' order, then its inverse (2 ETP EP E_local each): chunk sizes in
  // input order and the order; the host copies stay until the next dispatch (an asynchronous
  // backend reads them after the upload call returns).
  std::vector<int64_t> host_chunk_rows_;
  std::vector<int32_t> host_chunk_order_;
  backend::DeviceBuffer<int64_t> chunk_rows_;
  backend::DeviceBuffer<int32_t> chunk_order_;
  backend::DeviceBuffer<float> expert_rows_;   // (R, C)
  backend::DeviceBuffer<float> expert_probs_;  // (R)
};

class TokenDispatcher {
 public:
  // E experts over groups.expert_parallel EP ranks, hidden width C; buffers from `ops` (which must
  // fill the moe_* entries), work issued on `stream`, memory reported to `ledger` (nullable).
  TokenDispatcher(int experts, int64_t hidden, const DispatcherGroups& groups, const backend::Ops& ops,
                  backend::Stream stream, backend::MemoryLedger* ledger = nullptr);

  int experts() const { return experts_; }
  int local_experts() const { return experts_ / ep_size_; }
  int first_local_expert() const { return ep_rank_ * local_experts(); }
  int64_t hidden() const { return hidden_; }

  // x (S, C), probs (S, E) fp32 zero off-route, routing_map (S, E) 0/1 -> state's expert rows
  // (R, C), probs (R) and tokens_per_local_expert. Collective over expert_tp_ep, ep, expert_tp.
  void dispatch(const float* x, const float* probs, const uint8_t* routing_map, int64_t tokens,
                DispatchState& state);
  // expert_out (R, C) in the state's row order -> y (S, C) (overwritten).
  void combine(const DispatchState& state, const float* expert_out, float* y);
  // dy (S, C) -> d_expert_out (R, C) (overwritten).
  void combine_backward(const DispatchState& state, const float* dy, float* d_expert_out);
  // d_rows (R, C) and d_probs (R) in the state's row order -> dx (S, C) and dprobs (S, E), both
  // overwritten (dprobs zero off-route).
  void dispatch_backward(const DispatchState& state, const float* d_rows, const float* d_probs, float* dx,
                         float* dprobs);

 private:
  // The two directions every call is made of (width C for rows, 1 for probs):
  // send-side rows (R_send, width) in expert-major order -> expert-order rows (R, width).
  void to_experts(const DispatchState& state, const float* sent, int64_t width, float* expert_order);
  // expert-order rows (R, width) -> send-side rows (R_send, width), ETP pieces summed.
  void from_experts(const DispatchState& state, const float* expert_order, int64_t width, float* sent);

  void gather_counts(const uint8_t* routing_map, int64_t tokens, DispatchState& state);
  void plan_splits(DispatchState& state) const;
  void upload_chunk_tables(DispatchState& state);
  const DispatchState& checked(const DispatchState& state, const char* call) const;
  float* workspace(int slot, int64_t count);

  int experts_;
  int64_t hidden_;
  int ep_size_, etp_size_, ep_rank_, etp_rank_;
  comm::Communicator* ep_;
  comm::Communicator* expert_tp_;
  comm::Communicator* expert_tp_ep_;
  const backend::Ops& ops_;
  backend::Stream stream_;
  backend::MemoryLedger* ledger_;
  backend::DeviceBuffer<int64_t> gathered_counts_;       // (ETP EP, E) comm_buffers
  std::vector<backend::DeviceBuffer<float>> workspace_;  // comm_buffers, grown on demand
};

}  // namespace mt::model

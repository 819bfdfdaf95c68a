// The all-to-all token dispatcher (see token_dispatcher.h): the count exchange and its one host
// sync, the host plan of splits and chunk orders, and the two directions every call is made of
// (to the experts: all_to_allv over ep, all-gather-v over expert_tp, chunk sort; back: chunk
// unsort, reduce-scatter-v over expert_tp, all_to_allv over ep).
#include "model/moe/token_dispatcher.h"

#include <cstdint>
#include <numeric>
#include <string>

#include "core/error.h"

namespace mt::model {
namespace {

using backend::CopyKind;
using backend::DeviceBuffer;
using backend::MemoryCategory;

// The dispatcher's workspace slots (comm_buffers), one per intermediate of a call.
enum Slot : int {
  kSentRows,     // (R_send, C) rows in this rank's expert-major order
  kSentProbs,    // (R_send) their probs (or prob grads)
  kFromEp,       // (rows from ep, width) after the all_to_allv over ep
  kFromEtp,      // (R, width) after the all-gather-v over expert_tp
  kUnsorted,     // (R, width) expert-order rows unsorted to [etp][ep][expert]
  kEtpPieces,    // (ETP rows from ep, width) each etp rank's partial sums of this rank's rows
  kSlots
};

int64_t total(const std::vector<int64_t>& values) { return std::accumulate(values.begin(), values.end(), int64_t{0}); }

// Element offsets of consecutive pieces of `rows[i] * width` elements.
std::vector<int64_t> offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> first(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) first[i] = first[i - 1] + counts[i - 1];
  return first;
}

std::vector<int64_t> scaled(const std::vector<int64_t>& rows, int64_t width) {
  std::vector<int64_t> elements(rows);
  for (auto& e : elements) e *= width;
  return elements;
}

// `buffer` holds at least `count` elements (reallocated, contents dropped, when it holds fewer).
template <typename T>
void ensure(DeviceBuffer<T>& buffer, int64_t count, const backend::Ops& ops, MemoryCategory category,
            backend::MemoryLedger* ledger) {
  if (buffer.size() >= count) return;
  buffer = DeviceBuffer<T>();  // free first: the peak is the larger buffer, not both
  buffer = DeviceBuffer<T>(ops, count, category, ledger);
}

// A communicator of `size` ranks where this rank is `rank`; null stands for a group of one.
void check_group(const char* name, const comm::Communicator* group, int size, int rank) {
  const std::string what = std::string("token dispatcher: ") + name + " group";
  if (size == 1 && group == nullptr) return;
  if (group == nullptr) throw Error(what, "missing for a size of " + std::to_string(size));
  if (group->size() != size || group->rank() != rank) {
    throw Error(what, "has " + std::to_string(group->size()) + " ranks and this is rank " +
                          std::to_string(group->rank()) + ", expected " + std::to_string(size) + " ranks and rank " +
                          std::to_string(rank));
  }
}

void check_kernels(const backend::Ops& ops) {
  for (backend::OpId op : {backend::OpId::moe_expert_counts, backend::OpId::moe_route_index,
                           backend::OpId::moe_permute_rows, backend::OpId::moe_unpermute_rows,
                           backend::OpId::moe_unroute_probs, backend::OpId::moe_sort_chunks}) {
    if (backend::op_entry(ops, op) == nullptr) {
      throw Error("token dispatcher", std::string("the ") + ops.name + " backend has no " + backend::op_name(op) +
                                          " kernel (MoE runs on the CPU this release)");
    }
  }
}

}  // namespace

TokenDispatcher::TokenDispatcher(int experts, int64_t hidden, const DispatcherGroups& groups, const backend::Ops& ops,
                                 backend::Stream stream, backend::MemoryLedger* ledger)
    : experts_(experts),
      hidden_(hidden),
      ep_size_(groups.expert_parallel),
      etp_size_(groups.expert_tensor_parallel),
      ep_rank_(groups.ep_rank),
      etp_rank_(groups.etp_rank),
      ep_(groups.ep),
      expert_tp_(groups.expert_tp),
      expert_tp_ep_(groups.expert_tp_ep),
      ops_(ops),
      stream_(stream),
      ledger_(ledger),
      workspace_(kSlots) {
  if (experts <= 0) throw Error("token dispatcher", "needs at least one expert, got " + std::to_string(experts));
  if (hidden <= 0) throw Error("token dispatcher", "hidden width " + std::to_string(hidden) + " is not positive");
  if (ep_size_ < 1 || etp_size_ < 1) {
    throw Error("token dispatcher", "EP " + std::to_string(ep_size_) + " and expert-TP " + std::to_string(etp_size_) +
                                        " must be at least 1");
  }
  if (experts % ep_size_ != 0) {
    throw Error("token dispatcher", std::to_string(experts) + " experts do not split over EP " +
                                        std::to_string(ep_size_) + " ranks");
  }
  if (ep_rank_ < 0 || ep_rank_ >= ep_size_ || etp_rank_ < 0 || etp_rank_ >= etp_size_) {
    throw Error("token dispatcher", "coordinates ep " + std::to_string(ep_rank_) + ", etp " +
                                        std::to_string(etp_rank_) + " are outside EP " + std::to_string(ep_size_) +
                                        " x expert-TP " + std::to_string(etp_size_));
  }
  check_group("ep", ep_, ep_size_, ep_rank_);
  check_group("expert_tp", expert_tp_, etp_size_, etp_rank_);
  check_group("expert_tp_ep", expert_tp_ep_, ep_size_ * etp_size_, etp_rank_ + etp_size_ * ep_rank_);
  check_kernels(ops_);
  gathered_counts_ = DeviceBuffer<int64_t>(ops_, int64_t{ep_size_} * etp_size_ * experts_,
                                           MemoryCategory::comm_buffers, ledger_);
}

const DispatchState& TokenDispatcher::checked(const DispatchState& state, const char* call) const {
  if (!state.dispatched_) throw Error(std::string("token dispatcher ") + call, "the state has not been dispatched");
  return state;
}

float* TokenDispatcher::workspace(int slot, int64_t count) {
  ensure(workspace_[static_cast<size_t>(slot)], count, ops_, MemoryCategory::comm_buffers, ledger_);
  return workspace_[static_cast<size_t>(slot)].data();
}

// Per-expert counts of this rank's map, all-gathered over expert_tp_ep as [ETP EP][E] (group
// rank etp + ETP ep), and the one device-to-host copy and host wait of the micro-batch.
void TokenDispatcher::gather_counts(const uint8_t* routing_map, int64_t tokens, DispatchState& state) {
  ensure(state.expert_counts_, experts_, ops_, MemoryCategory::activations, ledger_);
  ops_.moe_expert_counts(routing_map, tokens, experts_, state.expert_counts_.data(), stream_);
  const int64_t* gathered = state.expert_counts_.data();
  if (ep_size_ * etp_size_ > 1) {
    expert_tp_ep_->all_gather(state.expert_counts_.data(), gathered_counts_.data(), experts_, DType::i64);
    gathered = gathered_counts_.data();
  }
  state.gathered_counts_.assign(static_cast<size_t>(ep_size_ * etp_size_ * experts_), 0);
  ops_.copy(state.gathered_counts_.data(), gathered,
            static_cast<int64_t>(state.gathered_counts_.size() * sizeof(int64_t)), CopyKind::device_to_host, stream_);
  ops_.synchronize(stream_);
}

// The splits of every collective and the rows per local expert, from the gathered counts.
void TokenDispatcher::plan_splits(DispatchState& state) const {
  const int local = local_experts();
  const auto count = [&](int etp, int ep, int expert) {
    return state.gathered_counts_[static_cast<size_t>((etp + etp_size_ * ep) * experts_ + expert)];
  };
  state.send_splits_.assign(static_cast<size_t>(ep_size_), 0);
  state.recv_splits_.assign(static_cast<size_t>(ep_size_), 0);
  state.etp_splits_.assign(static_cast<size_t>(etp_size_), 0);
  state.tokens_per_local_expert_.assign(static_cast<size_t>(local), 0);
  for (int q = 0; q < ep_size_; ++q) {
    for (int l = 0; l < local; ++l) {
      state.send_splits_[q] += count(etp_rank_, ep_rank_, q * local + l);
      state.recv_splits_[q] += count(etp_rank_, q, first_local_expert() + l);
      for (int i = 0; i < etp_size_; ++i) {
        state.etp_splits_[i] += count(i, q, first_local_expert() + l);
        state.tokens_per_local_expert_[l] += count(i, q, first_local_expert() + l);
      }
    }
  }
  state.sent_rows_ = total(state.send_splits_);
  state.rows_ = total(state.tokens_per_local_expert_);
}

// The chunk sort between the gathered order [etp][ep][local expert] and the experts' order
// [local expert][etp][ep], both ways, as device tables: sizes in input order and the order, the
// sort's in [0, chunks), its inverse's in [chunks, 2 chunks).
void TokenDispatcher::upload_chunk_tables(DispatchState& state) {
  const int local = local_experts();
  const int chunks = etp_size_ * ep_size_ * local;
  const auto gathered_index = [&](int i, int q, int l) { return (i * ep_size_ + q) * local + l; };
  const auto expert_index = [&](int i, int q, int l) { return (l * etp_size_ + i) * ep_size_ + q; };
  state.host_chunk_rows_.assign(static_cast<size_t>(2 * chunks), 0);
  state.host_chunk_order_.assign(static_cast<size_t>(2 * chunks), 0);
  int64_t* sort_rows = state.host_chunk_rows_.data();
  int64_t* unsort_rows = sort_rows + chunks;
  int32_t* sort_order = state.host_chunk_order_.data();
  int32_t* unsort_order = sort_order + chunks;
  for (int i = 0; i < etp_size_; ++i)
    for (int q = 0; q < ep_size_; ++q)
      for (int l = 0; l < local; ++l) {
        const int64_t rows =
            state.gathered_counts_[static_cast<size_t>((i + etp_size_ * q) * experts_ + first_local_expert() + l)];
        sort_rows[gathered_index(i, q, l)] = rows;
        unsort_rows[expert_index(i, q, l)] = rows;
        sort_order[expert_index(i, q, l)] = gathered_index(i, q, l);
        unsort_order[gathered_index(i, q, l)] = expert_index(i, q, l);
      }
  ensure(state.chunk_rows_, 2 * chunks, ops_, MemoryCategory::activations, ledger_);
  ensure(state.chunk_order_, 2 * chunks, ops_, MemoryCategory::activations, ledger_);
  ops_.copy(state.chunk_rows_.data(), sort_rows, 2 * chunks * static_cast<int64_t>(sizeof(int64_t)),
            CopyKind::host_to_device, stream_);
  ops_.copy(state.chunk_order_.data(), sort_order, 2 * chunks * static_cast<int64_t>(sizeof(int32_t)),
            CopyKind::host_to_device, stream_);
}

void TokenDispatcher::dispatch(const float* x, const float* probs, const uint8_t* routing_map, int64_t tokens,
                               DispatchState& state) {
  if (tokens < 0 || tokens > INT32_MAX) {
    throw Error("token dispatcher", std::to_string(tokens) + " tokens are outside [0, 2^31)");
  }
  state.dispatched_ = false;
  state.tokens_ = tokens;
  gather_counts(routing_map, tokens, state);
  plan_splits(state);
  upload_chunk_tables(state);

  ensure(state.row_token_, state.sent_rows_, ops_, MemoryCategory::activations, ledger_);
  float* sent_probs = workspace(kSentProbs, state.sent_rows_);
  ops_.moe_route_index(routing_map, probs, tokens, experts_, state.row_token_.data(), sent_probs, stream_);
  float* sent_rows = workspace(kSentRows, state.sent_rows_ * hidden_);
  ops_.moe_permute_rows(x, state.row_token_.data(), state.sent_rows_, hidden_, sent_rows, stream_);

  ensure(state.expert_rows_, state.rows_ * hidden_, ops_, MemoryCategory::activations, ledger_);
  ensure(state.expert_probs_, state.rows_, ops_, MemoryCategory::activations, ledger_);
  state.dispatched_ = true;
  to_experts(state, sent_rows, hidden_, state.expert_rows_.data());
  to_experts(state, sent_probs, 1, state.expert_probs_.data());
}

void TokenDispatcher::combine(const DispatchState& state, const float* expert_out, float* y) {
  checked(state, "combine");
  float* sent_rows = workspace(kSentRows, state.sent_rows_ * hidden_);
  from_experts(state, expert_out, hidden_, sent_rows);
  ops_.moe_unpermute_rows(sent_rows, state.row_token_.data(), state.sent_rows_, hidden_, y, state.tokens_, stream_);
}

void TokenDispatcher::combine_backward(const DispatchState& state, const float* dy, float* d_expert_out) {
  checked(state, "combine_backward");
  float* sent_rows = workspace(kSentRows, state.sent_rows_ * hidden_);
  ops_.moe_permute_rows(dy, state.row_token_.data(), state.sent_rows_, hidden_, sent_rows, stream_);
  to_experts(state, sent_rows, hidden_, d_expert_out);
}

void TokenDispatcher::dispatch_backward(const DispatchState& state, const float* d_rows, const float* d_probs,
                                        float* dx, float* dprobs) {
  checked(state, "dispatch_backward");
  float* sent_rows = workspace(kSentRows, state.sent_rows_ * hidden_);
  float* sent_probs = workspace(kSentProbs, state.sent_rows_);
  from_experts(state, d_rows, hidden_, sent_rows);
  from_experts(state, d_probs, 1, sent_probs);
  ops_.moe_unpermute_rows(sent_rows, state.row_token_.data(), state.sent_rows_, hidden_, dx, state.tokens_, stream_);
  ops_.moe_unroute_probs(sent_probs, state.row_token_.data(), state.expert_counts_.data(), state.tokens_, experts_,
                         dprobs, stream_);
}

// sent (R_send, width), expert-major -> all_to_allv over ep -> [ep source][local expert]
// -> all-gather-v over expert_tp -> [etp][ep source][local expert] -> chunk sort -> expert_order.
void TokenDispatcher::to_experts(const DispatchState& state, const float* sent, int64_t width, float* expert_order) {
  const float* rows = sent;
  if (ep_size_ > 1) {
    const int64_t from_ep_rows = total(state.recv_splits_);
    float* from_ep = workspace(kFromEp, from_ep_rows * width);
    const auto send_counts = scaled(state.send_splits_, width), recv_counts = scaled(state.recv_splits_, width);
    ep_->all_to_allv(rows, send_counts.data(), offsets(send_counts).data(), from_ep, recv_counts.data(),
                     offsets(recv_counts).data(), DType::f32);
    rows = from_ep;
  }
  if (etp_size_ > 1) {
    // All-gather-v as an all_to_allv: this rank's rows go whole to every etp rank.
    float* from_etp = workspace(kFromEtp, state.rows_ * width);
    const int64_t mine = total(state.recv_splits_) * width;
    const std::vector<int64_t> send_counts(static_cast<size_t>(etp_size_), mine), send_offsets(send_counts.size(), 0);
    const auto recv_counts = scaled(state.etp_splits_, width);
    expert_tp_->all_to_allv(rows, send_counts.data(), send_offsets.data(), from_etp, recv_counts.data(),
                            offsets(recv_counts).data(), DType::f32);
    rows = from_etp;
  }
  const int chunks = etp_size_ * ep_size_ * local_experts();
  ops_.moe_sort_chunks(rows, width, state.chunk_rows_.data(), state.chunk_order_.data(), chunks, expert_order,
                       stream_);
}

// expert_order (R, width) -> chunk unsort -> [etp][ep source][local expert] -> reduce-scatter-v
// over expert_tp (this rank's block from every etp rank, summed in etp rank order) -> all_to_allv
// back over ep -> sent (R_send, width), expert-major.
void TokenDispatcher::from_experts(const DispatchState& state, const float* expert_order, int64_t width,
                                   float* sent) {
  const bool direct = ep_size_ == 1 && etp_size_ == 1;
  float* rows = direct ? sent : workspace(kUnsorted, state.rows_ * width);
  const int chunks = etp_size_ * ep_size_ * local_experts();
  ops_.moe_sort_chunks(expert_order, width, state.chunk_rows_.data() + chunks, state.chunk_order_.data() + chunks,
                       chunks, rows, stream_);
  const int64_t mine = total(state.recv_splits_) * width;
  if (etp_size_ > 1) {
    float* pieces = workspace(kEtpPieces, etp_size_ * mine);
    const auto send_counts = scaled(state.etp_splits_, width);
    const std::vector<int64_t> recv_counts(static_cast<size_t>(etp_size_), mine);
    expert_tp_->all_to_allv(rows, send_counts.data(), offsets(send_counts).data(), pieces, recv_counts.data(),
                            offsets(recv_counts).data(), DType::f32);
    for (int i = 1; i < etp_size_; ++i) ops_.add_inplace(pieces, pieces + i * mine, mine, stream_);
    rows = pieces;
  }
  if (ep_size_ > 1) {
    const auto send_counts = scaled(state.recv_splits_, width), recv_counts = scaled(state.send_splits_, width);
    ep_->all_to_allv(rows, send_counts.data(), offsets(send_counts).data(), sent, recv_counts.data(),
                     offsets(recv_counts).data(), DType::f32);
  } else if (!direct) {
    ops_.copy(sent, rows, mine * static_cast<int64_t>(sizeof(float)), CopyKind::device_to_device, stream_);
  }
}

}  // namespace mt::model

// Runs one rank's pipeline schedule (parallel/pipeline_schedule.h) over its stages (one per model
// chunk): each action's forward or backward on its stage, with the activations and grads between
// virtual stages sent and received over the pipeline group (Megatron's p2p_communication).
//
// Sends are non-blocking from a pool of send buffers (the interleaved schedule deadlocks with
// blocking sends, docs/DESIGN.md) and waited at the end of the run. Receives are posted one
// action ahead when the buffer they land in is free (a forward's input slot of its stage, one of
// two grad buffers), so the next input travels while this action computes, and waited just before
// the action needs it. A message's tag names its pass and the virtual stage receiving it; the
// micro-batches of one (pass, virtual stage) pair go and arrive in the same (ascending) order on
// both ranks, so MPI's in-order matching of equal tags pairs them. Activation slots are taken by
// a micro-batch's forward and freed by its backward (at once in a forward-only run), from the
// pool its chunk shares with others of the rank (parallel::pipeline_slot_pools; slot k of a pool
// is the same memory in each of its stages).
// With one stage and one chunk it is the plain loop over micro-batches (forward, then backward).
// Megatron's level-2 timers (backend/step_timers.h), given through the callbacks of a training
// run: forward-compute and backward-compute around the passes, forward-recv and backward-recv
// around the waits for a pass's input, forward-send and backward-send around posting a pass's
// output and waiting for it at the end of the run. The engine posts each send and receive on its
// own (no batched send-and-receive), so Megatron's combined timers (forward-send-backward-recv,
// ...) never run.
// Tested through the trainer in tests/mpi/test_data_parallel.cpp (every pipeline layout against
// one rank) and tests/tools/mt-train-mpi.bats.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "backend/step_timers.h"
#include "backend/stream_timer.h"
#include "comm/communicator.h"
#include "model/micro_batch.h"
#include "model/parallel_context.h"
#include "model/stage.h"
#include "parallel/pipeline_schedule.h"

namespace mt::train {

// What a run asks of its caller, per micro-batch.
struct PipelineCallbacks {
  // The micro-batch's samples; their buffers must stay valid until the run returns.
  std::function<model::MicroBatch(int micro_batch)> batch;
  // Training: the loss's grad scale on the last stage (model/stage.h backward).
  std::function<float(int micro_batch)> dloss_scale;
  // Training: called just before the last backward of each model chunk (grad sync arms there).
  std::function<void(int chunk)> before_last_backward;
  // Training: Megatron's step timers the run's passes and p2p run under (null: not timed).
  backend::StepTimers* timers = nullptr;
};

class PipelineEngine {
 public:
  // `stages[c]` is model chunk c of this rank; `pipeline` is the PP group (this rank is its
  // rank pipeline.rank()); all must outlive the engine. Micro-batches hold at most `max_rows`
  // tokens (micro-batch size x sequence length); p2p buffers report to `ledger` (nullable).
  // `slot_pool_of_chunk[c]` names the slot pool chunk c's stage takes its slots from (stages
  // of one pool have the same number of slots); empty: a pool per chunk.
  PipelineEngine(std::vector<model::Stage*> stages, comm::Communicator& pipeline, const model::ParallelContext& parallel,
                 const backend::Ops& ops, int hidden_size, int64_t max_rows, backend::MemoryLedger* ledger = nullptr,
                 std::vector<int> slot_pool_of_chunk = {});
  ~PipelineEngine();

  // Runs `actions` (this rank's list for the shape) with `pass`. The micro-batches whose last
  // virtual stage runs here add their loss sums to their batch's loss_sums (device memory, on the
  // stream, in the schedule's order of their forwards); nothing is read back on the host.
  void run(const std::vector<parallel::PipelineAction>& actions, const model::ForwardPass& pass,
           const PipelineCallbacks& callbacks);

  // The last run's seconds in its stages' forward and backward passes (compute, with their
  // tensor-parallel collectives; not the waits for p2p inputs, the sends or the callbacks), and
  // its time from the first pass to the last send done: measured with events on the stream
  // (backend/stream_timer.h), so they time the work, not its queueing; read them once the stream
  // has been synchronized past the run (on the CPU, at once).
  double compute_seconds() const;
  double run_seconds() const { return run_timer_->elapsed_seconds(); }

 private:
  struct PendingReceive;
  struct OutgoingMessage;
  int tag(parallel::PipelinePass pass, int virtual_stage) const;
  int virtual_stage(int chunk) const { return chunk * pipeline_.size() + pipeline_.rank(); }
  int64_t message_elements(const model::MicroBatch& batch) const;
  // Posts action `index`'s receive unless posted; returns false (nothing posted) when its
  // buffer is not free yet and `wait_for_buffer` is false.
  bool post_receive(size_t index, bool wait_for_buffer);
  void send(const float* data, int64_t elements, int peer, int tag, parallel::PipelinePass pass);

  std::vector<model::Stage*> stages_;
  comm::Communicator& pipeline_;
  const model::ParallelContext& parallel_;
  const backend::Ops& ops_;
  int hidden_size_;
  int64_t max_elements_;  // the largest message: (sequence rows, hidden)
  backend::MemoryLedger* ledger_;
  std::vector<int> slot_pool_of_chunk_;
  // Per run.
  const std::vector<parallel::PipelineAction>* actions_ = nullptr;
  const PipelineCallbacks* callbacks_ = nullptr;
  std::vector<std::vector<int>> free_slots_;      // per slot pool
  std::vector<std::vector<int>> slot_of_micro_;   // per chunk: micro-batch -> slot
  std::vector<std::unique_ptr<PendingReceive>> receives_;  // per action
  std::vector<backend::DeviceBuffer<float>> grad_buffers_;  // two, alternating
  int next_grad_buffer_ = 0;
  std::vector<std::unique_ptr<OutgoingMessage>> outgoing_;
  // A timer per pass of the last run (kept from run to run, grown to the longest) and one for
  // the whole run.
  backend::StreamTimer& pass_timer();
  std::vector<std::unique_ptr<backend::StreamTimer>> pass_timers_;
  size_t passes_timed_ = 0;
  std::unique_ptr<backend::StreamTimer> run_timer_;
};

}  // namespace mt::train

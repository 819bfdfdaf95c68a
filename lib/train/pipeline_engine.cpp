// One rank's pipeline schedule over its stages with p2p between virtual stages (see pipeline_engine.h).
#include "train/pipeline_engine.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace mt::train {

struct PipelineEngine::PendingReceive {
  std::unique_ptr<comm::Request> request;
  float* buffer = nullptr;
  int slot = -1;  // a forward's input slot
};

struct PipelineEngine::OutgoingMessage {
  backend::DeviceBuffer<float> buffer;
  std::unique_ptr<comm::Request> request;
  parallel::PipelinePass pass = parallel::PipelinePass::forward;  // whose output it carries
};

namespace {

using backend::StepTimer;
using backend::TimerScope;

StepTimer compute_timer(parallel::PipelinePass pass) {
  return pass == parallel::PipelinePass::forward ? StepTimer::forward_compute : StepTimer::backward_compute;
}
StepTimer recv_timer(parallel::PipelinePass pass) {
  return pass == parallel::PipelinePass::forward ? StepTimer::forward_recv : StepTimer::backward_recv;
}
StepTimer send_timer(parallel::PipelinePass pass) {
  return pass == parallel::PipelinePass::forward ? StepTimer::forward_send : StepTimer::backward_send;
}

}  // namespace

PipelineEngine::PipelineEngine(std::vector<model::Stage*> stages, comm::Communicator& pipeline,
                               const model::ParallelContext& parallel, const backend::Ops& ops, int hidden_size,
                               int64_t max_rows, backend::MemoryLedger* ledger, std::vector<int> slot_pool_of_chunk)
    : stages_(std::move(stages)),
      pipeline_(pipeline),
      parallel_(parallel),
      ops_(ops),
      hidden_size_(hidden_size),
      max_elements_(parallel.sequence_rows(max_rows) * hidden_size),
      ledger_(ledger),
      slot_pool_of_chunk_(std::move(slot_pool_of_chunk)) {
  if (stages_.empty()) throw Error("pipeline", "a rank runs at least one model chunk");
  run_timer_ = std::make_unique<backend::StreamTimer>(ops_, ops_.default_stream());
  if (slot_pool_of_chunk_.empty()) {
    for (size_t c = 0; c < stages_.size(); ++c) slot_pool_of_chunk_.push_back(static_cast<int>(c));
  }
  if (slot_pool_of_chunk_.size() != stages_.size()) throw Error("pipeline", "a slot pool per model chunk expected");
  for (size_t c = 0; c < stages_.size(); ++c) {
    const int pool = slot_pool_of_chunk_[c];
    if (pool < 0 || pool >= static_cast<int>(stages_.size())) throw Error("pipeline", "slot pool out of range");
    for (size_t other = 0; other < c; ++other) {
      if (slot_pool_of_chunk_[other] == pool && stages_[other]->activation_slots() != stages_[c]->activation_slots()) {
        throw Error("pipeline", "model chunks " + std::to_string(other) + " and " + std::to_string(c) +
                                    " share a slot pool but hold different numbers of slots");
      }
    }
  }
  if (pipeline_.size() > 1) {
    for (int b = 0; b < 2; ++b) {
      grad_buffers_.emplace_back(ops_, max_elements_, backend::MemoryCategory::comm_buffers, ledger_);
    }
  }
}

PipelineEngine::~PipelineEngine() = default;

int PipelineEngine::tag(parallel::PipelinePass pass, int virtual_stage) const {
  const int virtual_stages = pipeline_.size() * static_cast<int>(stages_.size());
  return (pass == parallel::PipelinePass::backward ? virtual_stages : 0) + virtual_stage;
}

int64_t PipelineEngine::message_elements(const model::MicroBatch& batch) const {
  const int64_t elements = parallel_.sequence_rows(static_cast<int64_t>(batch.batch) * batch.seq) * hidden_size_;
  if (elements > max_elements_) {
    throw Error("pipeline", "a micro-batch of " + std::to_string(batch.batch) + " x " + std::to_string(batch.seq) +
                                " tokens exceeds the p2p buffers");
  }
  return elements;
}

bool PipelineEngine::post_receive(size_t index, bool wait_for_buffer) {
  const parallel::PipelineAction& action = (*actions_)[index];
  if (action.recv_from < 0 || receives_[index]) return true;
  auto receive = std::make_unique<PendingReceive>();
  const int64_t elements = message_elements(callbacks_->batch(action.micro_batch));
  const size_t chunk = static_cast<size_t>(action.chunk);
  if (action.pass == parallel::PipelinePass::forward) {
    std::vector<int>& free = free_slots_[static_cast<size_t>(slot_pool_of_chunk_[chunk])];
    if (free.empty()) {
      if (!wait_for_buffer) return false;
      throw Error("pipeline", "model chunk " + std::to_string(action.chunk) + " has no free activation slot for " +
                                  parallel::to_string(action));
    }
    receive->slot = free.back();
    free.pop_back();
    receive->buffer = stages_[chunk]->input_buffer(receive->slot);
  } else {
    receive->buffer = grad_buffers_[static_cast<size_t>(next_grad_buffer_)].data();
    next_grad_buffer_ = 1 - next_grad_buffer_;
  }
  receive->request = pipeline_.recv_async(receive->buffer, elements, DType::f32, action.recv_from,
                                          tag(action.pass, virtual_stage(action.chunk)));
  receives_[index] = std::move(receive);
  return true;
}

void PipelineEngine::send(const float* data, int64_t elements, int peer, int message_tag,
                          parallel::PipelinePass pass) {
  TimerScope timed(callbacks_->timers, send_timer(pass));
  OutgoingMessage* message = nullptr;
  for (auto& candidate : outgoing_) {
    if (!candidate->request || candidate->request->test()) {
      message = candidate.get();
      break;
    }
  }
  if (!message) {
    outgoing_.push_back(std::make_unique<OutgoingMessage>());
    message = outgoing_.back().get();
    message->buffer =
        backend::DeviceBuffer<float>(ops_, max_elements_, backend::MemoryCategory::comm_buffers, ledger_);
  }
  ops_.copy(message->buffer.data(), data, elements * static_cast<int64_t>(sizeof(float)),
            backend::CopyKind::device_to_device, ops_.default_stream());
  message->request = pipeline_.send_async(message->buffer.data(), elements, DType::f32, peer, message_tag);
  message->pass = pass;
}

backend::StreamTimer& PipelineEngine::pass_timer() {
  if (passes_timed_ == pass_timers_.size()) {
    pass_timers_.push_back(std::make_unique<backend::StreamTimer>(ops_, ops_.default_stream()));
  }
  return *pass_timers_[passes_timed_++];
}

double PipelineEngine::compute_seconds() const {
  double seconds = 0;
  for (size_t pass = 0; pass < passes_timed_; ++pass) seconds += pass_timers_[pass]->elapsed_seconds();
  return seconds;
}

void PipelineEngine::run(const std::vector<parallel::PipelineAction>& actions, const model::ForwardPass& pass,
                         const PipelineCallbacks& callbacks) {
  actions_ = &actions;
  callbacks_ = &callbacks;
  const size_t chunks = stages_.size();
  int micro_batches = 0;
  std::vector<size_t> last_backward(chunks, actions.size());
  for (size_t i = 0; i < actions.size(); ++i) {
    const parallel::PipelineAction& a = actions[i];
    if (a.chunk < 0 || static_cast<size_t>(a.chunk) >= chunks) {
      throw Error("pipeline", "action " + parallel::to_string(a) + " names a model chunk this rank does not hold");
    }
    if (!pass.training && a.pass == parallel::PipelinePass::backward) {
      throw Error("pipeline", "a forward-only run got " + parallel::to_string(a));
    }
    micro_batches = std::max(micro_batches, a.micro_batch + 1);
    if (a.pass == parallel::PipelinePass::backward) last_backward[static_cast<size_t>(a.chunk)] = i;
  }
  free_slots_.assign(chunks, {});
  slot_of_micro_.assign(chunks, std::vector<int>(static_cast<size_t>(micro_batches), -1));
  std::vector<bool> pool_filled(chunks, false);
  for (size_t c = 0; c < chunks; ++c) {
    const size_t pool = static_cast<size_t>(slot_pool_of_chunk_[c]);
    if (pool_filled[pool]) continue;
    pool_filled[pool] = true;
    for (int slot = stages_[c]->activation_slots() - 1; slot >= 0; --slot) free_slots_[pool].push_back(slot);
  }
  receives_.clear();
  receives_.resize(actions.size());
  next_grad_buffer_ = 0;

  passes_timed_ = 0;
  run_timer_->start();
  for (size_t i = 0; i < actions.size(); ++i) {
    const parallel::PipelineAction& a = actions[i];
    const size_t chunk = static_cast<size_t>(a.chunk);
    model::Stage& stage = *stages_[chunk];
    std::vector<int>& free_slots = free_slots_[static_cast<size_t>(slot_pool_of_chunk_[chunk])];
    post_receive(i, true);
    if (i + 1 < actions.size()) post_receive(i + 1, false);  // travels while this action computes
    PendingReceive* input = receives_[i].get();
    if (input) {
      TimerScope timed(callbacks.timers, recv_timer(a.pass));
      input->request->wait();
    }
    const model::MicroBatch batch = callbacks.batch(a.micro_batch);
    const int64_t elements = message_elements(batch);
    const int vstage = virtual_stage(a.chunk);
    if (a.pass == parallel::PipelinePass::forward) {
      int slot = input ? input->slot : -1;
      if (slot < 0) {
        if (free_slots.empty()) {
          throw Error("pipeline", "model chunk " + std::to_string(a.chunk) + " has no free activation slot for " +
                                      parallel::to_string(a));
        }
        slot = free_slots.back();
        free_slots.pop_back();
      }
      backend::StreamTimer& timer = pass_timer();
      timer.start();
      model::StageOutput output;
      {
        TimerScope timed(callbacks.timers, compute_timer(a.pass));
        output = stage.forward(slot, batch, input ? input->buffer : nullptr, pass);
      }
      timer.stop();
      if (a.send_to >= 0) send(output.activation, elements, a.send_to, tag(a.pass, vstage + 1), a.pass);
      if (pass.training) {
        slot_of_micro_[chunk][static_cast<size_t>(a.micro_batch)] = slot;
      } else {
        free_slots.push_back(slot);
      }
    } else {
      int& slot = slot_of_micro_[chunk][static_cast<size_t>(a.micro_batch)];
      if (slot < 0) throw Error("pipeline", parallel::to_string(a) + " before its forward");
      if (i == last_backward[chunk] && callbacks.before_last_backward) callbacks.before_last_backward(a.chunk);
      const float dloss_scale = callbacks.dloss_scale(a.micro_batch);
      backend::StreamTimer& timer = pass_timer();
      timer.start();
      const float* grad = nullptr;
      {
        TimerScope timed(callbacks.timers, compute_timer(a.pass));
        grad = stage.backward(slot, input ? input->buffer : nullptr, dloss_scale);
      }
      timer.stop();
      free_slots.push_back(slot);
      slot = -1;
      if (a.send_to >= 0) send(grad, elements, a.send_to, tag(a.pass, vstage - 1), a.pass);
    }
    receives_[i].reset();
  }
  for (auto& message : outgoing_) {
    if (message->request) {
      TimerScope timed(callbacks.timers, send_timer(message->pass));
      message->request->wait();
    }
    message->request.reset();
  }
  run_timer_->stop();
  actions_ = nullptr;
  callbacks_ = nullptr;
}

}  // namespace mt::train

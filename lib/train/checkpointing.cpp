// A trainer's checkpoints (see checkpointing.h).
#include "train/checkpointing.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/memory.h"
#include "backend/ops.h"
#include "comm/communicator.h"
#include "core/clock.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "io/value_checks.h"

namespace mt::train {
namespace {

constexpr const char* kLockName = "mt-train.lock";
constexpr const char* kFp8StatePrefix = "fp8/";

std::string this_host() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof buffer - 1) != 0 || buffer[0] == '\0') return "localhost";
  return buffer;
}

// The start of process `pid` in clock ticks since boot (/proc/PID/stat, field 22); -1 when unknown.
long long process_start(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = text.rfind(')');
  if (name_end == std::string::npos) return -1;
  std::istringstream fields(text.substr(name_end + 1));
  std::string field;
  for (int number = 3; number <= 22 && fields >> field; ++number) {
    if (number == 22) return std::atoll(field.c_str());
  }
  return -1;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

// Who holds a save directory's lock: its one line "host=H pid=P process_start=S started=T".
struct LockHolder {
  std::string host, started;
  long pid = 0;
  long long process_start = -1;
  std::string describe() const { return "host " + host + ", pid " + std::to_string(pid) + ", started " + started; }
};

std::optional<LockHolder> parse_lock(const std::string& text) {
  LockHolder holder;
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    const size_t equals = word.find('=');
    if (equals == std::string::npos) return std::nullopt;
    const std::string key = word.substr(0, equals), value = word.substr(equals + 1);
    if (key == "host") holder.host = value;
    if (key == "pid") holder.pid = std::atol(value.c_str());
    if (key == "process_start") holder.process_start = std::atoll(value.c_str());
    if (key == "started") holder.started = value;
  }
  if (holder.host.empty() || holder.pid <= 0) return std::nullopt;
  return holder;
}

// A holder of this host whose process is gone, or whose pid a later process has taken.
bool holder_is_gone(const LockHolder& holder) {
  if (holder.host != this_host()) return false;
  if (kill(static_cast<pid_t>(holder.pid), 0) != 0 && errno == ESRCH) return true;
  const long long start = process_start(holder.pid);
  return holder.process_start >= 0 && start >= 0 && start != holder.process_start;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Creates `path` holding `text` only if it does not exist (O_EXCL); false when it exists.
bool create_exclusive(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return false;
    throw Error(path, std::string("cannot create the save directory's lock: ") + std::strerror(errno));
  }
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  const int saved = errno;
  close(fd);
  if (!written) {
    unlink(path.c_str());
    throw Error(path, std::string("cannot write the save directory's lock: ") + std::strerror(saved));
  }
  return true;
}

// Model fields that do not change a checkpoint's tensors or what they compute.
// Model fields a loaded checkpoint may disagree with: names, sequence length, init, dropout, and the
// MoE loss weights and bias-update rate (training settings that shape no tensor, as a fine-tune
// from a Hugging Face import with another router_aux_loss_coef needs), and the MTP loss weight
// (DeepSeek-V3 lowers it from 0.3 to 0.1 during pre-training).
bool free_to_differ(const std::string& field) {
  return field == "name" || field == "seq_length" || field == "init_method_std" || field == "hidden_dropout" ||
         field == "attention_dropout" || field == "moe_aux_loss_coeff" || field == "moe_z_loss_coeff" ||
         field == "moe_router_bias_update_rate" || field == "mtp_loss_scaling_factor";
}

// The box of a parameter's shard inside its global tensor.
io::Box shard_box(const model::ParamEntry& entry) {
  io::Box box;
  box.offset.assign(entry.global_shape.size(), 0);
  box.extent = entry.local_shape;
  if (entry.shard_dim >= 0) box.offset[static_cast<size_t>(entry.shard_dim)] = entry.shard_offset;
  return box;
}

// The boxes of the elements [begin, end) of a parameter's shard (flat, row-major), in global
// coordinates.
std::vector<io::Box> shard_run_boxes(const model::ParamEntry& entry, int64_t begin, int64_t end) {
  std::vector<io::Box> boxes = io::flat_run_boxes(entry.local_shape, begin, end);
  if (entry.shard_dim >= 0) {
    for (io::Box& box : boxes) box.offset[static_cast<size_t>(entry.shard_dim)] += entry.shard_offset;
  }
  return boxes;
}

// The first NaN/Inf of `values` (box `box` of a tensor of `global_shape`), named with its
// row-major index in the whole tensor, as every layout sees it; "" when all are finite.
std::string nonfinite_in_box(const std::string& name, const std::vector<int64_t>& global_shape, const io::Box& box,
                             const float* values) {
  const int64_t local = io::first_nonfinite(values, box.elements());
  if (local < 0) return "";
  std::vector<int64_t> coordinate(box.extent.size());
  int64_t rest = local;
  for (size_t d = box.extent.size(); d-- > 0;) {
    coordinate[d] = rest % box.extent[d];
    rest /= box.extent[d];
  }
  int64_t element = 0;
  for (size_t d = 0; d < coordinate.size(); ++d) element = element * global_shape[d] + box.offset[d] + coordinate[d];
  return io::nonfinite_text(name, values[local], element);
}

// Tensors on their way between the trainer's device memory and HDF5, which sees host memory
// only: one host buffer, reused tensor by tensor (grown to the largest), so a checkpoint never
// holds a second copy of the model on the host.
class HostStaging {
 public:
  explicit HostStaging(const backend::Ops& ops) : ops_(ops) {}

  // The slices (device memory) copied into the buffer (device_to_host, then one synchronize),
  // as slices of the buffer; valid until the next call.
  std::vector<io::TensorSlice> to_host(const std::vector<io::TensorSlice>& device_slices) {
    int64_t elements = 0;
    for (const io::TensorSlice& slice : device_slices) elements += slice.box.elements();
    float* host = reserve(elements);
    std::vector<io::TensorSlice> host_slices;
    for (const io::TensorSlice& slice : device_slices) {
      ops_.copy(host, slice.data, slice.box.elements() * static_cast<int64_t>(sizeof(float)),
                backend::CopyKind::device_to_host, ops_.default_stream());
      host_slices.push_back(io::TensorSlice{slice.box, host});
      host += slice.box.elements();
    }
    ops_.synchronize(ops_.default_stream());
    return host_slices;
  }

  // `box` of tensor `name` read into the buffer, then copied to `device` (host_to_device; the
  // synchronize lets the next read reuse the buffer). The first NaN/Inf read is kept (problem()).
  void read_to_device(const io::CheckpointReader& checkpoint, const std::string& name,
                      const std::vector<int64_t>& global_shape, const io::Box& box, float* device) {
    float* host = reserve(box.elements());
    checkpoint.read_box(name, global_shape, box, host);
    if (problem_.empty()) problem_ = nonfinite_in_box(name, global_shape, box, host);
    ops_.copy(device, host, box.elements() * static_cast<int64_t>(sizeof(float)), backend::CopyKind::host_to_device,
              ops_.default_stream());
    ops_.synchronize(ops_.default_stream());
  }

  // The first tensor read that held a NaN/Inf, named ("" when none did).
  const std::string& problem() const { return problem_; }

 private:
  float* reserve(int64_t elements) {
    if (static_cast<int64_t>(buffer_.size()) < elements) buffer_.resize(static_cast<size_t>(elements));
    return buffer_.data();
  }
  const backend::Ops& ops_;
  std::vector<float> buffer_;
  std::string problem_;
};

// One tensor of the checkpoint and the slices of it this rank writes (device memory): none when
// another rank writes its copy.
struct TensorShare {
  std::string name;
  std::vector<int64_t> global_shape;
  std::vector<io::TensorSlice> slices;
};

// With --moe-router-enable-expert-bias, every MoE layer's bias (E), in layer order on every rank:
// written whole by the one rank of its pipeline stage that Trainer::writes_expert_biases names.
void add_expert_bias_shares(Trainer& trainer, std::vector<TensorShare>& shares) {
  const model::ModelConfig& model = trainer.model_config();
  if (model.num_experts == 0 || !model.moe_router_enable_expert_bias) return;
  const std::vector<Trainer::ExpertBias> biases = trainer.expert_biases();
  const bool writes = trainer.writes_expert_biases();
  for (int layer = 0; layer < model.num_layers + model.mtp_num_layers; ++layer) {  // MTP depths: L + k
    if (!model.is_moe_layer(layer)) continue;
    TensorShare share{expert_bias_tensor_name(layer), {model.num_experts}, {}};
    for (const Trainer::ExpertBias& bias : biases) {
      if (bias.layer == layer && writes) share.slices.push_back(io::TensorSlice{io::Box{{0}, {model.num_experts}}, bias.data});
    }
    shares.push_back(std::move(share));
  }
}

// ---- FP8 scaling state (issue 23): TE's extra_state of each FP8 linear ----

// The FP8 linears of the whole model, in its layout order (every rank lists them all), each with
// whether it is a MoE expert's.
std::vector<std::pair<std::string, bool>> fp8_weight_names(const model::ParamLayout& whole_model,
                                                           const model::Fp8Config& fp8, int num_layers) {
  std::vector<std::pair<std::string, bool>> names;
  for (const model::ParamEntry& entry : whole_model.entries) {
    if (!model::is_fp8_weight(fp8, entry, num_layers)) continue;
    names.emplace_back(entry.name, entry.data_parallel_group == model::DataParallelGroup::expert);
  }
  return names;
}

// This rank's FP8 linears by weight name.
std::unordered_map<std::string, int64_t> fp8_linears_by_name(const model::Fp8Scaling& fp8) {
  std::unordered_map<std::string, int64_t> linears;
  for (int64_t linear = 0; linear < fp8.linears(); ++linear) linears.emplace(fp8.weight_name(linear), linear);
  return linears;
}

io::Box piece_box(const model::Fp8Scaling::StatePiece& piece) {
  return io::Box{{piece.row, piece.column}, {piece.rows, piece.columns}};
}

// With --fp8-format, fp8/<weight> (3, 2 + history) for every FP8 linear of the model. The state is
// the same on every rank of a stage after each amax reduction over TP x DP x CP (per micro-batch), and a
// linear's scales cover its whole weight (the amaxes are maxima over the shards), so it does not
// depend on the layout: the stage's rank with TP, DP and CP coordinates 0 writes it. A MoE
// expert's linear is held by the ranks of one EP coordinate (its state is that of every expert
// sharing its local index, merged by the reduction): the one with expert-TP and expert-DP
// coordinates 0 writes it.
void add_fp8_shares(Trainer& trainer, const model::ParamLayout& whole_model, std::vector<TensorShare>& shares) {
  model::Fp8Scaling* fp8 = trainer.fp8_scaling();
  if (!fp8) return;
  const std::unordered_map<std::string, int64_t> local = fp8_linears_by_name(*fp8);
  for (const auto& [name, expert] :
       fp8_weight_names(whole_model, fp8->config(), trainer.model_config().num_layers)) {
    TensorShare share{fp8_state_tensor_name(name), {3, fp8->state_columns()}, {}};
    const auto found = local.find(name);
    const bool writes = expert ? trainer.writes_expert_fp8_state() : trainer.writes_expert_biases();
    if (found != local.end() && writes) {
      for (const model::Fp8Scaling::StatePiece& piece : fp8->state_pieces(found->second)) {
        share.slices.push_back(io::TensorSlice{piece_box(piece), piece.data});
      }
    }
    shares.push_back(std::move(share));
  }
}

// Every tensor of the checkpoint, in the same order on every rank (the whole model's layout
// order, whichever pipeline stage holds it), with this rank's slices: the runs of parameters and
// moments the optimizer says this rank writes (optim::DistributedOptimizer::checkpoint_runs:
// each tensor's primary copy once over its reduction group, whole or in slices), as boxes of the
// global tensor.
std::vector<TensorShare> shares_to_write(Trainer& trainer, const SaveOptions& options) {
  const model::ParamLayout& layout = trainer.layout();
  const model::ParamLayout whole_model = model::build_layout(trainer.model_config());
  const int groups = options.optimizer ? 3 : 1;
  const size_t tensors = whole_model.entries.size();
  const char* prefixes[] = {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"};
  std::vector<TensorShare> shares;
  std::unordered_map<std::string, size_t> index;  // a parameter's name -> its place in the whole model
  for (int g = 0; g < groups; ++g) {
    for (const model::ParamEntry& entry : whole_model.entries) {
      if (g == 0) index.emplace(entry.name, shares.size());
      shares.push_back(TensorShare{prefixes[g] + entry.name, entry.global_shape, {}});
    }
  }
  auto share_of = [&](int group, const model::ParamEntry& entry) -> std::vector<io::TensorSlice>& {
    return shares[static_cast<size_t>(group) * tensors + index.at(entry.name)].slices;
  };
  add_expert_bias_shares(trainer, shares);
  add_fp8_shares(trainer, whole_model, shares);
  const float* params = trainer.parameters();
  optim::DistributedOptimizer& optimizer = trainer.optimizer();
  const float* moments[] = {optimizer.exp_avg(), optimizer.exp_avg_sq()};
  // A tensor's slices may come from several runs.
  for (const optim::TensorRun& run : optimizer.checkpoint_runs()) {
    const model::ParamEntry& entry = layout.entries[run.entry];
    int64_t state = run.state, flat = run.flat;
    for (const io::Box& box : shard_run_boxes(entry, run.begin, run.end)) {
      share_of(0, entry).push_back(io::TensorSlice{box, params + flat});
      if (options.optimizer) {
        for (int m = 0; m < 2; ++m) share_of(1 + m, entry).push_back(io::TensorSlice{box, moments[m] + state});
      }
      state += box.elements();
      flat += box.elements();
    }
  }
  return shares;
}

nlohmann::json origin_to_json(const CountersOrigin& origin) {
  return nlohmann::json{{"iteration", origin.iteration},
                        {"consumed_train_samples", origin.consumed_samples},
                        {"optimizer_step", origin.optimizer_step},
                        {"skipped_or_nan_iterations", origin.skipped_or_nan_iters}};
}

io::CheckpointState state_to_save(Trainer& trainer, const SaveOptions& options) {
  const TrainerState state = trainer.checkpoint_state();
  io::CheckpointState s;
  s.iteration = state.iteration;
  s.consumed_train_samples = state.consumed_samples;
  s.consumed_valid_samples = state.consumed_valid_samples;
  s.skipped_iters = state.skipped_iters;
  s.nan_iters = state.nan_iters;
  s.loss_scale = state.loss_scaler.scale;
  s.loss_scale_growth_tracker = state.loss_scaler.growth_tracker;
  s.loss_scale_hysteresis_tracker = state.loss_scaler.hysteresis_tracker;
  s.seed = trainer.config().seed;
  s.has_optimizer = options.optimizer;
  s.optimizer_step = trainer.optimizer().steps();
  s.resumable = options.resumable;
  s.model_config = model::to_json(trainer.model_config()).dump();
  s.parallel_config = options.parallel_config;
  s.train_config = to_json(trainer.config()).dump();
  s.counters_origin = origin_to_json(state.counters_origin).dump();
  return s;
}

// Whether every slice this rank would write is finite: all_finite over each slice on the device
// and one flag read back, so a save copies no tensor more than it did.
bool shares_finite(Trainer& trainer, const std::vector<TensorShare>& shares) {
  const backend::Ops& ops = trainer.ops();
  const backend::Stream stream = ops.default_stream();
  backend::DeviceBuffer<int32_t> flag(ops, 1, backend::MemoryCategory::activations);
  int32_t finite = 1;
  ops.copy(flag.data(), &finite, sizeof(finite), backend::CopyKind::host_to_device, stream);
  for (const TensorShare& share : shares) {
    for (const io::TensorSlice& slice : share.slices) ops.all_finite(slice.data, slice.box.elements(), flag.data(), stream);
  }
  ops.copy(&finite, flag.data(), sizeof(finite), backend::CopyKind::device_to_host, stream);
  ops.synchronize(stream);
  return finite != 0;
}

// The first NaN/Inf of this rank's slices, named (the slices copied to the host one tensor at a
// time: only after shares_finite found one).
std::string first_nonfinite_share(Trainer& trainer, const std::vector<TensorShare>& shares) {
  HostStaging staging(trainer.ops());
  for (const TensorShare& share : shares) {
    for (const io::TensorSlice& slice : staging.to_host(share.slices)) {
      std::string problem = nonfinite_in_box(share.name, share.global_shape, slice.box, slice.data);
      if (!problem.empty()) return problem;
    }
  }
  return "";
}

// A checkpoint is never written from a non-finite state: every rank checks its slices (params,
// moments) before anything is created, and the lowest rank that found a NaN/Inf names it to all,
// so every rank throws the same error and the tracker keeps naming the last good checkpoint.
void check_finite_before_save(Trainer& trainer, const std::vector<TensorShare>& shares) {
  comm::Communicator& world = trainer.world();
  std::string problem = shares_finite(trainer, shares) ? "" : first_nonfinite_share(trainer, shares);
  int64_t first = problem.empty() ? world.size() : world.rank();
  world.all_reduce(&first, 1, DType::i64, comm::ReduceOp::min);
  if (first == world.size()) return;
  comm::broadcast_text(world, problem, static_cast<int>(first));
  throw Error("checkpoint of iteration " + std::to_string(trainer.iteration()),
              "not written: " + problem + " (a diverged state; the tracker keeps the last checkpoint)");
}

// Every rank of the world writes its slices into one file through parallel HDF5
// (io::CheckpointWriter with the world as its group; it checks that the slices of all ranks cover
// each tensor exactly once). Rank 0 prepares the directory and, after the commit, the tracker
// (after_commit); their outcome is broadcast, so every rank returns or throws the same error.
SaveResult parallel_save(Trainer& trainer, const SaveOptions& options, const std::function<std::string()>& prepare,
                         const std::function<void()>& after_commit) {
  const auto start = std::chrono::steady_clock::now();
  comm::Communicator& world = trainer.world();
  const std::vector<TensorShare> shares = shares_to_write(trainer, options);
  check_finite_before_save(trainer, shares);
  SaveResult result;
  // Rank 0's outcome (an error, or the path) to every rank; throws the error on every rank.
  auto share_outcome = [&](std::string& failure) {
    comm::broadcast_text(world, failure, 0);
    if (!failure.empty()) throw Error(failure, "");
    comm::broadcast_text(world, result.path, 0);
  };
  std::string failure;
  if (world.rank() == 0) {
    try {
      result.path = prepare();
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  share_outcome(failure);
  {
    io::CheckpointWriter writer(result.path, &world);
    HostStaging staging(trainer.ops());
    for (const TensorShare& share : shares) {
      writer.write_tensor(share.name, share.global_shape, staging.to_host(share.slices));
    }
    result.bytes = writer.commit(state_to_save(trainer, options));
  }
  if (world.rank() == 0) {
    try {
      after_commit();
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  share_outcome(failure);
  int64_t mine = 0;
  for (const TensorShare& share : shares) {
    for (const io::TensorSlice& slice : share.slices) mine += slice.box.elements() * static_cast<int64_t>(sizeof(float));
  }
  int64_t writers = mine > 0 ? 1 : 0;
  world.all_reduce(&writers, 1, DType::i64, comm::ReduceOp::sum);
  world.all_reduce(&mine, 1, DType::i64, comm::ReduceOp::max);
  result.writers = static_cast<int>(writers);
  result.largest_share_bytes = mine;
  result.seconds = seconds_since(start);
  return result;
}

// A NaN/Inf read from a checkpoint is a damaged (or diverged) checkpoint, named as such before
// any step, on every rank (the lowest rank that read one names it).
void refuse_nonfinite_load(Trainer& trainer, const io::CheckpointReader& checkpoint, std::string problem) {
  comm::Communicator& world = trainer.world();
  int64_t first = problem.empty() ? world.size() : world.rank();
  world.all_reduce(&first, 1, DType::i64, comm::ReduceOp::min);
  if (first == world.size()) return;
  comm::broadcast_text(world, problem, static_cast<int>(first));
  throw Error(checkpoint.path(), problem + ": the checkpoint is damaged or was saved from a diverged run (mt-ckpt "
                                           "verify scans it); load an earlier one");
}

void check_same_model(const io::CheckpointReader& checkpoint, const model::ModelConfig& model) {
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(checkpoint.state().model_config);
  } catch (const nlohmann::json::exception&) {
    throw Error(checkpoint.path(), "attribute model_config is not JSON");
  }
  const nlohmann::json run = model::to_json(model);
  // A checkpoint written before mt knew a field holds what that field's default means: such a
  // checkpoint loads when this run keeps the default, and is named otherwise.
  const nlohmann::json defaults = model::to_json(model::ModelConfig{});
  for (const auto& [field, value] : run.items()) {
    if (free_to_differ(field)) continue;
    if (!saved.contains(field)) {
      if (defaults.contains(field) && defaults[field] == value) continue;
      throw Error(checkpoint.path(), "model_config has no field " + field + " (written before mt knew it, which means " +
                                         (defaults.contains(field) ? defaults[field].dump() : "nothing") + "), " +
                                         value.dump() + " in this run");
    }
    if (saved[field] != value) {
      throw Error(checkpoint.path(), "written for another model: " + field + " is " + saved[field].dump() +
                                         " there, " + value.dump() + " in this run");
    }
  }
}

std::string saved_precision(const io::CheckpointReader& checkpoint) {
  try {
    const nlohmann::json train = nlohmann::json::parse(checkpoint.state().train_config);
    return train.value("precision", "");
  } catch (const nlohmann::json::exception&) {
    throw Error(checkpoint.path(), "attribute train_config is not JSON");
  }
}

// Every stored checksum against the values, before any step (issue 28 W2). The ranks share the
// extra read: rank r checks tensors r, r + world, ... (one more read of the file in all, spread
// over the ranks), and the lowest rank that found a damaged tensor names it to every rank (a NaN
// is named as such first, by refuse_nonfinite_load).
void verify_before_load(const io::CheckpointReader& checkpoint, comm::Communicator& world) {
  std::string problem;
  const std::vector<io::TensorInfo> tensors = checkpoint.tensors();
  for (size_t i = static_cast<size_t>(world.rank()); i < tensors.size() && problem.empty();
       i += static_cast<size_t>(world.size())) {
    if (!tensors[i].checksum) continue;
    try {
      checkpoint.check_checksum(tensors[i], checkpoint.scan(tensors[i]).checksum);
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  int64_t first = problem.empty() ? world.size() : world.rank();
  world.all_reduce(&first, 1, DType::i64, comm::ReduceOp::min);
  if (first == world.size()) return;
  comm::broadcast_text(world, problem, static_cast<int>(first));
  throw Error(problem, "");
}

// What TE's set_extra_state and Megatron do: a linear whose state the checkpoint holds takes it
// (scales, scale_invs, amax history); one it lacks (a checkpoint of a run without FP8, or where
// the layer was in bf16) keeps its fresh state, as TE keeps it for an empty extra_state; a run
// without --fp8-format ignores the checkpoint's FP8 state (TE loads it into modules that do not
// use it, and their next save drops it). A different --fp8-amax-history-len is refused.
void load_fp8_state(const io::CheckpointReader& checkpoint, Trainer& trainer, HostStaging& staging) {
  std::unordered_map<std::string, std::vector<int64_t>> saved;  // fp8/<weight> -> shape
  for (const io::TensorInfo& tensor : checkpoint.tensors()) {
    if (tensor.name.rfind(kFp8StatePrefix, 0) == 0) saved.emplace(tensor.name, tensor.shape);
  }
  model::Fp8Scaling* fp8 = trainer.fp8_scaling();
  const bool rank0 = trainer.world().rank() == 0;
  if (!fp8) {
    if (!saved.empty() && rank0) {
      log::info("mt-train: " + checkpoint.path() +
                " holds FP8 scaling state; this run has no --fp8-format and ignores it");
    }
    return;
  }
  int64_t missing = 0;
  for (int64_t linear = 0; linear < fp8->linears(); ++linear) {
    const std::string name = fp8_state_tensor_name(fp8->weight_name(linear));
    const auto found = saved.find(name);
    if (found == saved.end()) {
      ++missing;
      continue;
    }
    const std::vector<int64_t> shape = {3, fp8->state_columns()};
    if (found->second.size() != 2 || found->second[0] != 3 || found->second[1] < 3) {
      throw Error(checkpoint.path(), name + " is not an FP8 state (3, 2 + amax history length)");
    }
    if (found->second != shape) {
      throw Error(checkpoint.path(), name + " holds an amax history of " + std::to_string(found->second[1] - 2) +
                                         " steps, this run's --fp8-amax-history-len is " +
                                         std::to_string(fp8->config().amax_history_len) + ": give the checkpoint's");
    }
    for (const model::Fp8Scaling::StatePiece& piece : fp8->state_pieces(linear)) {
      staging.read_to_device(checkpoint, name, shape, piece_box(piece), piece.data);
    }
  }
  trainer.world().all_reduce(&missing, 1, DType::i64, comm::ReduceOp::max);
  if (missing > 0 && rank0) {
    log::info("mt-train: " + checkpoint.path() + " holds no FP8 scaling state for some FP8 linears of this run (" +
              std::to_string(missing) + " on one rank): they start from scale 1 and an empty amax history");
  }
}

// ---- the LR schedule on resume (Megatron's OptimizerParamScheduler._check_and_set) ----

// The run's config as the checkpoint saved it.
TrainConfig saved_train_config(const io::CheckpointReader& checkpoint) {
  try {
    return train_config_from_json(nlohmann::json::parse(checkpoint.state().train_config));
  } catch (const nlohmann::json::exception&) {
    throw Error(checkpoint.path(), "attribute train_config is not JSON");
  } catch (const Error& e) {
    throw Error(checkpoint.path(), std::string("attribute train_config: ") + e.what());
  }
}

const char* decay_style_name(optim::LrDecayStyle style) {
  switch (style) {
    case optim::LrDecayStyle::constant: return "constant";
    case optim::LrDecayStyle::linear: return "linear";
    case optim::LrDecayStyle::cosine: return "cosine";
  }
  return "?";
}

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.10g", value);
  return text;
}

// One field of the scheduler whose run and checkpoint values differ.
struct SchedulerDifference {
  std::string field;  // Megatron's name, with mt's flags
  std::string run, saved;
};

std::vector<SchedulerDifference> scheduler_differences(const TrainConfig& run, const TrainConfig& saved) {
  const optim::LrSchedule a = lr_schedule_of(run), b = lr_schedule_of(saved);
  std::vector<SchedulerDifference> out;
  auto compare = [&](const char* field, const std::string& mine, const std::string& theirs) {
    if (mine != theirs) out.push_back({field, mine, theirs});
  };
  auto samples = [](int64_t count) { return std::to_string(count) + " samples"; };
  compare("learning rate (--lr)", number_text(a.max_lr), number_text(b.max_lr));
  compare("minimum learning rate (--min-lr)", number_text(a.min_lr), number_text(b.min_lr));
  compare("warmup iterations (--lr-warmup-*)", samples(a.warmup_samples), samples(b.warmup_samples));
  compare("total number of iterations (--lr-decay-iters/--lr-decay-samples, else --train-iters x --global-batch-size)",
          samples(a.decay_samples), samples(b.decay_samples));
  compare("learning rate decay style (--lr-decay-style)", decay_style_name(a.style),
          decay_style_name(b.style));
  compare("weight decay (--weight-decay)", number_text(run.adam.weight_decay), number_text(saved.adam.weight_decay));
  return out;
}

std::string describe(const std::vector<SchedulerDifference>& differences) {
  std::string text;
  for (const SchedulerDifference& d : differences) {
    text += (text.empty() ? "" : "; ") + d.field + " is " + d.run + " in this run, " + d.saved + " in the checkpoint";
  }
  return text;
}

// Megatron's load_state_dict of the scheduler: a different schedule is refused unless the user
// says which one wins (see SchedulerOnLoad). Before any tensor is read.
void resume_scheduler(const io::CheckpointReader& checkpoint, Trainer& trainer, SchedulerOnLoad on_load) {
  const TrainConfig saved = saved_train_config(checkpoint);
  const std::vector<SchedulerDifference> differences = scheduler_differences(trainer.config(), saved);
  if (differences.empty()) return;
  const bool rank0 = trainer.world().rank() == 0;
  if (on_load == SchedulerOnLoad::check) {
    throw Error(checkpoint.path(), "the LR schedule differs from the checkpoint's: " + describe(differences) +
                                       "; resume with the checkpoint's values, or give "
                                       "--override-opt_param-scheduler (this run's values) or "
                                       "--use-checkpoint-opt_param-scheduler (the checkpoint's)");
  }
  if (on_load == SchedulerOnLoad::override_with_run) {
    if (rank0) log::info("mt-train: --override-opt_param-scheduler: this run's values, not the checkpoint's: " + describe(differences));
    return;
  }
  if (saved.adam.weight_decay != trainer.config().adam.weight_decay) {
    throw Error(checkpoint.path(), "--use-checkpoint-opt_param-scheduler: the checkpoint's weight decay is " +
                                       number_text(saved.adam.weight_decay) + ", this run's " +
                                       number_text(trainer.config().adam.weight_decay) +
                                       " (--weight-decay): give --weight-decay " + number_text(saved.adam.weight_decay));
  }
  if (rank0) log::info("mt-train: --use-checkpoint-opt_param-scheduler: the checkpoint's values, not this run's: " + describe(differences));
  trainer.adopt_lr_schedule(lr_schedule_of(saved));
}

// ---- the counters, cross-checked on load (issue 28 W10) ----

// The checkpoint's counters_origin; std::nullopt for a file that predates it.
std::optional<CountersOrigin> saved_origin(const io::CheckpointReader& checkpoint) {
  const std::string& text = checkpoint.state().counters_origin;
  if (text.empty()) return std::nullopt;
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    return CountersOrigin{json.at("iteration").get<int64_t>(), json.at("consumed_train_samples").get<int64_t>(),
                          json.at("optimizer_step").get<int64_t>(), json.at("skipped_or_nan_iterations").get<int64_t>()};
  } catch (const nlohmann::json::exception&) {
    throw Error(checkpoint.path(), "attribute counters_origin is not the JSON mt writes: " + text);
  }
}

[[noreturn]] void refuse_counter(const io::CheckpointReader& checkpoint, const std::string& field, int64_t value,
                                 const std::string& expected) {
  throw Error(checkpoint.path(), "attribute " + field + " is " + std::to_string(value) + ", but " + expected +
                                     ": the file was changed or damaged; load another checkpoint");
}

// A file in DIR/iter_NNNNNNN holds iteration NNNNNNN, which DIR's tracker named to find it.
void check_iteration_directory(const io::CheckpointReader& checkpoint) {
  const std::filesystem::path path(checkpoint.path());
  const std::string directory = path.parent_path().filename().string();
  long long named = -1;
  char rest = 0;
  if (directory.size() != 12 || std::sscanf(directory.c_str(), "iter_%7lld%c", &named, &rest) != 1) return;
  const int64_t iteration = checkpoint.state().iteration;
  if (iteration == named) return;
  const std::string save = path.parent_path().parent_path().string();
  std::optional<int64_t> tracker;
  try {
    tracker = io::read_tracker(save.empty() ? "." : save);
  } catch (const Error&) {
  }
  refuse_counter(checkpoint, "iteration", iteration,
                 "its directory " + directory + " is iteration " + std::to_string(named) +
                     (tracker ? " (and the tracker " + io::tracker_path(save.empty() ? "." : save) + " names " +
                                    std::to_string(*tracker) + ")"
                              : std::string()));
}

// `count` x `each` + `base`, or std::nullopt past 64 bits.
std::optional<int64_t> counted(int64_t base, int64_t count, int64_t each) {
  int64_t product = 0, sum = 0;
  if (__builtin_mul_overflow(count, each, &product) || __builtin_add_overflow(base, product, &sum)) return std::nullopt;
  return sum;
}

// The counters against each other and the run's rules: no more skipped iterations than
// iterations; from the counters' origin on, --global-batch-size samples per iteration (mt has no
// batch-size ramp-up; a resume at another batch size moves the origin) and one Adam step per
// iteration not skipped. A file without an origin (written before it) gets the bounds that hold
// whatever its history: at least one sample per iteration, at most one Adam step per iteration
// not skipped.
void check_counters(const io::CheckpointReader& checkpoint) {
  const io::CheckpointState& s = checkpoint.state();
  check_iteration_directory(checkpoint);
  for (const auto& [field, value] : {std::pair{"iteration", s.iteration}, std::pair{"skipped_iterations", s.skipped_iters},
                                     std::pair{"nan_iterations", s.nan_iters},
                                     std::pair{"consumed_train_samples", s.consumed_train_samples},
                                     std::pair{"optimizer_step", s.optimizer_step}}) {
    if (value < 0) refuse_counter(checkpoint, field, value, "a count is never negative");
  }
  const int64_t skipped = s.skipped_iters + s.nan_iters;
  if (s.skipped_iters > s.iteration || s.nan_iters > s.iteration - s.skipped_iters) {
    refuse_counter(checkpoint, "skipped_iterations + nan_iterations", skipped,
                   "iteration is " + std::to_string(s.iteration) + " (no more iterations are skipped than run)");
  }
  const int64_t batch = saved_train_config(checkpoint).global_batch_size;
  const std::optional<CountersOrigin> origin = saved_origin(checkpoint);
  if (!origin) {
    if (s.consumed_train_samples < s.iteration) {
      refuse_counter(checkpoint, "consumed_train_samples", s.consumed_train_samples,
                     "iteration " + std::to_string(s.iteration) + " consumed at least one sample each");
    }
    if (s.has_optimizer && s.optimizer_step > s.iteration - skipped) {
      refuse_counter(checkpoint, "optimizer_step", s.optimizer_step,
                     "iteration " + std::to_string(s.iteration) + " with " + std::to_string(skipped) +
                         " skipped allows at most " + std::to_string(s.iteration - skipped) + " Adam steps");
    }
    return;
  }
  const CountersOrigin& o = *origin;
  const int64_t since = s.iteration - o.iteration;
  if (o.iteration < 0 || since < 0 || o.consumed_samples < o.iteration || o.optimizer_step < 0 ||
      o.skipped_or_nan_iters < 0 || o.skipped_or_nan_iters > skipped) {
    throw Error(checkpoint.path(), "attribute counters_origin " + s.counters_origin + " does not fit iteration " +
                                       std::to_string(s.iteration) + " and " + std::to_string(skipped) +
                                       " skipped: the file was changed or damaged; load another checkpoint");
  }
  const std::string from = o.iteration == 0 ? std::string()
                                            : " after the origin at iteration " + std::to_string(o.iteration) + " (" +
                                                  std::to_string(o.consumed_samples) + " samples)";
  const std::optional<int64_t> samples = counted(o.consumed_samples, since, batch);
  if (!samples || *samples != s.consumed_train_samples) {
    refuse_counter(checkpoint, "consumed_train_samples", s.consumed_train_samples,
                   std::to_string(since) + " iterations at global batch " + std::to_string(batch) + from + " give " +
                       (samples ? std::to_string(*samples) : std::string("more than 64 bits hold")));
  }
  const int64_t steps = o.optimizer_step + since - (skipped - o.skipped_or_nan_iters);
  if (s.has_optimizer && s.optimizer_step != steps) {
    refuse_counter(checkpoint, "optimizer_step", s.optimizer_step,
                   "iteration " + std::to_string(s.iteration) + " with " + std::to_string(skipped) + " skipped gives " +
                       std::to_string(steps) + " Adam steps" +
                       (o.iteration == 0 ? std::string()
                                         : " (from the origin's " + std::to_string(o.optimizer_step) + " at iteration " +
                                               std::to_string(o.iteration) + ")"));
  }
}

// The origin the resumed run carries on: the checkpoint's while the rules continue, the loaded
// counters where they change (another global batch; Adam started afresh by --no-load-optim) or
// the file has none.
CountersOrigin resumed_origin(const io::CheckpointReader& checkpoint, const Trainer& trainer, bool optimizer_state) {
  const io::CheckpointState& s = checkpoint.state();
  const std::optional<CountersOrigin> origin = saved_origin(checkpoint);
  const bool same_batch = saved_train_config(checkpoint).global_batch_size == trainer.config().global_batch_size;
  if (origin && same_batch && optimizer_state) return *origin;
  return CountersOrigin{s.iteration, s.consumed_train_samples, optimizer_state ? s.optimizer_step : 0,
                        s.skipped_iters + s.nan_iters};
}

}  // namespace

std::string fp8_state_tensor_name(const std::string& weight) { return kFp8StatePrefix + weight; }

bool is_fp8_state_tensor(const model::ModelConfig& model, const io::TensorInfo& tensor) {
  if (tensor.name.rfind(kFp8StatePrefix, 0) != 0) return false;
  if (tensor.shape.size() != 2 || tensor.shape[0] != 3 || tensor.shape[1] < 3) return false;
  for (const model::ParamEntry& entry : model::build_layout(model).entries) {
    const bool fp8_linear = model::is_fp8_weight(model::Fp8Config{}, entry, model.num_layers);
    if (fp8_linear && tensor.name == fp8_state_tensor_name(entry.name)) return true;
  }
  return false;
}

std::string expert_bias_tensor_name(int layer) { return "model/" + model::layer_prefix(layer) + "mlp.router.expert_bias"; }

std::vector<std::pair<std::string, std::vector<int64_t>>> checkpoint_buffers(const model::ModelConfig& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> buffers;
  if (model.num_experts == 0 || !model.moe_router_enable_expert_bias) return buffers;
  for (int layer = 0; layer < model.num_layers + model.mtp_num_layers; ++layer) {  // MTP depths: L + k
    if (model.is_moe_layer(layer)) buffers.emplace_back(expert_bias_tensor_name(layer), std::vector<int64_t>{model.num_experts});
  }
  return buffers;
}

std::string save_lock_path(const std::string& directory) { return (std::filesystem::path(directory) / kLockName).string(); }

SaveDirectoryLock::SaveDirectoryLock(std::string directory) : path_(save_lock_path(directory)) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) throw Error(directory, "cannot create the save directory: " + error.message());
  const long pid = static_cast<long>(getpid());
  identity_ = "host=" + this_host() + " pid=" + std::to_string(pid) + " process_start=" +
              std::to_string(process_start(pid)) + " started=" + utc_now() + "\n";
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (create_exclusive(path_, identity_)) return;
    const std::optional<LockHolder> holder = parse_lock(read_text(path_));
    if (!holder) {
      throw Error(directory, "holds a lock file mt cannot read (" + path_ +
                                 "); a save directory holds one run: remove the lock if no run writes there");
    }
    if (!holder_is_gone(*holder)) {
      throw Error(directory, "is in use by another run (" + holder->describe() + "; lock " + path_ +
                                 "); a save directory holds one run: wait for it, save elsewhere, or remove the "
                                 "lock if that run is gone");
    }
    log::warn("mt-train: " + path_ + ": taking over the stale lock of " + holder->describe() + " (that process is gone)");
    unlink(path_.c_str());
  }
  throw Error(path_, "another run took the save directory's lock at the same moment");
}

SaveDirectoryLock::~SaveDirectoryLock() {
  if (read_text(path_) == identity_) unlink(path_.c_str());
}

void check_tracker_moves_forward(const std::string& directory, int64_t iteration) {
  const std::optional<int64_t> latest = io::read_tracker(directory);
  if (latest && *latest > iteration) {
    throw Error(directory, "its tracker names iteration " + std::to_string(*latest) + ", later than this save's " +
                               std::to_string(iteration) +
                               "; a tracker never moves backwards (save this run into another directory)");
  }
}

bool earlier_parameters_of_run(const std::string& path, const model::ModelConfig& model, uint64_t seed) {
  try {
    const io::CheckpointReader existing(path);
    check_same_model(existing, model);
    return !existing.state().resumable && existing.state().seed == seed;
  } catch (const Error&) {
    return false;
  }
}

SaveResult save_checkpoint_file(const std::string& path, Trainer& trainer, const SaveOptions& options) {
  return parallel_save(trainer, options, [&] { return path; }, [] {});
}

SaveResult save_checkpoint(const std::string& directory, Trainer& trainer, const SaveOptions& options) {
  const int64_t iteration = trainer.iteration();
  return parallel_save(
      trainer, options,
      [&] {
        check_tracker_moves_forward(directory, iteration);
        return io::prepare_checkpoint_directory(directory, iteration);
      },
      [&] { io::write_tracker(directory, iteration); });
}

void load_checkpoint(const io::CheckpointReader& checkpoint, Trainer& trainer, const LoadOptions& options) {
  const io::CheckpointState& saved = checkpoint.state();
  check_same_model(checkpoint, trainer.model_config());
  const bool optimizer_state = options.optimizer && !options.finetune;
  // A parameters-only file first: --finetune is the one way to load it (issue 28 U10: the message
  // named --no-load-optim, which then led to this one).
  if (!options.finetune && !saved.resumable) {
    throw Error(checkpoint.path(), "holds parameters only, not a run to resume (written by --save-init/--save-final, "
                                   "mt-ckpt convert or import); load it with --finetune");
  }
  if (optimizer_state && !saved.has_optimizer) {
    throw Error(checkpoint.path(), "holds no optimizer state (saved with --no-save-optim); load it with --no-load-optim "
                                   "or --finetune");
  }
  if (!options.finetune) check_counters(checkpoint);  // the counters a resume continues from
  const model::ParamLayout& layout = trainer.layout();
  // Every copy this rank holds (replicas too) reads its box of the global tensor.
  float* params = trainer.parameters();
  HostStaging staging(trainer.ops());
  for (const model::ParamEntry& entry : layout.entries) {
    staging.read_to_device(checkpoint, "model/" + entry.name, entry.global_shape, shard_box(entry),
                           params + entry.offset);
  }
  for (const Trainer::ExpertBias& bias : trainer.expert_biases()) {
    const int experts = trainer.model_config().num_experts;
    staging.read_to_device(checkpoint, expert_bias_tensor_name(bias.layer), {experts}, io::Box{{0}, {experts}}, bias.data);
  }
  load_fp8_state(checkpoint, trainer, staging);  // model state: with --finetune too, as TE's extra_state
  optim::DistributedOptimizer& optimizer = trainer.optimizer();
  if (optimizer_state) {
    // The moments of every run this rank updates (copies too).
    const char* names[] = {"optimizer/exp_avg/", "optimizer/exp_avg_sq/"};
    float* moments[] = {optimizer.exp_avg(), optimizer.exp_avg_sq()};
    for (int m = 0; m < 2; ++m) {
      for (const optim::TensorRun& run : optimizer.state_runs()) {
        const model::ParamEntry& entry = layout.entries[run.entry];
        int64_t state = run.state;
        for (const io::Box& box : shard_run_boxes(entry, run.begin, run.end)) {
          staging.read_to_device(checkpoint, names[m] + entry.name, entry.global_shape, box, moments[m] + state);
          state += box.elements();
        }
      }
    }
    optimizer.set_steps(saved.optimizer_step);
  }
  refuse_nonfinite_load(trainer, checkpoint, staging.problem());
  verify_before_load(checkpoint, trainer.world());  // before any step
  if (optimizer_state) resume_scheduler(checkpoint, trainer, options.scheduler);  // after the tensors, as Megatron
  trainer.parameters_changed();
  if (options.finetune) return;
  TrainerState state = trainer.checkpoint_state();  // the scaler stays this run's unless restored below
  state.iteration = saved.iteration;
  state.consumed_samples = saved.consumed_train_samples;
  state.consumed_valid_samples = saved.consumed_valid_samples;
  state.skipped_iters = saved.skipped_iters;
  state.nan_iters = saved.nan_iters;
  state.counters_origin = resumed_origin(checkpoint, trainer, optimizer_state);
  const TrainConfig& config = trainer.config();
  const bool dynamic_fp16 = config.precision == Precision::fp16 && config.loss_scale == 0;
  if (optimizer_state && dynamic_fp16 && saved_precision(checkpoint) == "fp16") {
    state.loss_scaler.scale = saved.loss_scale;
    state.loss_scaler.growth_tracker = static_cast<int>(saved.loss_scale_growth_tracker);
    state.loss_scaler.hysteresis_tracker = static_cast<int>(saved.loss_scale_hysteresis_tracker);
  }
  trainer.restore(state);
}

}  // namespace mt::train

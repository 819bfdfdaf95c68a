// mt-ckpt: look into, compare, convert and exchange mt's layout-independent HDF5 checkpoints
// (lib/io/checkpoint.h; Hugging Face: lib/io/hf_checkpoint.h).
//   inspect PATH  a `checkpoint` record (iteration, counters, loss scaler, seed, configs) and one
//                 `tensor` record per tensor (name, shape, dtype, bytes, stored checksum)
//   verify PATH   recomputes every checksum, scans for NaN/Inf and checks the tensors against the
//                 stored model config (every parameter, and the Adam moments when saved, with its
//                 global shape; nothing else): one `tensor` record each and a `verify` summary;
//                 exit 3 when a check fails
//   diff A B      max abs/rel difference per tensor (`tensor_diff`), a `diff` summary; exit 3
//                 past --atol/--rtol, for a tensor on one side only or a shape mismatch
//   convert IN OUT         parameters stored as --dtype, optimizer state dropped with --no-optim
//   export --format hf IN OUTDIR   config.json + model.safetensors for transformers
//   import --format hf INDIR OUT   an mt checkpoint (parameters only) from them
// PATH, A, B and IN are a checkpoint file or a --save directory (the iteration its tracker names);
// OUT is a file when it ends in .h5, else a --save-style directory. Tested by
// tests/tools/mt-ckpt.bats and tests/tools/conventions.bats.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <map>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "io/checkpoint.h"
#include "io/hf_checkpoint.h"
#include "io/value_checks.h"
#include "io/output_policy.h"
#include "model/config.h"
#include "model/layout.h"
#include "train/checkpointing.h"
#include "tools/common/tool_main.h"

namespace {

using mt::tools::Record;

struct Options {
  std::string path, other, output;
  std::string checkpoint_format;  // export/import --format: hf
  std::string dtype = "fp32";
  bool no_optim = false;
  bool force = false;  // convert/import/export: overwrite an existing output (never the input)
  double atol = 0, rtol = 0;
  int make_vocab_size_divisible_by = 128;
  CLI::App* inspect = nullptr;
  CLI::App* verify = nullptr;
  CLI::App* diff = nullptr;
  CLI::App* convert = nullptr;
  CLI::App* export_ = nullptr;
  CLI::App* import_ = nullptr;
};

// A checkpoint file, an iteration directory's checkpoint.h5, or the one a --save directory's
// tracker names (io::find_checkpoint, as mt-train --load).
std::string checkpoint_file(const std::string& path) {
  if (const std::optional<std::string> file = mt::io::find_checkpoint(path)) return *file;
  if (!std::filesystem::exists(path)) return path;  // the reader names it: "no such file"
  throw mt::Error(path, "holds neither " + mt::io::tracker_path(path) +
                            " nor a checkpoint.h5 (give a --save directory, an iter_NNNNNNN directory or a checkpoint file)");
}

nlohmann::json parsed(const std::string& text, const std::string& path, const char* field) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw mt::Error(path, std::string("attribute ") + field + " is not JSON");
  }
}

Record checkpoint_record(const mt::io::CheckpointReader& reader) {
  const mt::io::CheckpointState& s = reader.state();
  return Record{{"record", "checkpoint"},
                {"path", reader.path()},
                {"format_version", s.format_version},
                {"iteration", s.iteration},
                {"consumed_train_samples", s.consumed_train_samples},
                {"consumed_valid_samples", s.consumed_valid_samples},
                {"skipped_iterations", s.skipped_iters},
                {"nan_iterations", s.nan_iters},
                {"loss_scale", s.loss_scale},
                {"loss_scale_growth_tracker", s.loss_scale_growth_tracker},
                {"loss_scale_hysteresis_tracker", s.loss_scale_hysteresis_tracker},
                {"seed", s.seed},
                {"resumable", s.resumable},
                {"optimizer", s.has_optimizer},
                {"optimizer_step", s.has_optimizer ? Record(s.optimizer_step) : Record(nullptr)},
                {"bytes", static_cast<int64_t>(std::filesystem::file_size(reader.path()))},
                {"model", parsed(s.model_config, reader.path(), "model_config")},
                {"parallel", parsed(s.parallel_config, reader.path(), "parallel_config")},
                {"train", parsed(s.train_config, reader.path(), "train_config")}};
}

Record tensor_record(const mt::io::TensorInfo& t) {
  int64_t elements = 1;
  for (int64_t d : t.shape) elements *= d;
  return Record{{"record", "tensor"},
                {"name", t.name},
                {"shape", t.shape},
                {"dtype", t.dtype},
                {"elements", elements},
                {"bytes", t.bytes},
                {"checksum", t.checksum ? Record(mt::io::checksum_text(*t.checksum)) : Record(nullptr)}};
}

int run_inspect(mt::tools::ToolCli& cli, const std::string& path) {
  const mt::io::CheckpointReader reader(checkpoint_file(path));
  mt::tools::RecordWriter writer(cli.output_format());
  writer.write_run(mt::tools::run_record(cli));
  writer.write(checkpoint_record(reader));
  for (const mt::io::TensorInfo& tensor : reader.tensors()) writer.write(tensor_record(tensor));
  writer.finish();
  return 0;
}

bool stored_float(const std::string& dtype) { return dtype == "float32" || dtype == "bfloat16" || dtype == "float16"; }

// The stored model config.
mt::model::ModelConfig model_of(const mt::io::CheckpointReader& reader) {
  try {
    return mt::model::config_from_json(parsed(reader.state().model_config, reader.path(), "model_config"));
  } catch (const mt::Error& e) {
    throw mt::Error(reader.path(), std::string("attribute model_config: ") + e.what());
  }
}

// The tensors the stored model config says a checkpoint holds, with their global shapes (besides
// the FP8 scaling state a run with --fp8-format adds: train::is_fp8_state_tensor).
std::map<std::string, std::vector<int64_t>> expected_tensors(const mt::io::CheckpointReader& reader) {
  const mt::model::ModelConfig model = model_of(reader);
  std::map<std::string, std::vector<int64_t>> expected;
  for (const mt::model::ParamEntry& entry : mt::model::build_layout(model).entries) {
    if (entry.replica != 0) continue;
    expected["model/" + entry.name] = entry.global_shape;
    if (reader.state().has_optimizer) {
      expected["optimizer/exp_avg/" + entry.name] = entry.global_shape;
      expected["optimizer/exp_avg_sq/" + entry.name] = entry.global_shape;
    }
  }
  for (const auto& [name, shape] : mt::train::checkpoint_buffers(model)) expected[name] = shape;
  return expected;
}

int run_verify(mt::tools::ToolCli& cli, const std::string& path) {
  const mt::io::CheckpointReader reader(checkpoint_file(path));
  mt::tools::RecordWriter writer(cli.output_format());
  writer.write_run(mt::tools::run_record(cli));
  std::map<std::string, std::vector<int64_t>> expected = expected_tensors(reader);
  const mt::model::ModelConfig model = model_of(reader);
  int64_t failed = 0, checked = 0;
  std::string first_problem;
  auto fail = [&](const std::string& name, const std::string& problem) {
    if (failed++ == 0) first_problem = name + ": " + problem;
  };
  for (const mt::io::TensorInfo& tensor : reader.tensors()) {
    ++checked;
    Record record = tensor_record(tensor);
    std::vector<std::string> problems;
    const auto wanted = expected.find(tensor.name);
    if (wanted == expected.end()) {
      if (!mt::train::is_fp8_state_tensor(model, tensor)) problems.push_back("not a tensor of the stored model");
    } else {
      if (wanted->second != tensor.shape) problems.push_back("shape differs from the stored model config's");
      expected.erase(wanted);
    }
    const bool readable = stored_float(tensor.dtype);
    if (!readable) problems.push_back("dtype " + tensor.dtype + ", expected float32 (or bfloat16/float16 after convert)");
    if (!tensor.checksum) problems.push_back("no checksum attribute");
    if (readable) {
      const mt::io::CheckpointReader::Scan scan = reader.scan(tensor);
      record["checksum_computed"] = mt::io::checksum_text(scan.checksum);
      record["nonfinite"] = scan.nonfinite;
      if (tensor.checksum && scan.checksum != *tensor.checksum) problems.push_back("checksum mismatch");
      if (scan.nonfinite > 0) problems.push_back(std::to_string(scan.nonfinite) + " NaN/Inf values");
    }
    record["ok"] = problems.empty();
    std::string joined;
    for (const std::string& problem : problems) joined += (joined.empty() ? "" : "; ") + problem;
    record["problem"] = problems.empty() ? Record(nullptr) : Record(joined);
    if (!problems.empty()) fail(tensor.name, joined);
    writer.write(record);
  }
  for (const auto& [name, shape] : expected) {
    writer.write(Record{{"record", "tensor"}, {"name", name}, {"ok", false}, {"problem", "missing"}});
    fail(name, "missing");
  }
  writer.write(Record{{"record", "verify"},
                      {"path", reader.path()},
                      {"iteration", reader.state().iteration},
                      {"tensors", checked},
                      {"failed", failed},
                      {"ok", failed == 0}});
  writer.finish();
  if (failed == 0) return 0;
  mt::log::info("mt-ckpt: verify: " + reader.path() + ": " + std::to_string(failed) + " check(s) failed, first " +
                first_problem);
  return 3;
}

// Whole rows of the first dimension of `shape`, about 16 M elements at a time, in order.
template <typename Visit>
void for_each_piece(const std::vector<int64_t>& shape, Visit visit) {
  if (shape.empty()) return visit(mt::io::Box{});
  int64_t row = 1;
  for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
  const int64_t rows_per_piece = std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(row, 1));
  for (int64_t first = 0; first < shape[0]; first += rows_per_piece) {
    mt::io::Box box{std::vector<int64_t>(shape.size(), 0), shape};
    box.offset[0] = first;
    box.extent[0] = std::min(rows_per_piece, shape[0] - first);
    visit(box);
  }
}

// The values of A and B against each other: |a - b| beyond atol + rtol * max(|a|, |b|) counts as
// a mismatch; NaN equals NaN, any other pair with a NaN (or inf against a finite value) mismatches.
struct Difference {
  double max_abs = 0, max_rel = 0;
  int64_t mismatched = 0;
  void add(float a, float b, double atol, double rtol) {
    if (a == b || (std::isnan(a) && std::isnan(b))) return;
    const double abs = std::fabs(double(a) - double(b));
    if (!std::isfinite(abs)) {
      ++mismatched;
      return;
    }
    const double scale = std::max(std::fabs(double(a)), std::fabs(double(b)));
    max_abs = std::max(max_abs, abs);
    max_rel = std::max(max_rel, abs / scale);
    if (abs > atol + rtol * scale) ++mismatched;
  }
};

int run_diff(mt::tools::ToolCli& cli, const Options& o) {
  const mt::io::CheckpointReader a(checkpoint_file(o.path)), b(checkpoint_file(o.other));
  mt::tools::RecordWriter writer(cli.output_format());
  writer.write_run(mt::tools::run_record(cli));
  std::map<std::string, mt::io::TensorInfo> only_b;
  for (mt::io::TensorInfo& t : b.tensors()) only_b[t.name] = std::move(t);
  int64_t compared = 0, differing = 0, only_in_a = 0;
  double max_abs = 0;
  std::string first;
  auto failed = [&](const std::string& name, const std::string& why) {
    if (differing++ == 0) first = name + ": " + why;
  };
  std::vector<float> values_a, values_b;
  for (const mt::io::TensorInfo& ta : a.tensors()) {
    Record record{{"record", "tensor_diff"}, {"name", ta.name}};
    const auto found = only_b.find(ta.name);
    if (found == only_b.end()) {
      ++only_in_a;
      record["only_in"] = "A";
      record["ok"] = false;
      failed(ta.name, "only in A");
      writer.write(record);
      continue;
    }
    const mt::io::TensorInfo tb = found->second;
    only_b.erase(found);
    record["shape_a"] = ta.shape;
    record["shape_b"] = tb.shape;
    record["dtype_a"] = ta.dtype;
    record["dtype_b"] = tb.dtype;
    std::string problem;
    if (ta.shape != tb.shape) problem = "shape differs";
    if (!stored_float(ta.dtype) || !stored_float(tb.dtype)) problem = "dtype not comparable";
    if (!problem.empty()) {
      record["ok"] = false;
      record["problem"] = problem;
      failed(ta.name, problem);
      writer.write(record);
      continue;
    }
    ++compared;
    Difference d;
    for_each_piece(ta.shape, [&](const mt::io::Box& box) {
      values_a.resize(static_cast<size_t>(box.elements()));
      values_b.resize(values_a.size());
      a.read_box(ta.name, ta.shape, box, values_a.data());
      b.read_box(tb.name, tb.shape, box, values_b.data());
      for (size_t i = 0; i < values_a.size(); ++i) d.add(values_a[i], values_b[i], o.atol, o.rtol);
    });
    max_abs = std::max(max_abs, d.max_abs);
    record["max_abs"] = d.max_abs;
    record["max_rel"] = d.max_rel;
    record["mismatched"] = d.mismatched;
    record["ok"] = d.mismatched == 0;
    if (d.mismatched > 0) failed(ta.name, std::to_string(d.mismatched) + " elements beyond the tolerance");
    writer.write(record);
  }
  for (const auto& [name, tensor] : only_b) {
    writer.write(Record{{"record", "tensor_diff"}, {"name", name}, {"only_in", "B"}, {"ok", false}});
    failed(name, "only in B");
  }
  writer.write(Record{{"record", "diff"},
                      {"a", a.path()},
                      {"b", b.path()},
                      {"iteration_a", a.state().iteration},
                      {"iteration_b", b.state().iteration},
                      {"compared", compared},
                      {"only_in_a", only_in_a},
                      {"only_in_b", static_cast<int64_t>(only_b.size())},
                      {"differing", differing},
                      {"max_abs", max_abs},
                      {"atol", o.atol},
                      {"rtol", o.rtol},
                      {"ok", differing == 0}});
  writer.finish();
  if (differing == 0) return 0;
  mt::log::info("mt-ckpt: diff: " + std::to_string(differing) + " tensor(s) differ, first " + first);
  return 3;
}

// Where convert and import write: OUT itself when it ends in .h5, else OUT as a --save directory
// (OUT/iter_NNNNNNN/checkpoint.h5, then its tracker). The output policy (io/output_policy.h):
// never the input; an existing file only with --force; and a directory's tracker never moves
// backwards or onto a checkpoint that cannot resume, --force or not.
struct OutputCheckpoint {
  std::string directory;  // empty: a single file
  std::string file;
  int64_t iteration = 0;
  OutputCheckpoint(const std::string& out, int64_t iteration_, bool resumable, const mt::io::NamedInput& input, bool force)
      : iteration(iteration_) {
    if (std::filesystem::path(out).extension() == ".h5") {
      file = out;
    } else {
      directory = out;
      file = mt::io::checkpoint_path(out, iteration);
    }
    if (std::filesystem::exists(file) && !force) {
      throw mt::UsageError(file, "exists; mt-ckpt never overwrites a checkpoint without --force (or name another OUT)");
    }
    if (!directory.empty()) refuse_tracker_move(resumable);
    mt::io::refuse_input_as_output("OUT", file, {input});
  }
  void refuse_tracker_move(bool resumable) const {
    const std::optional<int64_t> latest = mt::io::read_tracker(directory);
    if (!latest || (resumable && iteration >= *latest)) return;
    throw mt::UsageError(directory, "its tracker names iteration " + std::to_string(*latest) + "; this writes iteration " +
                                        std::to_string(iteration) + (resumable ? "" : ", parameters only (not resumable)") +
                                        ", and a tracker never moves backwards or onto a checkpoint that cannot "
                                        "resume: write into a new directory or an OUT.h5 file");
  }
  // Creates what the file needs and returns its path.
  std::string prepare() const {
    if (directory.empty()) {
      mt::check_writable("OUT", file);
      return file;
    }
    return mt::io::prepare_checkpoint_directory(directory, iteration);
  }
  void finish() const {
    if (!directory.empty()) mt::io::write_tracker(directory, iteration);
  }
};

mt::DType parse_dtype(const std::string& name) {
  if (name == "fp32") return mt::DType::f32;
  if (name == "bf16") return mt::DType::bf16;
  if (name == "fp16") return mt::DType::f16;
  throw mt::UsageError("--dtype " + name, "must be fp32, bf16 or fp16");
}

int run_convert(mt::tools::ToolCli& cli, const Options& o) {
  const mt::DType dtype = parse_dtype(o.dtype);
  const mt::io::CheckpointReader reader(checkpoint_file(o.path));
  mt::io::CheckpointState state = reader.state();
  // Lower-precision master weights cannot continue the run they came from: parameters only.
  const bool drop_optimizer = o.no_optim || dtype != mt::DType::f32;
  const OutputCheckpoint out(o.output, state.iteration, state.resumable && !drop_optimizer, {"IN", reader.path()},
                             o.force);
  mt::io::CheckpointWriter writer(out.prepare());
  int64_t tensors = 0, dropped = 0;
  std::vector<float> values;
  for (const mt::io::TensorInfo& tensor : reader.tensors()) {
    const bool parameter = tensor.name.rfind("model/", 0) == 0;
    if (!parameter && drop_optimizer) {
      ++dropped;
      continue;
    }
    const mt::io::Box box{std::vector<int64_t>(tensor.shape.size(), 0), tensor.shape};
    values.resize(static_cast<size_t>(box.elements()));
    reader.read_box(tensor.name, tensor.shape, box, values.data());
    mt::io::check_finite(reader.path(), tensor.name, values.data(), box.elements(),
                         " (mt-ckpt convert writes finite checkpoints only)");
    // A damaged input is never converted (issue 28 W2): the values read give the stored checksum.
    reader.check_checksum(tensor, mt::io::slice_checksum(tensor.shape, mt::io::TensorSlice{box, values.data()}));
    if (parameter) mt::io::check_fits_dtype(reader.path(), tensor.name, values.data(), box.elements(), dtype);
    writer.write_tensor(tensor.name, tensor.shape, {mt::io::TensorSlice{box, values.data()}},
                        parameter ? dtype : mt::DType::f32);
    ++tensors;
  }
  if (drop_optimizer) {
    state.has_optimizer = false;
    state.resumable = false;
  }
  const int64_t bytes = writer.commit(state);
  out.finish();
  if (!state.resumable && reader.state().resumable) {
    mt::log::info("mt-ckpt: convert: " + out.file + " holds parameters only: not resumable (mt-train --load DIR --finetune)");
  }
  mt::tools::RecordWriter records(cli.output_format());
  records.write_run(mt::tools::run_record(cli));
  records.write(Record{{"record", "convert"},
                       {"input", reader.path()},
                       {"path", out.file},
                       {"dtype", mt::dtype_name(dtype)},
                       {"tensors", tensors},
                       {"dropped", dropped},
                       {"resumable", state.resumable},
                       {"optimizer", state.has_optimizer},
                       {"bytes", bytes}});
  records.finish();
  return 0;
}

void require_hf(const Options& o, const char* command) {
  if (o.checkpoint_format != "hf") {
    throw mt::UsageError(std::string(command) + " --format " + o.checkpoint_format, "only hf (Hugging Face) is built");
  }
}

int run_export(mt::tools::ToolCli& cli, const Options& o) {
  require_hf(o, "export");
  const mt::DType dtype = parse_dtype(o.dtype);
  const mt::io::CheckpointReader reader(checkpoint_file(o.path));
  reader.verify_checksums();  // a damaged input is never exported (issue 28 W2)
  for (const char* name : {"config.json", "model.safetensors", "model.safetensors.index.json"}) {
    mt::io::refuse_existing_output("OUTDIR", (std::filesystem::path(o.output) / name).string(), false, o.force);
  }
  const mt::io::HfExportResult result = mt::io::export_hf(reader, o.output, dtype);
  mt::tools::RecordWriter records(cli.output_format());
  records.write_run(mt::tools::run_record(cli));
  records.write(Record{{"record", "export"},
                       {"input", reader.path()},
                       {"directory", o.output},
                       {"format", "hf"},
                       {"architecture", mt::io::hf_architecture_name(result.architecture)},
                       {"dtype", mt::dtype_name(dtype)},
                       {"tensors", result.tensors},
                       {"bytes", result.bytes}});
  records.finish();
  return 0;
}

// The mt-train model flags of `m` (what --load of an import needs the run to match).
std::string flag_number(double value) {
  std::ostringstream text;
  text << std::setprecision(9) << value;
  return text.str();
}

// DeepseekV3ForCausalLM's model flags (io/hf_checkpoint.h): MLA with the latent norms, YaRN, the
// dense-then-MoE layers with DeepSeek-V3's sigmoid router, the expert bias and shared experts, MTP.
std::string deepseek_flags(const mt::model::ModelConfig& m) {
  auto integer = [](const char* flag, int value) { return std::string(" ") + flag + " " + std::to_string(value); };
  std::string flags = " --multi-latent-attention --qk-layernorm";
  if (m.q_lora_rank > 0) flags += integer("--q-lora-rank", m.q_lora_rank);
  flags += integer("--kv-lora-rank", m.kv_lora_rank) + integer("--qk-head-dim", m.qk_head_dim) +
           integer("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim) + integer("--v-head-dim", m.v_head_dim);
  if (m.rope_type == mt::model::RopeType::yarn) {
    flags += " --rope-type yarn --rotary-scaling-factor " + flag_number(m.rotary_scaling_factor) + " --mscale " +
             flag_number(m.mscale) + " --mscale-all-dim " + flag_number(m.mscale_all_dim) +
             integer("--yarn-original-max-position-embeddings", m.original_max_position_embeddings) +
             " --yarn-beta-fast " + flag_number(m.yarn_beta_fast) + " --yarn-beta-slow " + flag_number(m.yarn_beta_slow);
  } else {
    flags += " --rope-type rope";
  }
  if (m.mtp_num_layers > 0) flags += integer("--mtp-num-layers", m.mtp_num_layers);
  if (m.num_experts == 0) return flags;
  int dense = 0;
  while (dense < m.num_layers && !m.is_moe_layer(dense)) ++dense;
  flags += integer("--num-experts", m.num_experts) + integer("--moe-router-topk", m.moe_router_topk) +
           integer("--moe-ffn-hidden-size", m.moe_ffn()) +
           integer("--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size) +
           " --moe-layer-freq ([0]*" + std::to_string(dense) + "+[1]*" + std::to_string(m.num_layers - dense) + ")" +
           " --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-topk-scaling-factor " +
           flag_number(m.moe_topk_scaling());
  if (m.moe_router_num_groups) {
    flags += integer("--moe-router-num-groups", *m.moe_router_num_groups) +
             integer("--moe-router-group-topk", m.moe_router_group_topk.value_or(1));
  }
  const bool seq = m.moe_router_load_balancing_type == mt::model::MoeLoadBalancing::seq_aux_loss;
  flags += std::string(" --moe-router-load-balancing-type ") + (seq ? "seq_aux_loss" : "aux_loss") +
           " --moe-aux-loss-coeff " + flag_number(m.moe_aux_loss_coeff) + " --moe-token-dispatcher-type alltoall";
  return flags;
}

std::string train_flags(const mt::model::ModelConfig& m) {
  auto number = [](double value) {
    std::ostringstream text;
    text << value;
    return text.str();
  };
  std::string flags = "--num-layers " + std::to_string(m.num_layers) + " --hidden-size " + std::to_string(m.hidden_size) +
                      " --ffn-hidden-size " + std::to_string(m.ffn_hidden_size) + " --num-attention-heads " +
                      std::to_string(m.num_attention_heads);
  if (m.query_groups() != m.num_attention_heads) {
    flags += " --group-query-attention --num-query-groups " + std::to_string(m.query_groups());
  }
  flags += " --max-position-embeddings " + std::to_string(m.max_position_embeddings) + " --vocab-size " +
           std::to_string(m.vocab_size) + " --make-vocab-size-divisible-by " + std::to_string(m.make_vocab_size_divisible_by) +
           " --norm-epsilon " + number(m.norm_epsilon);
  if (m.normalization == mt::model::Normalization::rmsnorm) flags += " --normalization RMSNorm";
  if (m.position_embedding == mt::model::PositionEmbedding::rope) {
    flags += " --position-embedding-type rope --rotary-base " + number(m.rotary_base);
  }
  if (m.swiglu) flags += " --swiglu";
  if (!m.add_bias_linear) flags += " --disable-bias-linear";
  if (m.untie_embeddings_and_output_weights) flags += " --untie-embeddings-and-output-weights";
  if (m.multi_latent_attention) flags += deepseek_flags(m);
  if (m.num_experts > 0 && !m.multi_latent_attention) {  // Mixtral: every layer MoE, the default softmax router, dropless
    flags += " --num-experts " + std::to_string(m.num_experts) + " --moe-router-topk " + std::to_string(m.moe_router_topk);
    if (m.moe_ffn_hidden_size > 0) flags += " --moe-ffn-hidden-size " + std::to_string(m.moe_ffn_hidden_size);
    flags += " --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff " + number(m.moe_aux_loss_coeff) +
             " --moe-token-dispatcher-type alltoall";
  }
  // Training-time settings of the imported config (GPT-2: resid_pdrop, attn_pdrop; LLaMA:
  // attention_dropout), never a reason to refuse a model.
  flags += " --hidden-dropout " + number(m.hidden_dropout) + " --attention-dropout " + number(m.attention_dropout);
  return flags;
}

int run_import(mt::tools::ToolCli& cli, const Options& o) {
  require_hf(o, "import");
  const OutputCheckpoint out(o.output, 0, false, {"INDIR", o.path}, o.force);
  const mt::io::HfImportResult result = mt::io::import_hf(o.path, out.prepare(), o.make_vocab_size_divisible_by);
  out.finish();
  mt::tools::RecordWriter records(cli.output_format());
  records.write_run(mt::tools::run_record(cli));
  records.write(Record{{"record", "import"},
                       {"directory", o.path},
                       {"path", out.file},
                       {"format", "hf"},
                       {"architecture", result.model.name},
                       {"tensors", result.tensors},
                       {"ignored", result.ignored},
                       {"bytes", result.bytes},
                       {"resumable", false},
                       {"model", mt::model::to_json(result.model)},
                       {"mt_train_flags", train_flags(result.model)}});
  records.finish();
  return 0;
}

void define(mt::tools::ToolCli& cli, Options& o) {
  CLI::App& app = cli.app();
  app.require_subcommand(0, 1);
  app.footer(
      "PATH, A, B and IN are a checkpoint file (DIR/iter_NNNNNNN/checkpoint.h5, or a --save-final file) or a --save\n"
      "directory (the iteration its latest_checkpointed_iteration.txt names). OUT (convert, import) is a file when it\n"
      "ends in .h5, else a --save directory (OUT/iter_NNNNNNN/checkpoint.h5 and its tracker, so mt-train --load OUT\n"
      "reads it); it is written under a temporary name, fsynced and renamed, and an existing checkpoint is never\n"
      "overwritten. The file's layout is in docs/DESIGN.md; h5py reads every tensor by name (f['model/<name>'],\n"
      "f['optimizer/exp_avg/<name>']).\n"
      "Exit codes: 0 ok, 1 unreadable or not an mt checkpoint, 2 usage, 3 verify or diff found a problem.\n"
      "Run mt-ckpt SUBCOMMAND --help for each subcommand's options.");
  o.inspect = app.add_subcommand("inspect", "Records of the checkpoint (state, configs) and of each tensor");
  o.verify = app.add_subcommand(
      "verify", "Recompute every checksum, scan for NaN/Inf, check tensors against the stored model config (exit 3)");
  for (CLI::App* command : {o.inspect, o.verify}) {
    command->add_option("path", o.path, "Checkpoint file or --save directory")->required();
    cli.add_output_format(*command);
  }

  o.diff = app.add_subcommand("diff", "Max abs/rel difference per tensor of two checkpoints (exit 3 past --atol/--rtol)");
  o.diff->add_option("a", o.path, "Checkpoint A (file or --save directory)")->required();
  o.diff->add_option("b", o.other, "Checkpoint B (file or --save directory)")->required();
  o.diff->add_option("--atol", o.atol, "Absolute tolerance")->capture_default_str()->check(CLI::NonNegativeNumber);
  o.diff->add_option("--rtol", o.rtol, "Relative tolerance")->capture_default_str()->check(CLI::NonNegativeNumber);
  o.diff->footer(
      "Compares every tensor (parameters and optimizer state) by name, values widened to fp32. An element differs\n"
      "when |a - b| > atol + rtol * max(|a|, |b|) (NaN equals NaN only); the defaults 0 and 0 accept identical values\n"
      "only. Records: one tensor_diff per tensor (shape_a/b, dtype_a/b, max_abs, max_rel = max |a-b|/max(|a|,|b|),\n"
      "mismatched elements; only_in A or B; a shape mismatch), then a diff summary. Exit 3 when any tensor differs,\n"
      "has another shape or exists on one side only; a dtype difference alone is reported, not a failure.");
  cli.add_output_format(*o.diff);

  o.convert = app.add_subcommand("convert", "Store the parameters as another dtype, drop the optimizer state");
  o.convert->add_option("in", o.path, "Checkpoint file or --save directory")->required();
  o.convert->add_option("out", o.output, "Output: a file (*.h5) or a --save directory")->required();
  o.convert->add_option("--dtype", o.dtype, "Dtype of the stored parameters: fp32, bf16 or fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  o.convert->add_flag("--no-optim", o.no_optim, "Drop the optimizer state (Adam's moments and step)");
  o.convert->add_flag("--force", o.force, "Overwrite an existing OUT file (never IN; a tracker never moves backwards)");
  o.convert->footer(
      "Without --no-optim and with --dtype fp32 the copy is exact and as resumable as its input. --no-optim, or a\n"
      "bf16/fp16 --dtype, makes a parameters-only checkpoint: not resumable (its `resumable` attribute is 0 and the\n"
      "record says so); mt-train starts from it with --load DIR --finetune. A bf16/fp16 checkpoint is half the size,\n"
      "for evaluation, export, distribution or the start of a fine-tuning run: its optimizer state is dropped too\n"
      "(moments without the master weights they belong to cannot continue a run). Loading it widens every value to\n"
      "fp32 exactly, so the fp32 master weights start as the rounded values: the low bits that bf16/fp16 dropped\n"
      "are gone. Checksums are those of the stored (rounded) values. Records: one convert record.");
  cli.add_output_format(*o.convert);

  o.export_ = app.add_subcommand("export", "Write a Hugging Face directory (config.json + model.safetensors)");
  o.export_->add_option("--format", o.checkpoint_format, "Checkpoint format to write: hf")
      ->required()
      ->check(CLI::IsMember({"hf"}));
  o.export_->add_option("in", o.path, "Checkpoint file or --save directory")->required();
  o.export_->add_option("outdir", o.output, "Directory to write (created)")->required();
  o.export_->add_option("--dtype", o.dtype, "Dtype of the safetensors: fp32, bf16 or fp16")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  o.export_->add_flag("--force", o.force, "Overwrite an HF model already in OUTDIR (config.json, model.safetensors)");
  o.export_->footer(
      "Writes the parameters with the names and shapes transformers expects: GPT2LMHeadModel for LayerNorm + learned\n"
      "positions + GELU + biases (Conv1D weights transposed, q/k/v fused into attn.c_attn), LlamaForCausalLM for\n"
      "RMSNorm + RoPE + SwiGLU without biases (mt's rotate-half RoPE layout is HF's: q/k rows are not permuted),\n"
      "MixtralForCausalLM for such a model whose every layer is MoE under the default softmax router (the router as\n"
      "block_sparse_moe.gate, expert gate/up/down as w1/w3/w2; other MoE router settings are refused by flag),\n"
      "DeepseekV3ForCausalLM for multi-latent attention (MLA's projections as q_a/q_b/kv_a_proj_with_mqa/kv_b/o_proj,\n"
      "dense layers then MoE layers with the sigmoid router, its expert bias as e_score_correction_bias and shared\n"
      "experts, each MTP depth k as model.layers.<num-layers + k>. with DeepSeek's enorm/hnorm/eh_proj/shared_head\n"
      "names; what HF's router cannot compute, e.g. a --moe-router-group-topk other than top-k / 2, is refused by flag).\n"
      "The vocabulary pad rows are dropped (config.json's vocab_size is the real vocabulary); a tied output layer is\n"
      "tie_word_embeddings: true and no lm_head.weight. Each file is written under a temporary name, fsynced,\n"
      "renamed. The records are printed as JSONL (--format names the checkpoint format here).");

  o.import_ = app.add_subcommand("import", "Make an mt checkpoint (parameters only) from a Hugging Face directory");
  o.import_->add_option("--format", o.checkpoint_format, "Checkpoint format to read: hf")
      ->required()
      ->check(CLI::IsMember({"hf"}));
  o.import_->add_option("indir", o.path, "Directory with config.json and model.safetensors (or its index and shards)")
      ->required();
  o.import_->add_option("out", o.output, "Output: a file (*.h5) or a --save directory")->required();
  o.import_->add_option("--make-vocab-size-divisible-by", o.make_vocab_size_divisible_by,
                        "Pad the vocabulary to a multiple of this (mt-train's flag; the run must use the same)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  o.import_->add_flag("--force", o.force, "Overwrite an existing OUT file (a tracker never moves backwards)");
  o.import_->footer(
      "Reads config.json (model_type gpt2, llama, mixtral or deepseek_v3; anything mt cannot represent, such as\n"
      "rope_scaling other than DeepSeek-V3's yarn, biases in\n"
      "LLaMA or another activation, is refused naming the field) and the F32/BF16/F16 safetensors, and writes the\n"
      "parameters as fp32 with mt's names, the vocabulary padded with zero rows. The checkpoint is parameters only\n"
      "(iteration 0, no optimizer state, not resumable): train from it with mt-train --load OUT --finetune and the\n"
      "model flags the import record's mt_train_flags lists. Tensors of the files no parameter comes from (e.g. a\n"
      "tied lm_head.weight) are listed as ignored. The records are printed as JSONL.");
}

int run(mt::tools::ToolCli& cli, Options& o) {
  if (o.inspect->parsed()) return run_inspect(cli, o.path);
  if (o.verify->parsed()) return run_verify(cli, o.path);
  if (o.diff->parsed()) return run_diff(cli, o);
  if (o.convert->parsed()) return run_convert(cli, o);
  if (o.export_->parsed()) return run_export(cli, o);
  if (o.import_->parsed()) return run_import(cli, o);
  throw mt::UsageError("subcommand", "one of inspect, verify, diff, convert, export, import is required (see mt-ckpt --help)");
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  return mt::tools::tool_main(
      argc, argv, "mt-ckpt",
      "Inspect, verify, compare and convert mt's layout-independent HDF5 checkpoints, and exchange them with Hugging "
      "Face; JSONL records on stdout.",
      [&](mt::tools::ToolCli& cli) { define(cli, options); }, [&](mt::tools::ToolCli& cli) { return run(cli, options); });
}

// FP8 for a MoE layer's local experts (model/moe/experts.h with ctx.fp8, issue 23): each expert's
// fc1 and fc2 an FP8 linear of its own and the router none; both paths near an fp32 run within
// FP8's error; TE's padding of each expert's rows to a multiple of 16 changes no number (the same
// call on rows padded with zero rows gives the same bits and amaxes, and every FP8 GEMM then takes
// rows in multiples of 16, as cuBLASLt does); and expert parallelism as
// Megatron runs it, checked against an independent EP=1 run of the same rows: two EP ranks, each
// holding two of four experts, give EP=1's outputs at the first step (every scale still 1), and
// after the amax reduction over the ranks (the trainer's TP x DP x CP all-reduce MAX, EP inside
// DP, stood in for here) local expert i's amaxes are the max over the global experts sharing local
// index i of what EP=1 recorded per expert.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "model/fp8_scaling.h"
#include "model/layout.h"
#include "model/moe/experts.h"
#include "model/precision_gemm.h"

using namespace mt;
using namespace mt::model;

namespace {

constexpr int64_t kHidden = 16, kFfn = 16;

const backend::Ops& cpu() { return backend::cpu_ops(); }

std::vector<float> uniform(size_t n, uint32_t seed, float low, float high) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

// Local experts [first, first + counts.size()) of a layer of `global_experts`: fc1 of every local
// expert, then fc2, then the router (global_experts, C) in one flat buffer.
struct Problem {
  LocalExpertsShape shape;
  int64_t first = 0, global_experts = 0, router_offset = 0, rows = 0;
  std::vector<int64_t> counts;
  std::vector<float> params, x, probs, d_out;

  Problem(int64_t first_expert, int64_t global, std::vector<int64_t> tokens, std::vector<float> all_params,
          std::vector<float> rows_x, std::vector<float> rows_probs, std::vector<float> rows_d_out)
      : first(first_expert), global_experts(global), counts(std::move(tokens)), params(std::move(all_params)),
        x(std::move(rows_x)), probs(std::move(rows_probs)), d_out(std::move(rows_d_out)) {
    const int64_t experts = static_cast<int64_t>(counts.size());
    shape = {experts, kHidden, kFfn, 0, 2 * kFfn * kHidden, experts * 2 * kFfn * kHidden, kHidden * kFfn};
    router_offset = shape.fc2_offset + experts * shape.fc2_stride;
    rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  }

  // The layout's entries as mt's MoE layer declares them (global expert names, local offsets).
  ParamLayout layout() const {
    ParamLayout layout;
    auto add = [&](const std::string& name, int64_t offset, int64_t out, int64_t in) {
      ParamEntry entry;
      entry.name = name;
      entry.layer = 0;
      entry.local_shape = {out, in};
      entry.offset = offset;
      entry.numel = out * in;
      layout.entries.push_back(entry);
    };
    for (int64_t j = 0; j < shape.num_local_experts; ++j) {
      const std::string prefix = "decoder.layers.0.mlp.experts." + std::to_string(first + j) + ".";
      add(prefix + "linear_fc1_gate.weight", j * shape.fc1_stride, kFfn, kHidden);
      add(prefix + "linear_fc1_up.weight", j * shape.fc1_stride + kFfn * kHidden, kFfn, kHidden);
      add(prefix + "linear_fc2.weight", shape.fc2_offset + j * shape.fc2_stride, kHidden, kFfn);
    }
    add("decoder.layers.0.mlp.router.weight", router_offset, global_experts, kHidden);
    layout.total_elements = static_cast<int64_t>(params.size());
    return layout;
  }
};

// Random weights and rows for experts with `counts` rows each (all global experts of a layer).
Problem random_problem(std::vector<int64_t> counts, uint32_t seed = 3) {
  const int64_t experts = static_cast<int64_t>(counts.size());
  const int64_t rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const size_t params = static_cast<size_t>(experts * 3 * kFfn * kHidden + experts * kHidden);
  return Problem(0, experts, counts, uniform(params, seed, -0.3f, 0.3f),
                 uniform(static_cast<size_t>(rows * kHidden), seed + 1, -1.0f, 1.0f),
                 uniform(static_cast<size_t>(rows), seed + 2, 0.1f, 1.0f),
                 uniform(static_cast<size_t>(rows * kHidden), seed + 3, -1.0f, 1.0f));
}

struct Result {
  std::vector<float> out, d_x, d_probs, grads;
};

// Forward and backward of the experts in `precision`, FP8 when `fp8` is given (the caller drives
// its phases around the two calls through `between`: called after the forward).
template <typename Between>
Result run(const Problem& p, ExpertGemmPath path, Precision precision, Fp8Scaling* fp8, Between between,
           const backend::Ops& ops = cpu()) {
  const LocalExperts experts(p.shape, path);
  GemmWeights weights(ops, precision, static_cast<int64_t>(p.params.size()));
  weights.refresh(p.params.data());
  Result result{std::vector<float>(p.rows * kHidden, NAN), std::vector<float>(p.rows * kHidden, NAN),
                std::vector<float>(p.rows, NAN), std::vector<float>(p.params.size(), 0.0f)};
  const int64_t capacity = std::max<int64_t>(p.rows, 1);
  std::vector<float> saved_block(experts.saved_floats(capacity)),
      workspace_block(experts.workspace_floats(capacity, precision));
  BufferSource saved_source(saved_block.data()), workspace_source(workspace_block.data());
  const ExpertsSaved saved = experts.lay_out_saved(saved_source, capacity);
  const ExpertsWorkspace workspace = experts.lay_out_workspace(workspace_source, capacity, precision);
  const ExpertsContext ctx{ops, ops.default_stream(), weights, p.params.data(), result.grads.data(), fp8};
  const ExpertRows rows{p.x.data(), p.probs.data(), p.counts.data(), p.rows};
  experts.forward(ctx, rows, saved, workspace, result.out.data());
  between();
  experts.backward(ctx, rows, saved, workspace, p.d_out.data(), result.d_x.data(), result.d_probs.data());
  return result;
}

Result run(const Problem& p, ExpertGemmPath path, Precision precision, Fp8Scaling* fp8) {
  return run(p, path, precision, fp8, [] {});
}

Fp8Config fp8_config() {
  Fp8Config config;
  config.enabled = true;
  config.format = Fp8Format::hybrid;
  config.amax_history_len = 2;
  return config;
}

double rms(const std::vector<float>& v) {
  double squares = 0;
  for (float value : v) squares += static_cast<double>(value) * value;
  return v.empty() ? 0.0 : std::sqrt(squares / static_cast<double>(v.size()));
}

// rms(a - b) <= tol * rms(b) (the error as a whole) and max |a - b| <= 0.75 rms(b) (no element
// far off).
void expect_near_rms(const std::string& what, const std::vector<float>& a, const std::vector<float>& b, double tol) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  std::vector<float> difference(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    difference[i] = a[i] - b[i];
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  EXPECT_LE(rms(difference), tol * rms(b)) << what << ": rms difference " << rms(difference) << ", rms " << rms(b);
  EXPECT_LE(worst, 0.75 * rms(b)) << what << ": worst difference " << worst << ", rms " << rms(b);
}

// The three tensors of linear `linear`: amax history newest first (its first entry: the amax of the
// last update), scale.
std::vector<float> state_of(const Fp8Scaling& fp8, int64_t linear) {
  std::vector<float> state;
  for (Fp8Operand operand : {Fp8Operand::input, Fp8Operand::weight, Fp8Operand::output_grad}) {
    state.push_back(fp8.amax_history(linear, operand)[0]);
    state.push_back(*fp8.scale(linear, operand));
  }
  return state;
}

}  // namespace

TEST(Fp8Experts, EachExpertHasItsOwnFp8LinearsAndTheRouterNone) {
  const Problem p = random_problem({16, 5, 0, 11});
  const ParamLayout layout = p.layout();
  const Fp8Scaling fp8(cpu(), fp8_config(), layout, 1);
  EXPECT_EQ(fp8.linears(), 3 * 4);  // gate, up, fc2 of each expert
  EXPECT_EQ(fp8.linear(p.router_offset), -1);
  for (int64_t e = 0; e < 4; ++e) {
    EXPECT_GE(fp8.linear(e * p.shape.fc1_stride), 0) << "expert " << e << " fc1";
    EXPECT_GE(fp8.linear(p.shape.fc2_offset + e * p.shape.fc2_stride), 0) << "expert " << e << " fc2";
  }
}

TEST(Fp8Experts, BothPathsStayNearFp32WithinFp8Error) {
  const Problem p = random_problem({16, 5, 0, 11});
  const Result fp32 = run(p, ExpertGemmPath::loop, Precision::fp32, nullptr);
  for (ExpertGemmPath path : {ExpertGemmPath::loop, ExpertGemmPath::grouped}) {
    SCOPED_TRACE(expert_gemm_path_name(path));
    // A first call records the amaxes and sets the scales (TE's delayed scaling); the second is compared.
    Fp8Scaling fp8(cpu(), fp8_config(), p.layout(), 1);
    run(p, path, Precision::bf16, &fp8);
    fp8.update_scales();
    const Result r = run(p, path, Precision::bf16, &fp8);
    // e4m3 keeps 3 mantissa bits (relative step 2^-3), e5m2 (the grads) 2: measured rms
    // differences 5.5% (out), 8.6% (d_x), 8.0% (d_probs), 8.7% (grads) of the fp32 rms, the worst
    // element 63% (a weight grad).
    expect_near_rms("out", r.out, fp32.out, 0.12);
    expect_near_rms("d_x", r.d_x, fp32.d_x, 0.12);
    expect_near_rms("d_probs", r.d_probs, fp32.d_probs, 0.12);
    expect_near_rms("grads", r.grads, fp32.grads, 0.12);
    // The FP8 GEMMs ran: not bf16's numbers.
    const Result bf16 = run(p, path, Precision::bf16, nullptr);
    EXPECT_NE(r.out, bf16.out);
    // Each expert's input amax is the max |x| over its rows; the expert without rows recorded none
    // for its input but its weight's.
    for (int64_t e = 0, row = 0; e < 4; row += p.counts[e], ++e) {
      float expected = 0;
      for (int64_t i = row * kHidden; i < (row + p.counts[e]) * kHidden; ++i) expected = std::max(expected, std::fabs(p.x[i]));
      const int64_t fc1 = fp8.linear(e * p.shape.fc1_stride);
      EXPECT_EQ(*fp8.amax(fc1, Fp8Operand::input), expected) << "expert " << e;
      EXPECT_GT(*fp8.amax(fc1, Fp8Operand::weight), 0.0f) << "expert " << e;
    }
  }
}

// TE's Fp8Padding: the same experts on rows padded with zero rows (and zero output grads) to a
// multiple of 16 give the same outputs, grads and amaxes, bit for bit. The experts' counts take
// every case of Fp8RowPadding: a tail only (5), none (0), whole blocks and a tail (21, 37).
TEST(Fp8Experts, PaddingEachExpertsRowsTo16ChangesNoNumber) {
  const Problem p = random_problem({5, 0, 21, 37});
  std::vector<int64_t> padded_counts;
  std::vector<float> x, probs, d_out;
  std::vector<int64_t> padded_row_of;  // the padded row of each real row
  for (int64_t e = 0, row = 0; e < 4; row += p.counts[e], ++e) {
    const int64_t padded = (p.counts[e] + 15) / 16 * 16;
    for (int64_t i = 0; i < padded; ++i) {
      const bool real = i < p.counts[e];
      if (real) padded_row_of.push_back(static_cast<int64_t>(probs.size()));
      for (int64_t c = 0; c < kHidden; ++c) {
        x.push_back(real ? p.x[(row + i) * kHidden + c] : 0.0f);
        d_out.push_back(real ? p.d_out[(row + i) * kHidden + c] : 0.0f);
      }
      probs.push_back(real ? p.probs[row + i] : 0.0f);
    }
    padded_counts.push_back(padded);
  }
  const Problem padded(0, 4, padded_counts, p.params, x, probs, d_out);
  for (ExpertGemmPath path : {ExpertGemmPath::loop, ExpertGemmPath::grouped}) {
    SCOPED_TRACE(expert_gemm_path_name(path));
    Fp8Scaling fp8(cpu(), fp8_config(), p.layout(), 1), fp8_padded(cpu(), fp8_config(), padded.layout(), 1);
    const Result r = run(p, path, Precision::bf16, &fp8);
    const Result q = run(padded, path, Precision::bf16, &fp8_padded);
    EXPECT_EQ(r.grads, q.grads);
    for (int64_t row = 0; row < p.rows; ++row) {
      const int64_t at = padded_row_of[static_cast<size_t>(row)];
      for (int64_t c = 0; c < kHidden; ++c) {
        ASSERT_EQ(r.out[row * kHidden + c], q.out[at * kHidden + c]) << "row " << row;
        ASSERT_EQ(r.d_x[row * kHidden + c], q.d_x[at * kHidden + c]) << "row " << row;
      }
      ASSERT_EQ(r.d_probs[row], q.d_probs[at]) << "row " << row;
    }
    const std::vector<float> amaxes(fp8.amaxes(), fp8.amaxes() + fp8.tensors()),
        padded_amaxes(fp8_padded.amaxes(), fp8_padded.amaxes() + fp8_padded.tensors());
    EXPECT_EQ(amaxes, padded_amaxes);
  }
}

// Fp8RowPadding's sizes: whole 16-row blocks and a tail, the padded count, and a scratch that
// holds the padded codes and, 256-byte aligned after them, the tail's fp32 output block.
TEST(Fp8Experts, RowPaddingSplitsRowsIntoWholeBlocksAndATail) {
  for (int64_t rows = 0; rows <= 50; ++rows) {
    const Fp8RowPadding padding = fp8_row_padding(rows);
    EXPECT_EQ(padding.rows, rows);
    EXPECT_EQ(padding.body % 16, 0) << rows;
    EXPECT_EQ(padding.padded % 16, 0) << rows;
    EXPECT_TRUE(padding.body <= rows && rows < padding.body + 16) << rows;
    EXPECT_EQ(padding.tail(), rows % 16) << rows;
    EXPECT_EQ(padding.padded, padding.tail() == 0 ? rows : padding.body + 16) << rows;
    for (const auto& [k, n] : {std::pair<int64_t, int64_t>{16, 32}, {48, 16}, {7168, 4096}}) {
      const int64_t offset = padding.tail_output_offset(k);
      EXPECT_EQ(offset % 256, 0) << rows << " rows, k " << k;
      EXPECT_GE(offset, padding.padded * k) << rows << " rows, k " << k;
      EXPECT_LT(offset, padding.padded * k + 256) << rows << " rows, k " << k;
      EXPECT_EQ(padding.scratch_bytes(k, n), offset + 16 * n * 4) << rows << " rows, k " << k;
    }
  }
}

// Every FP8 GEMM the experts run takes M, N and K in multiples of 16 and A and B on 16-byte
// boundaries (what cuBLASLt's FP8 kernels take; on CUDA anything else falls to a plain kernel),
// whatever the experts' counts: a CPU table whose gemm_fp8 records each call's shape first.
struct Fp8GemmCall {
  int64_t m, n, k, lda, ldb;
  bool aligned;
};
std::vector<Fp8GemmCall>& fp8_gemm_calls() {
  static std::vector<Fp8GemmCall> calls;
  return calls;
}
void recording_gemm_fp8(int64_t m, int64_t n, int64_t k, float alpha, const uint8_t* a, kernels::Fp8Type a_type,
                        const float* a_scale_inv, int64_t lda, const uint8_t* b, kernels::Fp8Type b_type,
                        const float* b_scale_inv, int64_t ldb, float beta, float* c, int64_t ldc,
                        backend::Stream stream) {
  const bool aligned = reinterpret_cast<uintptr_t>(a) % 16 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0;
  fp8_gemm_calls().push_back({m, n, k, lda, ldb, aligned});
  cpu().gemm_fp8(m, n, k, alpha, a, a_type, a_scale_inv, lda, b, b_type, b_scale_inv, ldb, beta, c, ldc, stream);
}

TEST(Fp8Experts, EveryFp8GemmTakesRowsInMultiplesOf16) {
  backend::Ops recording = cpu();
  recording.gemm_fp8 = recording_gemm_fp8;
  const Problem p = random_problem({5, 0, 21, 37});
  for (ExpertGemmPath path : {ExpertGemmPath::loop, ExpertGemmPath::grouped}) {
    SCOPED_TRACE(expert_gemm_path_name(path));
    fp8_gemm_calls().clear();
    Fp8Scaling fp8(cpu(), fp8_config(), p.layout(), 1);
    const Result recorded = run(p, path, Precision::bf16, &fp8, [] {}, recording);
    // Per expert with rows: fc1 and fc2 forward, weight gradient and data gradient, each one GEMM
    // per 16-row body and one for a tail: 5 -> tail, 21 and 37 -> body and tail.
    EXPECT_EQ(fp8_gemm_calls().size(), 2u * (1 + 2 + 2) + 2u * 3 + 2u * (1 + 2 + 2));
    for (const Fp8GemmCall& call : fp8_gemm_calls()) {
      EXPECT_TRUE(call.m % 16 == 0 && call.n % 16 == 0 && call.k % 16 == 0 && call.lda % 16 == 0 &&
                  call.ldb % 16 == 0 && call.aligned)
          << "gemm_fp8 m " << call.m << " n " << call.n << " k " << call.k << " lda " << call.lda << " ldb "
          << call.ldb << (call.aligned ? "" : ", A or B off a 16-byte boundary");
    }
    Fp8Scaling fp8_plain(cpu(), fp8_config(), p.layout(), 1);
    const Result plain = run(p, path, Precision::bf16, &fp8_plain);
    EXPECT_EQ(recorded.out, plain.out);
    EXPECT_EQ(recorded.d_x, plain.d_x);
    EXPECT_EQ(recorded.grads, plain.grads);
  }
}

// EP=2 against an independent EP=1 run of the same rows (see the header comment).
TEST(Fp8Experts, ExpertParallelRanksMergeTheAmaxesOfExpertsSharingALocalIndex) {
  const Problem whole = random_problem({7, 16, 3, 9});
  // EP=1: one rank, all four experts, one step's forward and backward with TE's phases.
  Fp8Scaling ep1(cpu(), fp8_config(), whole.layout(), 1);
  ep1.start_step();
  ep1.begin_forward(0, true);
  const Result ep1_result = run(whole, ExpertGemmPath::loop, Precision::bf16, &ep1, [&] {
    ep1.end_forward();
    ep1.begin_backward(0);
  });
  ep1.end_backward();

  // EP=2: rank r holds experts 2r, 2r + 1 and their rows (the dispatcher's local-expert-major order).
  const int64_t split = whole.counts[0] + whole.counts[1];
  std::vector<Problem> ranks;
  for (int r = 0; r < 2; ++r) {
    const int64_t begin = r == 0 ? 0 : split, end = r == 0 ? split : whole.rows;
    std::vector<float> params;
    const int64_t fc1 = 2 * kFfn * kHidden, fc2 = kHidden * kFfn;
    auto take = [&](int64_t from, int64_t n) { params.insert(params.end(), whole.params.begin() + from, whole.params.begin() + from + n); };
    take(2 * r * fc1, 2 * fc1);
    take(whole.shape.fc2_offset + 2 * r * fc2, 2 * fc2);
    take(whole.router_offset, 4 * kHidden);
    ranks.emplace_back(2 * r, 4, std::vector<int64_t>{whole.counts[2 * r], whole.counts[2 * r + 1]}, params,
                       std::vector<float>(whole.x.begin() + begin * kHidden, whole.x.begin() + end * kHidden),
                       std::vector<float>(whole.probs.begin() + begin, whole.probs.begin() + end),
                       std::vector<float>(whole.d_out.begin() + begin * kHidden, whole.d_out.begin() + end * kHidden));
  }
  std::vector<std::unique_ptr<Fp8Scaling>> ep2;
  for (const Problem& rank : ranks) ep2.push_back(std::make_unique<Fp8Scaling>(cpu(), fp8_config(), rank.layout(), 1));
  // The all-reduce MAX over the two ranks: each rank's amaxes against the other's before either updated.
  std::vector<std::vector<float>> before(2);
  auto snapshot = [&](int64_t first, int64_t count) {
    for (int r = 0; r < 2; ++r) before[r].assign(ep2[r]->amaxes() + first, ep2[r]->amaxes() + first + count);
  };
  for (int r = 0; r < 2; ++r) {
    ep2[r]->set_amax_reduction([&, r](float* amaxes, int64_t count) {
      const std::vector<float>& other = before[1 - r];
      for (int64_t i = 0; i < count; ++i) amaxes[i] = std::max(amaxes[i], other[static_cast<size_t>(i)]);
    });
  }
  // Each rank's forward, then both reductions (the collective), then both backwards and their
  // reductions: rank 0's run calls rank 1's whole run between its forward and its backward.
  std::vector<Result> results(2);
  const int64_t n = ep2[0]->linears();
  for (int r = 0; r < 2; ++r) {
    ep2[r]->start_step();
    ep2[r]->begin_forward(0, true);
  }
  results[0] = run(ranks[0], ExpertGemmPath::loop, Precision::bf16, ep2[0].get(), [&] {
    results[1] = run(ranks[1], ExpertGemmPath::loop, Precision::bf16, ep2[1].get(), [&] {
      snapshot(0, 2 * n);
      ep2[0]->end_forward();
      ep2[1]->end_forward();
      ep2[0]->begin_backward(0);
      ep2[1]->begin_backward(0);
    });
  });
  snapshot(2 * n, n);
  ep2[0]->end_backward();
  ep2[1]->end_backward();

  // (a) The first step, every scale 1: EP=2's rows give EP=1's numbers.
  for (int r = 0; r < 2; ++r) {
    const int64_t begin = r == 0 ? 0 : split;
    for (size_t i = 0; i < results[r].out.size(); ++i) {
      ASSERT_EQ(results[r].out[i], ep1_result.out[static_cast<size_t>(begin * kHidden) + i]) << "rank " << r;
    }
  }
  // (b) Local expert i's state on both ranks: the max over global experts i and i + 2 of EP=1's.
  // The linear of expert e's gate, up or fc2 weight (kind 0, 1, 2) in a problem's flat buffer.
  auto linear_of = [](const Fp8Scaling& fp8, const Problem& p, int64_t e, int kind) {
    const int64_t offset = kind == 2 ? p.shape.fc2_offset + e * p.shape.fc2_stride
                                     : e * p.shape.fc1_stride + kind * kFfn * kHidden;
    return fp8.linear(offset);
  };
  for (int64_t local = 0; local < 2; ++local) {
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<float> expected = state_of(ep1, linear_of(ep1, whole, local, kind));
      const std::vector<float> other = state_of(ep1, linear_of(ep1, whole, local + 2, kind));
      for (size_t i = 0; i < expected.size(); i += 2) expected[i] = std::max(expected[i], other[i]);
      for (int r = 0; r < 2; ++r) {
        const std::vector<float> got = state_of(*ep2[r], linear_of(*ep2[r], ranks[r], local, kind));
        for (size_t i = 0; i < expected.size(); i += 2) {  // the amaxes; the scales follow from them
          EXPECT_EQ(got[i], expected[i]) << "rank " << r << ", local expert " << local << ", linear " << kind
                                         << ", tensor " << i / 2;
        }
      }
    }
  }
  // The experts sharing a local index share their whole state on both ranks.
  EXPECT_EQ(state_of(*ep2[0], 0), state_of(*ep2[1], 0));
}

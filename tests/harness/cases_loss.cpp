// Cases of the embedding and cross-entropy entries (see op_cases.h). Embedding: rows of a
// vocab-parallel shard (tokens outside it give zero rows), with and without position rows;
// backward sparse (rows no token touches keep their bits, -0.0 included), accumulated, the same
// at any thread count, against central differences. Cross-entropy in Megatron's vocab-parallel
// steps: padded vocabulary columns never enter the softmax and get exactly +0 gradients, -inf
// logits, two vocabulary shards composing to the full softmax, the loss summed in row order in
// double, the kernels' exp over the whole fp32 range.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "case_helpers.h"
#include "op_cases.h"
#include "reference.h"

namespace mt::harness {
namespace {

// --- embedding ----------------------------------------------------------------------------------

void add_embedding_forward(std::vector<OpCase>& cases) {
  for (int cols : {1, 67})
    for (bool with_wpe : {true, false}) {
      cases.push_back({.op = OpId::embedding_forward,
                       .mode = CaseMode::forward,
                       .name = shape_text({{"rows", 33}, {"cols", cols}, {"vocab_start", 20}, {"vocab_end", 50}}) +
                               (with_wpe ? " with positions" : " without positions") +
                               ", tokens in and out of the shard",
                       .body = [cols, with_wpe](CaseContext& c) {
                         const int64_t rows = 33, vocab_start = 20, vocab_end = 50, max_positions = 16;
                         const auto wte = random_floats((vocab_end - vocab_start) * cols, 70);
                         const auto wpe = random_floats(max_positions * cols, 71);
                         std::vector<int32_t> tokens(rows), positions(rows);
                         for (int64_t r = 0; r < rows; ++r) {
                           tokens[r] = static_cast<int32_t>((r * 37) % 70);
                           positions[r] = static_cast<int32_t>(r % max_positions);
                         }
                         const DeviceArray<float> y = c.filled(rows * cols, kNaN);
                         c.ops().embedding_forward(c.upload(tokens).data, c.upload(positions).data, c.upload(wte).data,
                                                   with_wpe ? c.upload(wpe).data : nullptr, y.data, rows, cols,
                                                   vocab_start, vocab_end, c.stream());
                         // One fp32 addition per element: the reference is that addition, exactly.
                         std::vector<float> expected(rows * cols);
                         for (int64_t r = 0; r < rows; ++r)
                           for (int col = 0; col < cols; ++col) {
                             const bool here = tokens[r] >= vocab_start && tokens[r] < vocab_end;
                             expected[r * cols + col] = (here ? wte[(tokens[r] - vocab_start) * cols + col] : 0.0f) +
                                                        (with_wpe ? wpe[positions[r] * cols + col] : 0.0f);
                           }
                         c.expect_equal("y", c.download(y, "y"), expected);
                       }});
    }
}

// Few distinct tokens, many repeats, some outside the shard; positions [32, 64) never used.
// Rows the tokens touch start at 0.5; untouched rows hold -0.0, which any "+= 0" would turn into
// +0.0. Accumulated against the reference; untouched rows keep -0.0; dwpe optional.
void check_sparse_embedding_backward(CaseContext& c) {
  const int64_t rows = 700, vocab_start = 100, vocab_end = 400, max_positions = 64;
  const int cols = 67 * 2;
  const int64_t vocab = vocab_end - vocab_start;
  std::vector<int32_t> tokens(rows), positions(rows);
  std::mt19937 rng(72);
  for (int64_t r = 0; r < rows; ++r) {
    tokens[r] = static_cast<int32_t>(rng() % 40 * 13);
    positions[r] = static_cast<int32_t>(rng() % 32);
  }
  const auto dy = random_floats(rows * cols, 73);
  std::vector<char> token_used(vocab, 0), position_used(max_positions, 0);
  for (int64_t r = 0; r < rows; ++r) {
    if (tokens[r] >= vocab_start && tokens[r] < vocab_end) token_used[tokens[r] - vocab_start] = 1;
    position_used[positions[r]] = 1;
  }
  std::vector<float> dwte_start(vocab * cols), dwpe_start(max_positions * cols);
  for (int64_t v = 0; v < vocab; ++v)
    for (int col = 0; col < cols; ++col) dwte_start[v * cols + col] = token_used[v] ? 0.5f : -0.0f;
  for (int64_t p = 0; p < max_positions; ++p)
    for (int col = 0; col < cols; ++col) dwpe_start[p * cols + col] = position_used[p] ? 0.5f : -0.0f;
  const DeviceArray<int32_t> d_tokens = c.upload(tokens), d_positions = c.upload(positions);
  const DeviceArray<float> d_dy = c.upload(dy), dwte = c.upload(dwte_start), dwpe = c.upload(dwpe_start);
  const DeviceArray<float> dwte_alone = c.upload(dwte_start);
  c.ops().embedding_backward(d_tokens.data, d_positions.data, d_dy.data, dwte.data, dwpe.data, rows, cols, vocab_start,
                             vocab_end, c.stream());
  c.ops().embedding_backward(d_tokens.data, d_positions.data, d_dy.data, dwte_alone.data, nullptr, rows, cols,
                             vocab_start, vocab_end, c.stream());
  const std::vector<float> dwte_result = c.download(dwte, "dwte"), dwpe_result = c.download(dwpe, "dwpe");
  std::vector<double> dwte_ref = to_double(dwte_start), dwpe_ref = to_double(dwpe_start);
  for (int64_t r = 0; r < rows; ++r)
    for (int col = 0; col < cols; ++col) {
      if (tokens[r] >= vocab_start && tokens[r] < vocab_end) {
        dwte_ref[(tokens[r] - vocab_start) * cols + col] += dy[r * cols + col];
      }
      dwpe_ref[positions[r] * cols + col] += dy[r * cols + col];
    }
  const double tol = tolerances(DType::f32).reference;
  c.expect_close("dwte", dwte_result, dwte_ref, tol);
  c.expect_close("dwpe", dwpe_result, dwpe_ref, tol);
  for (int64_t v = 0; v < vocab; ++v)
    for (int col = 0; col < cols && !token_used[v]; ++col) {
      if (!std::signbit(dwte_result[v * cols + col])) return c.fail("dwte row " + std::to_string(v) + " touched");
    }
  for (int64_t p = 0; p < max_positions; ++p)
    for (int col = 0; col < cols && !position_used[p]; ++col) {
      if (!std::signbit(dwpe_result[p * cols + col])) return c.fail("dwpe row " + std::to_string(p) + " touched");
    }
  c.expect_bits_equal("dwte without dwpe", c.download(dwte_alone, "dwte alone"), dwte_result);
}

// sum(dy * embedding(wte, wpe)) differentiated by central differences of the forward in double.
void check_embedding_differences(CaseContext& c) {
  const int64_t rows = 9, vocab_start = 2, vocab_end = 8, max_positions = 4;
  const int cols = 5;
  const int64_t vocab = vocab_end - vocab_start;
  const std::vector<int32_t> tokens{2, 5, 0, 9, 3, 5, 7, 7, 2}, positions{0, 3, 1, 2, 1, 0, 3, 3, 2};
  const auto wte = random_floats(vocab * cols, 74), wpe = random_floats(max_positions * cols, 75);
  const auto dy = random_floats(rows * cols, 76);
  const DeviceArray<float> dwte = c.filled(vocab * cols, 0.0f), dwpe = c.filled(max_positions * cols, 0.0f);
  c.ops().embedding_backward(c.upload(tokens).data, c.upload(positions).data, c.upload(dy).data, dwte.data, dwpe.data,
                             rows, cols, vocab_start, vocab_end, c.stream());
  const auto forward = [&](const std::vector<double>& wte_d, const std::vector<double>& wpe_d) {
    std::vector<double> y(rows * cols, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int col = 0; col < cols; ++col) {
        if (tokens[r] >= vocab_start && tokens[r] < vocab_end)
          y[r * cols + col] += wte_d[(tokens[r] - vocab_start) * cols + col];
        y[r * cols + col] += wpe_d[positions[r] * cols + col];
      }
    return y;
  };
  const auto wte_d = to_double(wte), wpe_d = to_double(wpe), dy_d = to_double(dy);
  const double tol = tolerances(DType::f32).finite_difference;
  c.expect_close("dwte", c.download(dwte, "dwte"),
                 numeric_gradient([&](const auto& v) { return forward(v, wpe_d); }, wte_d, dy_d), tol);
  c.expect_close("dwpe", c.download(dwpe, "dwpe"),
                 numeric_gradient([&](const auto& v) { return forward(wte_d, v); }, wpe_d, dy_d), tol);
}

void add_embedding_backward(std::vector<OpCase>& cases) {
  cases.push_back({.op = OpId::embedding_backward,
                   .mode = CaseMode::backward,
                   .name = "sparse rows accumulated, untouched rows keep -0.0, dwpe optional, the same at any thread "
                           "count, rows=700 cols=134 vocab [100, 400)",
                   .thread_count_independent = true,
                   .body = check_sparse_embedding_backward});
  cases.push_back({.op = OpId::embedding_backward,
                   .mode = CaseMode::grad,
                   .name = "rows=9 cols=5 vocab [2, 8) with positions",
                   .body = check_embedding_differences});
  cases.push_back({.op = OpId::embedding_backward,
                   .mode = CaseMode::accumulate,
                   .name = "two calls add twice onto random grads, rows=33 cols=67 vocab [20, 50)",
                   .body = [](CaseContext& c) {
                     const int64_t rows = 33, vocab_start = 20, vocab_end = 50, max_positions = 16;
                     const int cols = 67;
                     std::vector<int32_t> tokens(rows), positions(rows);
                     for (int64_t r = 0; r < rows; ++r) {
                       tokens[r] = static_cast<int32_t>((r * 37) % 70);
                       positions[r] = static_cast<int32_t>(r % max_positions);
                     }
                     const auto dy = random_floats(rows * cols, 77);
                     const auto wte_start = random_floats((vocab_end - vocab_start) * cols, 78);
                     const auto wpe_start = random_floats(max_positions * cols, 79);
                     const DeviceArray<int32_t> d_tokens = c.upload(tokens), d_positions = c.upload(positions);
                     const DeviceArray<float> d_dy = c.upload(dy), dwte = c.upload(wte_start),
                                              dwpe = c.upload(wpe_start);
                     for (int call = 0; call < 2; ++call) {
                       c.ops().embedding_backward(d_tokens.data, d_positions.data, d_dy.data, dwte.data, dwpe.data,
                                                  rows, cols, vocab_start, vocab_end, c.stream());
                     }
                     std::vector<double> dwte_ref = to_double(wte_start), dwpe_ref = to_double(wpe_start);
                     for (int64_t r = 0; r < rows; ++r)
                       for (int col = 0; col < cols; ++col) {
                         if (tokens[r] >= vocab_start && tokens[r] < vocab_end) {
                           dwte_ref[(tokens[r] - vocab_start) * cols + col] += 2.0 * dy[r * cols + col];
                         }
                         dwpe_ref[positions[r] * cols + col] += 2.0 * dy[r * cols + col];
                       }
                     const double tol = tolerances(DType::f32).reference;
                     c.expect_close("dwte", c.download(dwte, "dwte"), dwte_ref, tol);
                     c.expect_close("dwpe", c.download(dwpe, "dwpe"), dwpe_ref, tol);
                   }});
}

// --- cross-entropy ------------------------------------------------------------------------------

// The four per-row steps of one block of logits on the device, results on the host.
struct XentRun {
  std::vector<float> max, sumexp, target_logit, grad;
};

XentRun run_xent(CaseContext& c, const std::vector<float>& logits, int64_t rows, int64_t ld, int64_t valid_cols,
                 int64_t vocab_start, const std::vector<int32_t>& targets, const std::vector<float>& dloss) {
  const backend::Ops& ops = c.ops();
  const DeviceArray<float> d_logits = c.upload(logits), max = c.filled(rows, kNaN), sumexp = c.filled(rows, kNaN),
                           target = c.filled(rows, kNaN);
  const DeviceArray<int32_t> d_targets = c.upload(targets);
  ops.xent_row_max(d_logits.data, rows, ld, valid_cols, max.data, c.stream());
  ops.xent_row_sumexp(d_logits.data, rows, ld, valid_cols, max.data, sumexp.data, c.stream());
  ops.xent_target_logit(d_logits.data, rows, ld, valid_cols, vocab_start, d_targets.data, target.data, c.stream());
  ops.xent_backward(d_logits.data, rows, ld, valid_cols, vocab_start, d_targets.data, max.data, sumexp.data,
                    c.upload(dloss).data, c.stream());
  return {c.download(max, "row_max"), c.download(sumexp, "row_sumexp"), c.download(target, "target_logit"),
          c.download(d_logits, "dlogits")};
}

// (rows, 128) logits of which 101 columns are vocabulary: padding 1e30 (it would dominate if it
// leaked in), an -inf logit (exp must give 0, not NaN) and a -1e4 one.
struct PaddedXent {
  int64_t rows, vocab = 101, ld = 128;
  std::vector<float> logits = {}, dloss = {};
  std::vector<int32_t> targets = {};
};

PaddedXent padded_xent(int64_t rows) {
  PaddedXent p{rows};
  p.logits = random_floats(rows * p.ld, 80, -8.0f, 8.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t col = p.vocab; col < p.ld; ++col) p.logits[r * p.ld + col] = 1e30f;
  p.logits[3] = -kInf;
  p.logits[4] = -1e4f;
  p.targets.resize(rows);
  for (int64_t r = 0; r < rows; ++r) p.targets[r] = static_cast<int32_t>((r * 29 + 5) % p.vocab);
  p.dloss = random_floats(rows, 81, 0.1f, 2.0f);
  return p;
}

// The step `op` checks, on padded logits: row_max, row_sumexp, target_logit, or (backward) the
// loss composed from the steps and dlogits, exactly +0 in padded columns and at the -inf logit.
void check_padded_xent(CaseContext& c, int64_t rows, OpId op) {
  const PaddedXent p = padded_xent(rows);
  const XentRun run = run_xent(c, p.logits, rows, p.ld, p.vocab, 0, p.targets, p.dloss);
  const XentReference ref = ref_xent(to_double(p.logits), rows, p.ld, p.vocab, 0, p.targets, to_double(p.dloss));
  const double tol = tolerances(DType::f32).reference;
  if (op == OpId::xent_row_max) return c.expect_close("row_max", run.max, ref.max, tol);
  if (op == OpId::xent_row_sumexp) return c.expect_close("row_sumexp", run.sumexp, ref.sumexp, tol);
  if (op == OpId::xent_target_logit) return c.expect_close("target_logit", run.target_logit, ref.target_logit, tol);
  std::vector<float> loss(rows);
  for (int64_t r = 0; r < rows; ++r) loss[r] = std::log(run.sumexp[r]) + run.max[r] - run.target_logit[r];
  c.expect_close("loss", loss, ref.loss, tol);
  c.expect_close("dlogits", run.grad, ref.grad, tol);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t col = p.vocab; col < p.ld; ++col) {
      if (std::bit_cast<uint32_t>(run.grad[r * p.ld + col]) != 0u) return c.fail("padded column's gradient not +0");
    }
  c.expect(run.grad[3] == 0.0f, "the -inf logit's gradient is not 0");
}

void add_padded_xent(std::vector<OpCase>& cases) {
  const std::vector<OpId> steps = {OpId::xent_row_max, OpId::xent_row_sumexp, OpId::xent_target_logit,
                                   OpId::xent_backward};
  for (OpId op : steps) {
    std::vector<OpId> others;
    for (OpId other : steps)
      if (other != op) others.push_back(other);
    for (int64_t rows : {1, 7, 33}) {
      cases.push_back({.op = op,
                       .mode = op == OpId::xent_backward ? CaseMode::backward : CaseMode::forward,
                       .name = shape_text({{"rows", rows}, {"vocab", 101}, {"ld", 128}}) +
                               ": padded columns left out, -inf and -1e4 logits",
                       .also_uses = others,
                       .body = [rows, op](CaseContext& c) { check_padded_xent(c, rows, op); }});
    }
  }
}

// loss_r = log(sum exp) + max - target as the vocab-parallel steps compose it, differentiated by
// central differences.
void check_xent_differences(CaseContext& c) {
  const int64_t rows = 3, vocab = 101, ld = 128;
  const auto logits = random_floats(rows * ld, 82, -4.0f, 4.0f);
  const std::vector<int32_t> targets{0, 57, 100};
  const auto dloss = random_floats(rows, 83, 0.5f, 1.5f);
  const XentRun run = run_xent(c, logits, rows, ld, vocab, 0, targets, dloss);
  const auto losses = [&](const std::vector<double>& v) {
    return ref_xent(v, rows, ld, vocab, 0, targets, std::vector<double>(rows, 1.0)).loss;
  };
  c.expect_close("dlogits", run.grad, numeric_gradient(losses, to_double(logits), to_double(dloss)),
                 tolerances(DType::f32).finite_difference);
}

// Two shards [0, 50) and [50, 101) with their own (padded) widths: the global max, sum of exps and
// target logit composed over the shards give the full softmax's loss and each shard's gradient.
void check_vocab_shards(CaseContext& c) {
  const backend::Ops& ops = c.ops();
  const int64_t rows = 7, vocab = 101, ld = 128, shard_ld = 64, shard_split = 50;
  const auto logits = random_floats(rows * ld, 84, -6.0f, 6.0f);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>((r * 31 + 7) % vocab);
  targets[0] = 49;
  targets[1] = 50;
  const auto dloss = random_floats(rows, 85, 0.5f, 1.5f);
  const XentReference ref = ref_xent(to_double(logits), rows, ld, vocab, 0, targets, to_double(dloss));
  const int64_t starts[2] = {0, shard_split}, widths[2] = {shard_split, vocab - shard_split};
  const DeviceArray<int32_t> d_targets = c.upload(targets);
  DeviceArray<float> shards[2];
  std::vector<float> maxes[2], target_parts[2];
  for (int s = 0; s < 2; ++s) {
    std::vector<float> shard(rows * shard_ld, 1e30f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < widths[s]; ++col) shard[r * shard_ld + col] = logits[r * ld + starts[s] + col];
    shards[s] = c.upload(shard);
    const DeviceArray<float> max = c.filled(rows, kNaN), target = c.filled(rows, kNaN);
    ops.xent_row_max(shards[s].data, rows, shard_ld, widths[s], max.data, c.stream());
    ops.xent_target_logit(shards[s].data, rows, shard_ld, widths[s], starts[s], d_targets.data, target.data,
                          c.stream());
    maxes[s] = c.download(max, "shard max");
    target_parts[s] = c.download(target, "shard target");
  }
  std::vector<float> global_max(rows), global_sumexp(rows, 0.0f);
  for (int64_t r = 0; r < rows; ++r) global_max[r] = std::max(maxes[0][r], maxes[1][r]);
  const DeviceArray<float> d_global_max = c.upload(global_max);
  for (int s = 0; s < 2; ++s) {
    const DeviceArray<float> sumexp = c.filled(rows, kNaN);
    ops.xent_row_sumexp(shards[s].data, rows, shard_ld, widths[s], d_global_max.data, sumexp.data, c.stream());
    const std::vector<float> part = c.download(sumexp, "shard sumexp");
    for (int64_t r = 0; r < rows; ++r) global_sumexp[r] += part[r];
  }
  std::vector<float> loss(rows);
  for (int64_t r = 0; r < rows; ++r)
    loss[r] = std::log(global_sumexp[r]) + global_max[r] - (target_parts[0][r] + target_parts[1][r]);
  const double tol = tolerances(DType::f32).reference;
  c.expect_close("loss", loss, ref.loss, tol);
  const DeviceArray<float> d_global_sumexp = c.upload(global_sumexp), d_dloss = c.upload(dloss);
  for (int s = 0; s < 2; ++s) {
    ops.xent_backward(shards[s].data, rows, shard_ld, widths[s], starts[s], d_targets.data, d_global_max.data,
                      d_global_sumexp.data, d_dloss.data, c.stream());
    std::vector<double> expected(rows * shard_ld, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < widths[s]; ++col) expected[r * shard_ld + col] = ref.grad[r * ld + starts[s] + col];
    c.expect_close("shard " + std::to_string(s) + " dlogits", c.download(shards[s], "shard dlogits"), expected, tol);
  }
}

// The loss from the global steps: masked row losses summed in fp64 in row order, so the result is
// exactly the sequential sum; without a mask every row counts 1.
void check_loss_sums(CaseContext& c) {
  const int64_t rows = 9;
  const auto max = random_floats(rows, 86, -2.0f, 2.0f), target = random_floats(rows, 87, -4.0f, 1.0f);
  const auto sumexp = random_floats(rows, 88, 1.0f, 50.0f);
  std::vector<float> mask(rows, 1.0f);
  mask[2] = 0.0f;
  mask[5] = 0.25f;
  double loss = 0, tokens = 0;
  for (int64_t r = 0; r < rows; ++r) {
    loss += mask[r] * (std::log(static_cast<double>(sumexp[r])) + max[r] - target[r]);
    tokens += mask[r];
  }
  const DeviceArray<float> d_max = c.upload(max), d_sumexp = c.upload(sumexp), d_target = c.upload(target);
  // The sums are added into device accumulators: from zero they are the micro-batch's sums; from
  // a running total they add the micro-batch's sum (summed from zero first) to it.
  const double start_loss = 0.375, start_tokens = 2;
  const DeviceArray<double> sums = c.upload(std::vector<double>{0, 0, start_loss, start_tokens});
  c.ops().xent_loss_sums(d_max.data, d_sumexp.data, d_target.data, c.upload(mask).data, rows, sums.data,
                         sums.data + 1, c.stream());
  c.ops().xent_loss_sums(d_max.data, d_sumexp.data, d_target.data, c.upload(mask).data, rows, sums.data + 2,
                         sums.data + 3, c.stream());
  const std::vector<double> got = c.download(sums, "loss sums");
  const double loss_sum = got[0], mask_sum = got[1];
  c.expect(loss_sum == loss,
           "loss_sum " + std::to_string(loss_sum) + " is not the row-order sum " + std::to_string(loss));
  c.expect(mask_sum == tokens, "mask_sum " + std::to_string(mask_sum) + ", expected " + std::to_string(tokens));
  c.expect(got[2] == start_loss + loss && got[3] == start_tokens + tokens,
           "the sums were not added to the accumulators' running totals");
  const DeviceArray<double> unmasked = c.filled(2, 0.0);
  c.ops().xent_loss_sums(d_max.data, d_sumexp.data, d_target.data, nullptr, rows, unmasked.data, unmasked.data + 1,
                         c.stream());
  c.expect(c.download(unmasked, "loss sums without a mask")[1] == static_cast<double>(rows),
           "without a mask, mask_sum is not the row count");
}

// The kernels' exp, seen through row_sumexp with one column and max 0: within a few ulp over
// [-87, 88.5], 0 below the range, inf above, NaN for NaN.
void check_exp(CaseContext& c) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.5f; v += 0.0137f) x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  const DeviceArray<float> zeros = c.filled(n, 0.0f), result = c.filled(n, kNaN);
  c.ops().xent_row_sumexp(c.upload(x).data, n, 1, 1, zeros.data, result.data, c.stream());
  const std::vector<float> values = c.download(result, "exp");
  for (int64_t i = 0; i < n; ++i) {
    const double expected = std::exp(static_cast<double>(x[i]));
    if (!(std::abs(values[i] - expected) <= 4e-7 * expected)) {
      return c.fail("exp(" + std::to_string(x[i]) + ") = " + std::to_string(values[i]));
    }
  }
  const std::vector<float> edges{-kInf, -1e30f, -200.0f, -104.0f, 89.0f, 1e30f, kInf, kNaN};
  const DeviceArray<float> edge_result = c.filled(int64_t(edges.size()), 1.0f);
  c.ops().xent_row_sumexp(c.upload(edges).data, int64_t(edges.size()), 1, 1, zeros.data, edge_result.data, c.stream());
  const std::vector<float> edge_values = c.download(edge_result, "exp at the edges");
  for (int i = 0; i < 4; ++i) c.expect(edge_values[i] == 0.0f, "exp(" + std::to_string(edges[i]) + ") is not 0");
  for (int i = 4; i < 7; ++i) c.expect(edge_values[i] == kInf, "exp(" + std::to_string(edges[i]) + ") is not inf");
  c.expect(std::isnan(edge_values[7]), "exp(NaN) is not NaN");
}

}  // namespace

void add_embedding_cases(std::vector<OpCase>& cases) {
  add_embedding_forward(cases);
  add_embedding_backward(cases);
}

void add_cross_entropy_cases(std::vector<OpCase>& cases) {
  add_padded_xent(cases);
  cases.push_back({.op = OpId::xent_backward,
                   .mode = CaseMode::grad,
                   .name = "rows=3 vocab=101 ld=128",
                   .also_uses = {OpId::xent_row_max, OpId::xent_row_sumexp, OpId::xent_target_logit},
                   .body = check_xent_differences});
  cases.push_back({.op = OpId::xent_row_sumexp,
                   .mode = CaseMode::property,
                   .name = "two vocabulary shards compose to the full softmax's loss and gradient, rows=7",
                   .also_uses = {OpId::xent_row_max, OpId::xent_target_logit, OpId::xent_backward},
                   .body = check_vocab_shards});
  cases.push_back({.op = OpId::xent_row_sumexp,
                   .mode = CaseMode::property,
                   .name = "exp within 4e-7 relative over [-87, 88.5]; 0, inf and NaN at the edges",
                   .body = check_exp});
  cases.push_back({.op = OpId::xent_loss_sums,
                   .mode = CaseMode::forward,
                   .name = "masked row losses summed in row order in double into device accumulators, rows=9; no mask counts every row",
                   .body = check_loss_sums});
}

}  // namespace mt::harness

// The backend op table (lib/backend/ops.h) and device memory (lib/backend/memory.h) on the CPU
// backend: every entry is filled (a new entry without a case here fails to compile), every fused
// entry is wired to its own kernels/cpu kernel (bit-equal results on the same inputs), GEMM and
// the conversions against reference loops at odd shapes, copies and fills, and the memory
// ledger's live and peak bytes per category.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "kernels/common/half.h"
#include "kernels/cpu/ops.h"

using namespace mt;
using backend::CopyKind;
using backend::MemoryCategory;
using backend::Ops;

namespace {

const Ops& ops() { return backend::cpu_ops(); }
backend::Stream stream() { return ops().default_stream(); }

std::vector<float> random_floats(size_t n, uint32_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << what << " at " << i;
  }
}

// Forty-seven entries after name, device and synchronous: adding one to Ops without listing it
// below stops this file from compiling.
constexpr size_t kEntries = 47;
static_assert(sizeof(Ops) == offsetof(Ops, allocate) + kEntries * sizeof(void*),
              "a new backend op needs its case in tests/unit/backend/test_backend_ops.cpp");

}  // namespace

TEST(BackendOps, EveryEntryIsFilled) {
  const Ops& o = ops();
  EXPECT_STREQ(o.name, "cpu");
  EXPECT_EQ(o.device, Device::cpu);
  EXPECT_TRUE(o.synchronous);
  const void* entries[] = {
      reinterpret_cast<const void*>(o.allocate), reinterpret_cast<const void*>(o.release),
      reinterpret_cast<const void*>(o.default_stream), reinterpret_cast<const void*>(o.synchronize),
      reinterpret_cast<const void*>(o.launch_host_function), reinterpret_cast<const void*>(o.create_event),
      reinterpret_cast<const void*>(o.destroy_event), reinterpret_cast<const void*>(o.record_event),
      reinterpret_cast<const void*>(o.synchronize_event), reinterpret_cast<const void*>(o.elapsed_seconds),
      reinterpret_cast<const void*>(o.copy), reinterpret_cast<const void*>(o.copy_2d),
      reinterpret_cast<const void*>(o.fill), reinterpret_cast<const void*>(o.zero),
      reinterpret_cast<const void*>(o.convert), reinterpret_cast<const void*>(o.round_through),
      reinterpret_cast<const void*>(o.gemm_operand_type), reinterpret_cast<const void*>(o.gemm),
      reinterpret_cast<const void*>(o.layernorm_forward), reinterpret_cast<const void*>(o.layernorm_backward),
      reinterpret_cast<const void*>(o.rmsnorm_forward), reinterpret_cast<const void*>(o.rmsnorm_backward),
      reinterpret_cast<const void*>(o.gelu_forward), reinterpret_cast<const void*>(o.gelu_backward),
      reinterpret_cast<const void*>(o.swiglu_forward), reinterpret_cast<const void*>(o.swiglu_backward),
      reinterpret_cast<const void*>(o.rope_forward), reinterpret_cast<const void*>(o.rope_backward),
      reinterpret_cast<const void*>(o.attention_forward), reinterpret_cast<const void*>(o.attention_backward),
      reinterpret_cast<const void*>(o.attention_merge),
      reinterpret_cast<const void*>(o.embedding_forward), reinterpret_cast<const void*>(o.embedding_backward),
      reinterpret_cast<const void*>(o.xent_row_max), reinterpret_cast<const void*>(o.xent_row_sumexp),
      reinterpret_cast<const void*>(o.xent_target_logit), reinterpret_cast<const void*>(o.xent_backward),
      reinterpret_cast<const void*>(o.xent_loss_sums), reinterpret_cast<const void*>(o.add_inplace),
      reinterpret_cast<const void*>(o.scale_inplace), reinterpret_cast<const void*>(o.bias_add),
      reinterpret_cast<const void*>(o.bias_backward), reinterpret_cast<const void*>(o.sum_squares),
      reinterpret_cast<const void*>(o.all_finite), reinterpret_cast<const void*>(o.dropout_forward),
      reinterpret_cast<const void*>(o.dropout_backward), reinterpret_cast<const void*>(o.adamw_update),
  };
  static_assert(sizeof(entries) / sizeof(entries[0]) == kEntries);
  for (size_t i = 0; i < kEntries; ++i) EXPECT_NE(entries[i], nullptr) << "entry " << i;
  EXPECT_EQ(o.default_stream().handle, nullptr);  // the CPU runs ops to completion
  o.synchronize(o.default_stream());
}

// Each fused entry against the kernels/cpu kernel of the same name on the same inputs: a table
// entry wired to another kernel (or to another ISA's) would differ.
TEST(BackendOps, FusedEntriesRunTheirOwnCpuKernels) {
  const Ops& o = ops();
  const kernels::cpu::CpuOps& k = kernels::cpu::cpu_ops();
  const backend::Stream s = stream();
  const int64_t rows = 7;
  const int cols = 12;
  const auto x = random_floats(rows * cols, 1), dy = random_floats(rows * cols, 2), w = random_floats(cols, 3);
  const auto b = random_floats(cols, 4);
  auto twice = [](auto&& run, const char* what) {
    auto [first, second] = run();
    expect_bits_equal(first, second, what);
  };

  twice([&] {
    std::vector<float> y1(x.size()), m1(rows), r1(rows), y2(x.size()), m2(rows), r2(rows);
    o.layernorm_forward(x.data(), w.data(), b.data(), y1.data(), m1.data(), r1.data(), rows, cols, 1e-5f, s);
    k.layernorm_forward(x.data(), w.data(), b.data(), y2.data(), m2.data(), r2.data(), rows, cols, 1e-5f);
    y1.insert(y1.end(), r1.begin(), r1.end());
    y2.insert(y2.end(), r2.begin(), r2.end());
    return std::pair{y1, y2};
  }, "layernorm_forward");
  twice([&] {
    std::vector<float> mean(rows, 0.1f), rstd(rows, 1.3f), dx1(x.size()), dw1(cols, 0.5f), db1(cols, 0.25f);
    std::vector<float> dx2 = dx1, dw2 = dw1, db2 = db1;
    o.layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx1.data(), dw1.data(), db1.data(),
                         rows, cols, s);
    k.layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx2.data(), dw2.data(), db2.data(),
                         rows, cols);
    dx1.insert(dx1.end(), dw1.begin(), dw1.end());
    dx1.insert(dx1.end(), db1.begin(), db1.end());
    dx2.insert(dx2.end(), dw2.begin(), dw2.end());
    dx2.insert(dx2.end(), db2.begin(), db2.end());
    return std::pair{dx1, dx2};
  }, "layernorm_backward");
  twice([&] {
    std::vector<float> y1(x.size()), r1(rows), y2(x.size()), r2(rows);
    o.rmsnorm_forward(x.data(), w.data(), y1.data(), r1.data(), rows, cols, 1e-6f, s);
    k.rmsnorm_forward(x.data(), w.data(), y2.data(), r2.data(), rows, cols, 1e-6f);
    y1.insert(y1.end(), r1.begin(), r1.end());
    y2.insert(y2.end(), r2.begin(), r2.end());
    return std::pair{y1, y2};
  }, "rmsnorm_forward");
  twice([&] {
    std::vector<float> rstd(rows, 0.9f), dx1(x.size()), dw1(cols, 0.5f), dx2 = dx1, dw2 = dw1;
    o.rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx1.data(), dw1.data(), rows, cols, s);
    k.rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx2.data(), dw2.data(), rows, cols);
    dx1.insert(dx1.end(), dw1.begin(), dw1.end());
    dx2.insert(dx2.end(), dw2.begin(), dw2.end());
    return std::pair{dx1, dx2};
  }, "rmsnorm_backward");
  twice([&] {
    std::vector<float> y1(x.size()), y2(x.size());
    o.gelu_forward(x.data(), y1.data(), rows * cols, s);
    k.gelu_forward(x.data(), y2.data(), rows * cols);
    return std::pair{y1, y2};
  }, "gelu_forward");
  twice([&] {
    std::vector<float> d1(x.size()), d2(x.size());
    o.gelu_backward(dy.data(), x.data(), d1.data(), rows * cols, s);
    k.gelu_backward(dy.data(), x.data(), d2.data(), rows * cols);
    return std::pair{d1, d2};
  }, "gelu_backward");
  twice([&] {
    std::vector<float> y1(x.size() / 2), y2(x.size() / 2);
    o.swiglu_forward(x.data(), y1.data(), rows, cols / 2, s);
    k.swiglu_forward(x.data(), y2.data(), rows, cols / 2);
    return std::pair{y1, y2};
  }, "swiglu_forward");
  twice([&] {
    std::vector<float> d1(x.size()), d2(x.size());
    o.swiglu_backward(dy.data(), x.data(), d1.data(), rows, cols / 2, s);
    k.swiglu_backward(dy.data(), x.data(), d2.data(), rows, cols / 2);
    return std::pair{d1, d2};
  }, "swiglu_backward");
  const std::vector<int32_t> positions{0, 3, 1, 4, 1, 5, 9};
  twice([&] {
    std::vector<float> a = x, c = x;
    o.rope_forward(a.data(), rows, cols, 3, 4, positions.data(), 10000.0f, s);
    k.rope_forward(c.data(), rows, cols, 3, 4, positions.data(), 10000.0f);
    return std::pair{a, c};
  }, "rope_forward");
  twice([&] {
    std::vector<float> a = x, c = x;
    o.rope_backward(a.data(), rows, cols, 3, 4, positions.data(), 500.0f, s);
    k.rope_backward(c.data(), rows, cols, 3, 4, positions.data(), 500.0f);
    return std::pair{a, c};
  }, "rope_backward");

  // Attention: 1 sample of 7 tokens, 2 query heads over 1 kv head of dim 4 (q, k, v packed).
  kernels::AttentionShape shape;
  shape.q_len = shape.kv_len = static_cast<int>(rows);
  shape.q_heads = 2;
  shape.kv_heads = 1;
  shape.head_dim = 4;
  shape.q_stride = shape.k_stride = shape.v_stride = 16;
  shape.o_stride = 8;
  shape.scale = 0.5f;
  const auto qkv = random_floats(rows * 16, 5), dout = random_floats(rows * 8, 6);
  std::vector<float> out1(rows * 8), lse1(2 * rows), out2(rows * 8), lse2(2 * rows);
  o.attention_forward(shape, qkv.data(), qkv.data() + 8, qkv.data() + 12, nullptr, out1.data(), lse1.data(), s);
  k.attention_forward(shape, qkv.data(), qkv.data() + 8, qkv.data() + 12, nullptr, out2.data(), lse2.data());
  expect_bits_equal(out1, out2, "attention_forward");
  expect_bits_equal(lse1, lse2, "attention_forward lse");
  twice([&] {
    std::vector<float> d1(rows * 16), d2(rows * 16);
    o.attention_backward(shape, qkv.data(), qkv.data() + 8, qkv.data() + 12, nullptr, out1.data(), dout.data(),
                         lse1.data(), d1.data(), d1.data() + 8, d1.data() + 12, s);
    k.attention_backward(shape, qkv.data(), qkv.data() + 8, qkv.data() + 12, nullptr, out2.data(), dout.data(),
                         lse2.data(), d2.data(), d2.data() + 8, d2.data() + 12);
    return std::pair{d1, d2};
  }, "attention_backward");
  twice([&] {
    std::vector<float> merged1 = out1, merged2 = out1, merged_lse1 = lse1, merged_lse2 = lse1;
    o.attention_merge(shape, merged1.data(), merged_lse1.data(), dout.data(), lse2.data(), s);
    k.attention_merge(shape, merged2.data(), merged_lse2.data(), dout.data(), lse2.data());
    merged1.insert(merged1.end(), merged_lse1.begin(), merged_lse1.end());
    merged2.insert(merged2.end(), merged_lse2.begin(), merged_lse2.end());
    return std::pair{merged1, merged2};
  }, "attention_merge");

  const std::vector<int32_t> tokens{2, 5, 0, 9, 3, 5, 7};
  const auto wte = random_floats(10 * cols, 7), wpe = random_floats(10 * cols, 8);
  twice([&] {
    std::vector<float> y1(x.size()), y2(x.size());
    o.embedding_forward(tokens.data(), positions.data(), wte.data(), wpe.data(), y1.data(), rows, cols, 0, 10, s);
    k.embedding_forward(tokens.data(), positions.data(), wte.data(), wpe.data(), y2.data(), rows, cols, 0, 10);
    return std::pair{y1, y2};
  }, "embedding_forward");
  twice([&] {
    std::vector<float> dw1(10 * cols), dp1(10 * cols), dw2(10 * cols), dp2(10 * cols);
    o.embedding_backward(tokens.data(), positions.data(), dy.data(), dw1.data(), dp1.data(), rows, cols, 2, 8, s);
    k.embedding_backward(tokens.data(), positions.data(), dy.data(), dw2.data(), dp2.data(), rows, cols, 2, 8);
    dw1.insert(dw1.end(), dp1.begin(), dp1.end());
    dw2.insert(dw2.end(), dp2.begin(), dp2.end());
    return std::pair{dw1, dw2};
  }, "embedding_backward");

  // Cross-entropy on (rows, 12) logits of which 10 columns are vocabulary.
  const std::vector<float> mask{1, 0, 1, 1, 0.5f, 1, 1};
  std::vector<float> max1(rows), max2(rows), sum1(rows), sum2(rows), target1(rows), target2(rows);
  o.xent_row_max(x.data(), rows, cols, 10, max1.data(), s);
  k.xent_row_max(x.data(), rows, cols, 10, max2.data());
  expect_bits_equal(max1, max2, "xent_row_max");
  o.xent_row_sumexp(x.data(), rows, cols, 10, max1.data(), sum1.data(), s);
  k.xent_row_sumexp(x.data(), rows, cols, 10, max2.data(), sum2.data());
  expect_bits_equal(sum1, sum2, "xent_row_sumexp");
  o.xent_target_logit(x.data(), rows, cols, 10, 0, tokens.data(), target1.data(), s);
  k.xent_target_logit(x.data(), rows, cols, 10, 0, tokens.data(), target2.data());
  expect_bits_equal(target1, target2, "xent_target_logit");
  double loss1 = 0, tokens1 = 0, loss2 = 0, tokens2 = 0;
  o.xent_loss_sums(max1.data(), sum1.data(), target1.data(), mask.data(), rows, &loss1, &tokens1, s);
  k.xent_loss_sums(max2.data(), sum2.data(), target2.data(), mask.data(), rows, &loss2, &tokens2);
  EXPECT_EQ(loss1, loss2);
  EXPECT_EQ(tokens1, 5.5);
  double expected_loss = 0;
  for (int64_t r = 0; r < rows; ++r) expected_loss += mask[r] * (std::log(double(sum1[r])) + max1[r] - target1[r]);
  EXPECT_NEAR(loss1, expected_loss, 1e-12);
  twice([&] {
    std::vector<float> l1 = x, l2 = x;
    o.xent_backward(l1.data(), rows, cols, 10, 0, tokens.data(), max1.data(), sum1.data(), mask.data(), s);
    k.xent_backward(l2.data(), rows, cols, 10, 0, tokens.data(), max2.data(), sum2.data(), mask.data());
    return std::pair{l1, l2};
  }, "xent_backward");

  twice([&] {
    std::vector<float> a = x, c = x;
    o.add_inplace(a.data(), dy.data(), rows * cols, s);
    k.add_inplace(c.data(), dy.data(), rows * cols);
    o.scale_inplace(a.data(), rows * cols, 0.3f, s);
    k.scale_inplace(c.data(), rows * cols, 0.3f);
    o.bias_add(a.data(), b.data(), rows, cols, s);
    k.bias_add(c.data(), b.data(), rows, cols);
    std::vector<float> db1(cols, 1.0f), db2(cols, 1.0f);
    o.bias_backward(dy.data(), db1.data(), rows, cols, s);
    k.bias_backward(dy.data(), db2.data(), rows, cols);
    a.insert(a.end(), db1.begin(), db1.end());
    c.insert(c.end(), db2.begin(), db2.end());
    return std::pair{a, c};
  }, "add_inplace, scale_inplace, bias_add, bias_backward");
  EXPECT_EQ(o.sum_squares(x.data(), rows * cols, s), k.sum_squares(x.data(), rows * cols));
  std::vector<float> with_nan = x;
  with_nan[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(o.all_finite(x.data(), rows * cols, s));
  EXPECT_FALSE(o.all_finite(with_nan.data(), rows * cols, s));

  const std::vector<int64_t> row_ids{10, 11, 12, 40, 41, 42, 43};
  const kernels::DropoutKey key{1, 2, 3, 0.4f};
  twice([&] {
    std::vector<float> a = x, c = x;
    o.dropout_forward(a.data(), rows, cols, row_ids.data(), 5, key, s);
    k.dropout_forward(c.data(), rows, cols, row_ids.data(), 5, key);
    o.dropout_backward(a.data(), rows, cols, row_ids.data(), 0, key, s);
    k.dropout_backward(c.data(), rows, cols, row_ids.data(), 0, key);
    return std::pair{a, c};
  }, "dropout_forward, dropout_backward");
  twice([&] {
    std::vector<float> p1 = x, m1(x.size(), 0.1f), v1(x.size(), 0.2f), p2 = p1, m2 = m1, v2 = v1;
    std::vector<uint16_t> bits1(x.size()), bits2(x.size());
    kernels::AdamWParams params;
    params.lr = 1e-2f;
    params.weight_decay = 0.1f;
    o.adamw_update(p1.data(), bits1.data(), dy.data(), m1.data(), v1.data(), rows * cols, params, s);
    k.adamw_update(p2.data(), bits2.data(), dy.data(), m2.data(), v2.data(), rows * cols, params);
    EXPECT_EQ(bits1, bits2);
    p1.insert(p1.end(), v1.begin(), v1.end());
    p2.insert(p2.end(), v2.begin(), v2.end());
    return std::pair{p1, p2};
  }, "adamw_update");
}

TEST(BackendOps, GemmMatchesReferenceLoopsAtOddShapes) {
  const Ops& o = ops();
  EXPECT_EQ(o.gemm_operand_type(Precision::fp32), DType::f32);
  EXPECT_EQ(o.gemm_operand_type(Precision::fp16), DType::f32);  // fp32 products of fp16-rounded values
  const DType bf16_operands = o.gemm_operand_type(Precision::bf16);
  EXPECT_TRUE(bf16_operands == DType::bf16 || bf16_operands == DType::f32);
  struct Case {
    bool ta, tb;
    int64_t m, n, k;
  };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (const Case& c : {Case{false, true, 37, 29, 53}, Case{false, false, 5, 3, 7}, Case{true, false, 13, 65, 1},
                        Case{true, true, 1, 17, 33}}) {
    SCOPED_TRACE(::testing::Message() << c.ta << c.tb << " " << c.m << "x" << c.n << "x" << c.k);
    const int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
    const int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
    const int64_t lda = a_cols + 3, ldb = b_cols + 2, ldc = c.n + 1;
    std::vector<float> a(a_rows * lda), b(b_rows * ldb), c0(c.m * ldc);
    for (auto* values : {&a, &b, &c0})
      for (float& v : *values) v = dist(rng);
    for (DType operands : {DType::f32, DType::bf16}) {
      // The reference multiplies the operands the GEMM sees: bf16 bits are the rounded values.
      std::vector<uint16_t> a16(a.size()), b16(b.size());
      std::vector<float> ar = a, br = b;
      if (operands == DType::bf16) {
        o.convert(a.data(), DType::f32, a16.data(), DType::bf16, static_cast<int64_t>(a.size()), stream());
        o.convert(b.data(), DType::f32, b16.data(), DType::bf16, static_cast<int64_t>(b.size()), stream());
        for (size_t i = 0; i < a.size(); ++i) ar[i] = kernels::bf16_bits_to_fp32(a16[i]);
        for (size_t i = 0; i < b.size(); ++i) br[i] = kernels::bf16_bits_to_fp32(b16[i]);
      }
      std::vector<float> out = c0;
      const void* pa = operands == DType::bf16 ? static_cast<const void*>(a16.data()) : a.data();
      const void* pb = operands == DType::bf16 ? static_cast<const void*>(b16.data()) : b.data();
      o.gemm(c.ta, c.tb, c.m, c.n, c.k, 0.5f, pa, lda, pb, ldb, 1.5f, out.data(), ldc, operands, stream());
      for (int64_t i = 0; i < c.m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          double sum = 0;
          for (int64_t p = 0; p < c.k; ++p) {
            const double x = c.ta ? ar[p * lda + i] : ar[i * lda + p];
            const double y = c.tb ? br[j * ldb + p] : br[p * ldb + j];
            sum += x * y;
          }
          const double expected = 0.5 * sum + 1.5 * c0[i * ldc + j];
          ASSERT_NEAR(out[i * ldc + j], expected, 1e-4) << dtype_name(operands) << " " << i << "," << j;
        }
    }
  }
  std::vector<float> one(4, 1.0f), result(4);
  EXPECT_THROW(o.gemm(false, false, 2, 2, 2, 1.0f, one.data(), 2, one.data(), 2, 0.0f, result.data(), 2, DType::i32,
                      stream()),
               std::invalid_argument);
}

TEST(BackendOps, ConversionsMatchTheHalfPrecisionHelpers) {
  const Ops& o = ops();
  std::mt19937 rng(13);
  std::vector<float> values(1031);
  for (float& v : values) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  const float specials[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e-8f, -3e-39f,
                            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  for (size_t i = 0; i < std::size(specials); ++i) values[i] = specials[i];
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<uint16_t> bf16(values.size()), fp16(values.size());
  std::vector<float> back(values.size()), rounded(values.size());
  o.convert(values.data(), DType::f32, bf16.data(), DType::bf16, n, stream());
  o.convert(values.data(), DType::f32, fp16.data(), DType::f16, n, stream());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(bf16[i], kernels::fp32_to_bf16_bits(values[i])) << i;
    ASSERT_EQ(fp16[i], kernels::fp32_to_fp16_bits(values[i])) << i;
  }
  o.convert(bf16.data(), DType::bf16, back.data(), DType::f32, n, stream());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(kernels::bf16_bits_to_fp32(bf16[i]))) << i;
  }
  o.convert(fp16.data(), DType::f16, back.data(), DType::f32, n, stream());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(kernels::fp16_bits_to_fp32(fp16[i]))) << i;
  }
  o.round_through(values.data(), rounded.data(), n, DType::bf16, stream());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(rounded[i]), std::bit_cast<uint32_t>(kernels::round_to_bf16(values[i]))) << i;
  }
  o.round_through(values.data(), rounded.data(), n, DType::f16, stream());
  for (size_t i = 0; i < values.size(); ++i) {
    const float expected = kernels::fp16_bits_to_fp32(kernels::fp32_to_fp16_bits(values[i]));
    ASSERT_EQ(std::bit_cast<uint32_t>(rounded[i]), std::bit_cast<uint32_t>(expected)) << i;
  }
  EXPECT_THROW(o.convert(values.data(), DType::f32, back.data(), DType::i32, 4, stream()), std::invalid_argument);
  EXPECT_THROW(o.round_through(values.data(), rounded.data(), 4, DType::f32, stream()), std::invalid_argument);
}

TEST(BackendOps, CopiesFillsAndZero) {
  const Ops& o = ops();
  const auto source = random_floats(5 * 7, 17);
  std::vector<float> copy(source.size());
  o.copy(copy.data(), source.data(), static_cast<int64_t>(source.size() * sizeof(float)), CopyKind::host_to_device,
         stream());
  EXPECT_EQ(copy, source);
  // 5 rows of 3 floats from a pitch of 7 floats into a pitch of 4.
  std::vector<float> packed(5 * 4, -1.0f);
  o.copy_2d(packed.data(), 4 * sizeof(float), source.data(), 7 * sizeof(float), 3 * sizeof(float), 5,
            CopyKind::device_to_host, stream());
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(packed[r * 4 + c], source[r * 7 + c]);
    EXPECT_EQ(packed[r * 4 + 3], -1.0f);  // outside the width: untouched
  }
  std::vector<float> filled(100003, 2.0f);
  o.fill(filled.data(), 100000, 0.75f, stream());
  EXPECT_EQ(filled[0], 0.75f);
  EXPECT_EQ(filled[99999], 0.75f);
  EXPECT_EQ(filled[100000], 2.0f);
  o.zero(filled.data() + 1, 2 * sizeof(float), stream());
  EXPECT_EQ(filled[1], 0.0f);
  EXPECT_EQ(filled[2], 0.0f);
  EXPECT_EQ(filled[3], 0.75f);
}

TEST(BackendMemory, BuffersAreAlignedZeroedAndAccountedPerCategory) {
  backend::MemoryLedger rank;
  backend::MemoryLedger stage(&rank);
  {
    backend::DeviceBuffer<float> weights(ops(), 1000, MemoryCategory::weights, &rank);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(weights.data()) % 64, 0u);
    for (int64_t i = 0; i < weights.size(); ++i) ASSERT_EQ(weights.data()[i], 0.0f);
    EXPECT_EQ(weights.bytes(), 4032);  // 4000 rounded up to 64
    backend::DeviceBuffer<float> first(ops(), 10, MemoryCategory::activations, &stage);
    {
      backend::DeviceBuffer<uint16_t> second(ops(), 100, MemoryCategory::activations, &stage);
      EXPECT_EQ(stage.live(MemoryCategory::activations), 64 + 256);
      backend::DeviceBuffer<uint16_t> moved = std::move(second);  // moving keeps one account
      EXPECT_EQ(stage.live(MemoryCategory::activations), 64 + 256);
    }
    EXPECT_EQ(stage.live(MemoryCategory::activations), 64);
    EXPECT_EQ(stage.peak(MemoryCategory::activations), 64 + 256);
    EXPECT_EQ(stage.live(MemoryCategory::weights), 0);
    // The stage's ledger forwards to the rank's.
    EXPECT_EQ(rank.live(MemoryCategory::activations), 64);
    EXPECT_EQ(rank.peak(MemoryCategory::activations), 320);
    EXPECT_EQ(rank.live(MemoryCategory::weights), 4032);
    EXPECT_EQ(rank.live_total(), 4032 + 64);
    EXPECT_EQ(rank.peak_total(), 4032 + 320);
  }
  EXPECT_EQ(rank.live_total(), 0);
  EXPECT_EQ(rank.peak_total(), 4032 + 320);
  EXPECT_EQ(rank.peak(MemoryCategory::grads), 0);
  EXPECT_STREQ(backend::memory_category_name(MemoryCategory::comm_buffers), "comm_buffers");
  backend::DeviceBuffer<float> empty(ops(), 0, MemoryCategory::grads, &rank);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(rank.live(MemoryCategory::grads), 0);
}

// Cases of the MoE token dispatcher's entries (see op_cases.h; contracts in
// kernels/cpu/moe_permute.h): per-expert counts, the expert-major token-ascending row order with
// its probs, gathers by index, scatter-adds back to token order (empty tokens zero), the dense prob
// grads zero off-route, and chunk reordering with empty chunks, each against plain double loops
// over the routing map, on maps where some tokens are routed nowhere and some experts get no token,
// and at sizes that take the kernels' parallel paths (rerun at another thread count, bit for bit).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "case_helpers.h"
#include "op_cases.h"
#include "reference.h"

namespace mt::harness {
namespace {

// (tokens, experts) routing map: token t picks `topk` distinct experts at random, except that every
// fifth token is routed nowhere (dropped) and the last expert is never chosen when experts > 2.
std::vector<uint8_t> routing_map(int64_t tokens, int experts, int topk, uint32_t seed) {
  std::mt19937 random(seed);
  const int choosable = experts > 2 ? experts - 1 : experts;
  std::vector<uint8_t> map(static_cast<size_t>(tokens * experts), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    if (t % 5 == 4) continue;
    std::vector<int> order(static_cast<size_t>(choosable));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), random);
    for (int i = 0; i < std::min(topk, choosable); ++i) map[t * experts + order[i]] = 1;
  }
  return map;
}

// The reference row order: experts ascending, tokens ascending inside an expert.
struct Rows {
  std::vector<int32_t> token;
  std::vector<int> expert;
  std::vector<int64_t> per_expert;
};
Rows reference_rows(const std::vector<uint8_t>& map, int64_t tokens, int experts) {
  Rows rows;
  rows.per_expert.assign(static_cast<size_t>(experts), 0);
  for (int e = 0; e < experts; ++e)
    for (int64_t t = 0; t < tokens; ++t)
      if (map[t * experts + e]) {
        rows.token.push_back(static_cast<int32_t>(t));
        rows.expert.push_back(e);
        ++rows.per_expert[e];
      }
  return rows;
}

struct MapShape {
  int64_t tokens;
  int experts, topk;
};
const MapShape kMapShapes[] = {{0, 4, 2}, {1, 1, 1}, {7, 4, 2}, {33, 8, 2}, {4099, 8, 3}};

std::string map_name(const MapShape& s) {
  return shape_text({{"tokens", s.tokens}, {"experts", s.experts}, {"topk", s.topk}});
}

void add_routing(std::vector<OpCase>& cases) {
  for (const MapShape& s : kMapShapes) {
    cases.push_back({.op = OpId::moe_expert_counts,
                     .name = map_name(s) + ", ones per expert column, an expert with none",
                     .thread_count_independent = true,
                     .body = [s](CaseContext& c) {
                       const auto map = routing_map(s.tokens, s.experts, s.topk, 300);
                       const DeviceArray<int64_t> counts = c.filled<int64_t>(s.experts, -1);
                       c.ops().moe_expert_counts(c.upload(map).data, s.tokens, s.experts, counts.data, c.stream());
                       c.expect_equal("counts", c.download(counts, "counts"),
                                      reference_rows(map, s.tokens, s.experts).per_expert);
                     }});
    cases.push_back({.op = OpId::moe_route_index,
                     .name = map_name(s) + ", rows expert-major, tokens ascending, their probs",
                     .thread_count_independent = true,
                     .body = [s](CaseContext& c) {
                       const auto map = routing_map(s.tokens, s.experts, s.topk, 301);
                       const auto probs = random_floats(static_cast<size_t>(s.tokens * s.experts), 302, 0.0f, 1.0f);
                       const Rows expected = reference_rows(map, s.tokens, s.experts);
                       const auto n = static_cast<int64_t>(expected.token.size());
                       const DeviceArray<int32_t> token = c.filled<int32_t>(n, -1);
                       const DeviceArray<float> row_probs = c.filled<float>(n, kNaN);
                       c.ops().moe_route_index(c.upload(map).data, c.upload(probs).data, s.tokens, s.experts,
                                               token.data, row_probs.data, c.stream());
                       std::vector<float> expected_probs;
                       for (int64_t r = 0; r < n; ++r)
                         expected_probs.push_back(probs[expected.token[r] * s.experts + expected.expert[r]]);
                       c.expect_equal("row_token", c.download(token, "row_token"), expected.token);
                       c.expect_equal("row_probs", c.download(row_probs, "row_probs"), expected_probs);
                     }});
    cases.push_back({.op = OpId::moe_unroute_probs,
                     .mode = CaseMode::backward,
                     .name = map_name(s) + ", dprobs at the routed (token, expert), zero elsewhere",
                     .thread_count_independent = true,
                     .body = [s](CaseContext& c) {
                       const auto map = routing_map(s.tokens, s.experts, s.topk, 303);
                       const Rows rows = reference_rows(map, s.tokens, s.experts);
                       const auto n = static_cast<int64_t>(rows.token.size());
                       const auto grads = random_floats(static_cast<size_t>(n), 304);
                       const DeviceArray<float> dprobs = c.filled<float>(s.tokens * s.experts, kNaN);
                       c.ops().moe_unroute_probs(c.upload(grads).data, c.upload(rows.token).data,
                                                 c.upload(rows.per_expert).data, s.tokens, s.experts, dprobs.data,
                                                 c.stream());
                       std::vector<float> expected(static_cast<size_t>(s.tokens * s.experts), 0.0f);
                       for (int64_t r = 0; r < n; ++r) expected[rows.token[r] * s.experts + rows.expert[r]] = grads[r];
                       c.expect_equal("dprobs", c.download(dprobs, "dprobs"), expected);
                     }});
  }
}

struct RowShape {
  int64_t rows, out_rows, cols;
};
const RowShape kRowShapes[] = {{0, 3, 5}, {1, 1, 1}, {9, 4, 67}, {600, 150, 67}};

std::string row_name(const RowShape& s) {
  return shape_text({{"rows", s.rows}, {"out_rows", s.out_rows}, {"cols", s.cols}});
}

// Row indices into out_rows rows: repeats (a token's k copies), and the last row never named.
std::vector<int32_t> row_indices(const RowShape& s, uint32_t seed) {
  std::mt19937 random(seed);
  const int64_t named = s.out_rows > 1 ? s.out_rows - 1 : s.out_rows;
  std::vector<int32_t> index(static_cast<size_t>(s.rows));
  for (auto& i : index) i = static_cast<int32_t>(random() % static_cast<uint32_t>(named));
  return index;
}

void add_row_moves(std::vector<OpCase>& cases) {
  for (const RowShape& s : kRowShapes) {
    cases.push_back({.op = OpId::moe_permute_rows,
                     .name = row_name(s) + ", out[r] = in[index[r]] exactly",
                     .thread_count_independent = true,
                     .body = [s](CaseContext& c) {
                       const auto in = random_floats(static_cast<size_t>(s.out_rows * s.cols), 310);
                       const auto index = row_indices(s, 311);
                       const DeviceArray<float> out = c.filled<float>(s.rows * s.cols, kNaN);
                       c.ops().moe_permute_rows(c.upload(in).data, c.upload(index).data, s.rows, s.cols, out.data,
                                                c.stream());
                       std::vector<float> expected;
                       for (int64_t r = 0; r < s.rows; ++r)
                         for (int64_t col = 0; col < s.cols; ++col) expected.push_back(in[index[r] * s.cols + col]);
                       c.expect_equal("out", c.download(out, "out"), expected);
                     }});
    cases.push_back({.op = OpId::moe_unpermute_rows,
                     .mode = CaseMode::backward,
                     .name = row_name(s) + ", out[t] = sum of in[r] with index[r] = t, zero where none",
                     .thread_count_independent = true,
                     .body = [s](CaseContext& c) {
                       const auto in = random_floats(static_cast<size_t>(s.rows * s.cols), 312);
                       const auto index = row_indices(s, 313);
                       const DeviceArray<float> out = c.filled<float>(s.out_rows * s.cols, kNaN);
                       c.ops().moe_unpermute_rows(c.upload(in).data, c.upload(index).data, s.rows, s.cols, out.data,
                                                  s.out_rows, c.stream());
                       std::vector<double> expected(static_cast<size_t>(s.out_rows * s.cols), 0.0);
                       for (int64_t r = 0; r < s.rows; ++r)
                         for (int64_t col = 0; col < s.cols; ++col)
                           expected[index[r] * s.cols + col] += in[r * s.cols + col];
                       const auto actual = c.download(out, "out");
                       c.expect_close("out", actual, expected, tolerances(DType::f32).reference);
                       const int64_t last = s.out_rows - 1;
                       if (s.out_rows > 1)
                         for (int64_t col = 0; col < s.cols; ++col)
                           c.expect(actual[last * s.cols + col] == 0.0f, "out's unnamed last row is not zero");
                     }});
  }
}

void add_chunk_sort(std::vector<OpCase>& cases) {
  // chunk sizes (zeros included) and a permutation, as the dispatcher's [etp][ep][expert] ->
  // [expert][etp][ep] sort makes them.
  for (int chunks : {1, 6, 24})
    for (int64_t cols : {1, 67}) {
      cases.push_back({.op = OpId::moe_sort_chunks,
                       .name = shape_text({{"chunks", chunks}, {"cols", cols}}) + ", chunks reordered exactly",
                       .thread_count_independent = true,
                       .body = [chunks, cols](CaseContext& c) {
                         std::mt19937 random(320 + static_cast<uint32_t>(chunks));
                         std::vector<int64_t> sizes(static_cast<size_t>(chunks));
                         for (int i = 0; i < chunks; ++i) sizes[i] = i % 3 == 1 ? 0 : 1 + random() % 40;
                         std::vector<int32_t> order(static_cast<size_t>(chunks));
                         std::iota(order.begin(), order.end(), 0);
                         std::shuffle(order.begin(), order.end(), random);
                         const int64_t rows = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
                         const auto in = random_floats(static_cast<size_t>(rows * cols), 321);
                         const DeviceArray<float> out = c.filled<float>(rows * cols, kNaN);
                         c.ops().moe_sort_chunks(c.upload(in).data, cols, c.upload(sizes).data, c.upload(order).data,
                                                 chunks, out.data, c.stream());
                         std::vector<int64_t> first(static_cast<size_t>(chunks) + 1, 0);
                         for (int i = 0; i < chunks; ++i) first[i + 1] = first[i] + sizes[i];
                         std::vector<float> expected;
                         for (int j = 0; j < chunks; ++j)
                           for (int64_t r = first[order[j]]; r < first[order[j] + 1]; ++r)
                             for (int64_t col = 0; col < cols; ++col) expected.push_back(in[r * cols + col]);
                         c.expect_equal("out", c.download(out, "out"), expected);
                       }});
    }
}

}  // namespace

void add_moe_permute_cases(std::vector<OpCase>& cases) {
  add_routing(cases);
  add_row_moves(cases);
  add_chunk_sort(cases);
}

}  // namespace mt::harness

// A toy MoE dispatch problem shared by the token dispatcher's suites (threads as ranks:
// tests/unit/model/test_token_dispatcher.cpp; MPI ranks: tests/mpi/test_token_dispatcher.cpp):
// global tokens split over EP x ETP source ranks (source s = etp + ETP ep holds tokens
// [s S, (s+1) S)), a top-k routing map with chosen gaps (experts never chosen, a source whose tokens
// are all dropped), a toy expert (expert e's output row is (e + 1) p x, an etp rank's share of it
// under ETP), and the reference over all tokens by plain double loops:
//   y[t] = sum over routed e of (e + 1) p[t,e] x[t];  dx[t] = sum over routed e of (e + 1) p[t,e] dy[t];
//   dprobs[t,e] = (e + 1) x[t] . dy[t] where routed, else 0.
// run_dispatch_rank runs one rank's dispatch, experts, combine and both backwards on any op
// table, moving values only through the table's copies.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "model/moe/token_dispatcher.h"

namespace mt::testing {

struct DispatchProblem {
  int experts = 8, topk = 2;
  int64_t hidden = 5, tokens_per_source = 13;
  int sources = 1;             // EP x ETP
  std::vector<float> x, dy;    // (sources S, C)
  std::vector<float> probs;    // (sources S, E), zero off-route
  std::vector<uint8_t> map;    // (sources S, E)
  int64_t tokens() const { return sources * tokens_per_source; }
};

// Token t picks topk distinct experts among those not in `never_chosen`; every token of source
// `silent_source` (-1: none) is routed nowhere, as is every seventh token.
inline DispatchProblem make_dispatch_problem(int experts, int topk, int64_t hidden, int64_t tokens_per_source,
                                             int sources, const std::set<int>& never_chosen, int silent_source,
                                             uint32_t seed) {
  DispatchProblem p;
  p.experts = experts;
  p.topk = topk;
  p.hidden = hidden;
  p.tokens_per_source = tokens_per_source;
  p.sources = sources;
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), positive(0.05f, 1.0f);
  const int64_t n = p.tokens();
  p.x.resize(static_cast<size_t>(n * hidden));
  p.dy.resize(p.x.size());
  for (auto& v : p.x) v = uniform(random);
  for (auto& v : p.dy) v = uniform(random);
  p.probs.assign(static_cast<size_t>(n * experts), 0.0f);
  p.map.assign(p.probs.size(), 0);
  std::vector<int> choosable;
  for (int e = 0; e < experts; ++e)
    if (!never_chosen.count(e)) choosable.push_back(e);
  for (int64_t t = 0; t < n; ++t) {
    if (t / tokens_per_source == silent_source || t % 7 == 6) continue;
    std::shuffle(choosable.begin(), choosable.end(), random);
    for (int i = 0; i < std::min<int>(topk, static_cast<int>(choosable.size())); ++i) {
      p.map[t * experts + choosable[i]] = 1;
      p.probs[t * experts + choosable[i]] = positive(random);
    }
  }
  return p;
}

struct DispatchReference {
  std::vector<double> y, dx, dprobs;
};

inline DispatchReference dispatch_reference(const DispatchProblem& p) {
  DispatchReference ref;
  const int64_t n = p.tokens(), c = p.hidden;
  ref.y.assign(static_cast<size_t>(n * c), 0.0);
  ref.dx.assign(ref.y.size(), 0.0);
  ref.dprobs.assign(static_cast<size_t>(n * p.experts), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int e = 0; e < p.experts; ++e) {
      if (!p.map[t * p.experts + e]) continue;
      const double scale = (e + 1.0) * p.probs[t * p.experts + e];
      double dot = 0;
      for (int64_t j = 0; j < c; ++j) {
        ref.y[t * c + j] += scale * p.x[t * c + j];
        ref.dx[t * c + j] += scale * p.dy[t * c + j];
        dot += double{p.x[t * c + j]} * p.dy[t * c + j];
      }
      ref.dprobs[t * p.experts + e] = (e + 1.0) * dot;
    }
  return ref;
}

// An etp rank's share of every expert output (the shares sum to 1): 1 alone; 1/4 and 3/4 at ETP 2
// (unequal, so a reduce-scatter that adds the wrong pieces shows); 1/ETP otherwise.
inline float etp_share(int etp, int etp_size) {
  if (etp_size == 1) return 1.0f;
  if (etp_size == 2) return etp == 0 ? 0.25f : 0.75f;
  return 1.0f / static_cast<float>(etp_size);
}

// One rank's results and what its experts received.
struct DispatchRankResult {
  std::vector<float> y, dx, dprobs;            // (S, C), (S, C), (S, E)
  std::vector<float> expert_rows, expert_probs;  // (R, C), (R)
  std::vector<int64_t> tokens_per_local_expert;
};

// `n` elements of host memory in a new device buffer of `ops` (the host values must stay alive
// until the stream has run the copy).
template <typename T>
backend::DeviceBuffer<T> to_device(const backend::Ops& ops, const T* host, int64_t n) {
  backend::DeviceBuffer<T> buffer(ops, n, backend::MemoryCategory::activations);
  if (n > 0) ops.copy(buffer.data(), host, n * static_cast<int64_t>(sizeof(T)), backend::CopyKind::host_to_device,
                      ops.default_stream());
  return buffer;
}
template <typename T>
std::vector<T> to_host(const backend::Ops& ops, const T* device, int64_t n) {
  std::vector<T> values(static_cast<size_t>(n));
  if (n > 0) ops.copy(values.data(), device, n * static_cast<int64_t>(sizeof(T)), backend::CopyKind::device_to_host,
                      ops.default_stream());
  ops.synchronize(ops.default_stream());
  return values;
}

// A source's inputs in device memory (kept until its backward has run).
struct DispatchInputs {
  backend::DeviceBuffer<float> x, probs, dy;
  backend::DeviceBuffer<uint8_t> map;
};

// Source `source`'s dispatch, on the dispatcher's table `ops` and its default stream.
inline DispatchInputs dispatch_source(const backend::Ops& ops, model::TokenDispatcher& dispatcher,
                                      const DispatchProblem& p, int source, model::DispatchState& state) {
  const int64_t s = p.tokens_per_source, first = source * s;
  DispatchInputs in{to_device(ops, p.x.data() + first * p.hidden, s * p.hidden),
                    to_device(ops, p.probs.data() + first * p.experts, s * p.experts),
                    to_device(ops, p.dy.data() + first * p.hidden, s * p.hidden),
                    to_device(ops, p.map.data() + first * p.experts, s * p.experts)};
  dispatcher.dispatch(in.x.data(), in.probs.data(), in.map.data(), s, state);
  return in;
}

// After source `source`'s dispatch into `state`: the toy experts (on the host), combine,
// combine_backward, the toy experts' backward, dispatch_backward; every result read back through
// the table's copies.
inline DispatchRankResult finish_dispatch_rank(const backend::Ops& ops, model::TokenDispatcher& dispatcher,
                                               const DispatchProblem& p, const DispatchInputs& in, float share,
                                               const model::DispatchState& state) {
  const int64_t s = p.tokens_per_source, c = p.hidden;
  const int64_t rows = state.rows();
  DispatchRankResult out;
  out.expert_rows = to_host(ops, state.expert_rows(), rows * c);
  out.expert_probs = to_host(ops, state.expert_probs(), rows);
  out.tokens_per_local_expert = state.tokens_per_local_expert();
  // The toy experts: row r of local expert l -> (e + 1) share p_r x_r.
  std::vector<float> expert_of(static_cast<size_t>(rows));
  for (int64_t l = 0, r = 0; l < static_cast<int64_t>(out.tokens_per_local_expert.size()); ++l)
    for (int64_t i = 0; i < out.tokens_per_local_expert[l]; ++i, ++r)
      expert_of[r] = static_cast<float>(dispatcher.first_local_expert() + l + 1) * share;
  std::vector<float> expert_out(static_cast<size_t>(rows * c));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < c; ++j)
      expert_out[r * c + j] = expert_of[r] * out.expert_probs[r] * out.expert_rows[r * c + j];
  const auto expert_out_device = to_device(ops, expert_out.data(), rows * c);
  backend::DeviceBuffer<float> y(ops, s * c, backend::MemoryCategory::activations);
  dispatcher.combine(state, expert_out_device.data(), y.data());
  out.y = to_host(ops, y.data(), s * c);

  backend::DeviceBuffer<float> d_out_device(ops, rows * c, backend::MemoryCategory::activations);
  dispatcher.combine_backward(state, in.dy.data(), d_out_device.data());
  const std::vector<float> d_out = to_host(ops, d_out_device.data(), rows * c);
  std::vector<float> d_rows(d_out.size()), d_probs(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    float dot = 0;
    for (int64_t j = 0; j < c; ++j) {
      d_rows[r * c + j] = expert_of[r] * out.expert_probs[r] * d_out[r * c + j];
      dot += out.expert_rows[r * c + j] * d_out[r * c + j];
    }
    d_probs[r] = expert_of[r] * dot;
  }
  const auto d_rows_device = to_device(ops, d_rows.data(), rows * c);
  const auto d_probs_device = to_device(ops, d_probs.data(), rows);
  backend::DeviceBuffer<float> dx(ops, s * c, backend::MemoryCategory::activations);
  backend::DeviceBuffer<float> dprobs(ops, s * p.experts, backend::MemoryCategory::activations);
  dispatcher.dispatch_backward(state, d_rows_device.data(), d_probs_device.data(), dx.data(), dprobs.data());
  out.dx = to_host(ops, dx.data(), s * c);
  out.dprobs = to_host(ops, dprobs.data(), s * p.experts);
  return out;
}

inline DispatchRankResult run_dispatch_rank(const backend::Ops& ops, model::TokenDispatcher& dispatcher,
                                            const DispatchProblem& p, int source, float share,
                                            model::DispatchState& state) {
  const DispatchInputs in = dispatch_source(ops, dispatcher, p, source, state);
  return finish_dispatch_rank(ops, dispatcher, p, in, share, state);
}

// The global tokens of rank (ep, etp)'s expert rows, in the contract's order: local expert, then
// source etp, then source ep, tokens ascending.
inline std::vector<int64_t> expected_expert_tokens(const DispatchProblem& p, int ep, int etp_size, int ep_size) {
  const int local = p.experts / ep_size;
  std::vector<int64_t> tokens;
  for (int l = 0; l < local; ++l)
    for (int i = 0; i < etp_size; ++i)
      for (int q = 0; q < ep_size; ++q) {
        const int64_t first = (i + etp_size * q) * p.tokens_per_source;
        for (int64_t t = first; t < first + p.tokens_per_source; ++t)
          if (p.map[t * p.experts + ep * local + l]) tokens.push_back(t);
      }
  return tokens;
}

// |actual - expected| <= tol (1 + |expected|) everywhere, first miss reported.
inline void expect_near_all(const char* what, const std::vector<float>& actual, const double* expected, size_t n,
                            double tol) {
  ASSERT_EQ(actual.size(), n) << what;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_LE(std::fabs(actual[i] - expected[i]), tol * (1.0 + std::fabs(expected[i])))
        << what << "[" << i << "] = " << actual[i] << ", expected " << expected[i];
  }
}

// Rank (ep, etp) of an EP x ETP layout against the reference: its expert rows are x's rows in the
// contract's order with their probs, and its y, dx, dprobs are the reference's rows of its tokens.
inline void check_dispatch_rank(const DispatchProblem& p, const DispatchReference& ref, const DispatchRankResult& got,
                                int ep, int etp, int ep_size, int etp_size) {
  const int64_t c = p.hidden, s = p.tokens_per_source;
  const int source = etp + etp_size * ep;
  const int local = p.experts / ep_size;
  const std::vector<int64_t> tokens = expected_expert_tokens(p, ep, etp_size, ep_size);
  ASSERT_EQ(got.expert_probs.size(), tokens.size()) << "rows at ep " << ep << " etp " << etp;
  int64_t r = 0;
  for (int l = 0; l < local; ++l) {
    int64_t routed = 0;
    for (int64_t t = 0; t < p.tokens(); ++t) routed += p.map[t * p.experts + ep * local + l];
    ASSERT_EQ(got.tokens_per_local_expert[l], routed) << "tokens of local expert " << l;
    for (int64_t i = 0; i < got.tokens_per_local_expert[l]; ++i, ++r) {
      const int64_t t = tokens[static_cast<size_t>(r)];
      ASSERT_EQ(got.expert_probs[r], p.probs[t * p.experts + ep * local + l]) << "prob of row " << r;
      for (int64_t j = 0; j < c; ++j) ASSERT_EQ(got.expert_rows[r * c + j], p.x[t * c + j]) << "row " << r;
    }
  }
  const size_t first = static_cast<size_t>(source * s);
  expect_near_all("y", got.y, ref.y.data() + first * c, static_cast<size_t>(s * c), 1e-6);
  expect_near_all("dx", got.dx, ref.dx.data() + first * c, static_cast<size_t>(s * c), 1e-6);
  expect_near_all("dprobs", got.dprobs, ref.dprobs.data() + first * p.experts, static_cast<size_t>(s * p.experts),
                  1e-5);
}

}  // namespace mt::testing

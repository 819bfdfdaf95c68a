// Grouped GEMMs on the CPU (see grouped_gemm.h). Every group's output is cut into tiles of at
// most kTileRows x kTileCols, a cut that depends on the shapes only; the tiles of all groups are
// shared among the OpenMP threads, and each tile is one single-threaded oneDNN GEMM over the
// group's whole depth (oneDNN runs sequentially inside a parallel region). So each output element
// is computed by the same GEMM whatever the thread count, and the result does not depend on it
// (the plain gemm entry splits the depth over threads for some shapes). Small groups fill the
// threads together instead of one multi-threaded call each. A ragged-depth group of depth 0
// scales its output by beta here, since a GEMM of no depth is not one every library defines.
#include "kernels/cpu/grouped_gemm.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace mt::kernels::cpu {
namespace {

constexpr int64_t kTileRows = 128;
constexpr int64_t kTileCols = 256;

// One tile of one group's output: rows [row, row + rows) and columns [col, col + cols) of C_g.
struct Tile {
  int64_t group, row, rows, col, cols;
};

// The tiles of an (m, n) output of group `group`, appended in row-major tile order.
void add_tiles(std::vector<Tile>& tiles, int64_t group, int64_t m, int64_t n) {
  for (int64_t row = 0; row < m; row += kTileRows)
    for (int64_t col = 0; col < n; col += kTileCols) {
      tiles.push_back({group, row, std::min(kTileRows, m - row), col, std::min(kTileCols, n - col)});
    }
}

// Runs `work(tile)` for every tile on the OpenMP threads; the first exception is rethrown here.
template <typename Work>
void run_tiles(const std::vector<Tile>& tiles, const Work& work) {
  std::exception_ptr error;
  const int64_t count = static_cast<int64_t>(tiles.size());
#pragma omp parallel for schedule(dynamic, 1) if (count > 1)
  for (int64_t t = 0; t < count; ++t) {
    try {
      work(tiles[t]);
    } catch (...) {
#pragma omp critical(mt_grouped_gemm_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// The first row of each group (the prefix sums of the counts).
std::vector<int64_t> group_starts(int64_t groups, const int64_t* counts) {
  std::vector<int64_t> starts(static_cast<size_t>(groups));
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    starts[g] = row;
    row += counts[g];
  }
  return starts;
}

// C (rows, cols) = beta C with row stride ldc; beta = 0 writes zeros (not 0 * C, which keeps NaNs).
void scale_output(float* c, int64_t rows, int64_t cols, int64_t ldc, float beta) {
  if (beta == 1.0f) return;
  for (int64_t i = 0; i < rows; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) {
      std::memset(row, 0, static_cast<size_t>(cols) * sizeof(float));
    } else {
      for (int64_t j = 0; j < cols; ++j) row[j] *= beta;
    }
  }
}

template <typename T, typename Gemm>
void ragged_rows(Gemm gemm, bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                 const T* a, int64_t lda, const T* b, int64_t ldb, int64_t b_stride, float beta, float* c,
                 int64_t ldc) {
  const std::vector<int64_t> starts = group_starts(groups, group_rows);
  std::vector<Tile> tiles;
  for (int64_t g = 0; g < groups; ++g) add_tiles(tiles, g, group_rows[g], n);
  run_tiles(tiles, [&](const Tile& t) {
    const int64_t row = starts[t.group] + t.row;
    const T* b_tile = b + t.group * b_stride + (trans_b ? t.col * ldb : t.col);  // op(B_g)'s columns
    gemm(false, trans_b, t.rows, t.cols, k, alpha, a + row * lda, lda, b_tile, ldb, beta, c + row * ldc + t.col, ldc);
  });
}

template <typename T, typename Gemm>
void ragged_depth(Gemm gemm, int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha, const T* a,
                  int64_t lda, const T* b, int64_t ldb, float beta, float* c, int64_t ldc, int64_t c_stride) {
  const std::vector<int64_t> starts = group_starts(groups, group_depths);
  std::vector<Tile> tiles;
  for (int64_t g = 0; g < groups; ++g) add_tiles(tiles, g, m, n);
  run_tiles(tiles, [&](const Tile& t) {
    float* out = c + t.group * c_stride + t.row * ldc + t.col;
    const int64_t depth = group_depths[t.group], first = starts[t.group];
    if (depth == 0) return scale_output(out, t.rows, t.cols, ldc, beta);
    gemm(true, false, t.rows, t.cols, depth, alpha, a + first * lda + t.row, lda, b + first * ldb + t.col, ldb, beta,
         out, ldc);
  });
}

}  // namespace

void grouped_gemm_f32(bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, int64_t b_stride, float beta, float* c,
                      int64_t ldc) {
  ragged_rows(gemm_f32, trans_b, groups, group_rows, n, k, alpha, a, lda, b, ldb, b_stride, beta, c, ldc);
}

void grouped_gemm_bf16(bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                       const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, int64_t b_stride, float beta,
                       float* c, int64_t ldc) {
  ragged_rows(gemm_bf16, trans_b, groups, group_rows, n, k, alpha, a, lda, b, ldb, b_stride, beta, c, ldc);
}

void grouped_gemm_ragged_k_f32(int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha,
                               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                               int64_t ldc, int64_t c_stride) {
  ragged_depth(gemm_f32, groups, group_depths, m, n, alpha, a, lda, b, ldb, beta, c, ldc, c_stride);
}

void grouped_gemm_ragged_k_bf16(int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha,
                                const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
                                int64_t ldc, int64_t c_stride) {
  ragged_depth(gemm_bf16, groups, group_depths, m, n, alpha, a, lda, b, ldb, beta, c, ldc, c_stride);
}

}  // namespace mt::kernels::cpu

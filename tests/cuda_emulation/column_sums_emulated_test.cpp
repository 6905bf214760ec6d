// The column-sum kernels' own text (trainer/cuda/column_sums_kernels.cuh: bias gradients and
// LayerNorm's weight and bias gradients), compiled for the CPU against cuda_emulation.h and run on
// emulated blocks of 1024 threads. Checked bit for bit against the order the header states (each
// lane's rows in order, then the lanes by the fixed tree), written out here as plain loops, and
// against a double-precision sum; tails of columns and fewer rows than lanes included, fp32 and
// bf16 inputs. (On a GPU nvcc may fuse LayerNorm's products into FMAs, so there the sums match the
// CPU reference to kernels_test's tolerance, not these bits; this checks the indexing and barriers.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "../test_util.h"
#include "cuda_emulation.h"

namespace column_sums_emulated {
namespace {

template <typename T>
float ld(const T* p, int64_t i) {
  return float(p[i]);
}

#include "cuda/column_sums_kernels.cuh"

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The header's order for one column: lane y sums rows y, y + L, ... (its values as value(n)), then
// lane y + s is added into lane y for s = L/2 .. 1.
template <typename F>
float ordered_sum(int64_t rows, int lanes, F value) {
  std::vector<float> lane(size_t(lanes), 0.0f);
  for (int y = 0; y < lanes; ++y)
    for (int64_t r = y; r < rows; r += lanes) lane[size_t(y)] += value(r);
  for (int s = lanes / 2; s > 0; s >>= 1)
    for (int y = 0; y < s; ++y) lane[size_t(y)] += lane[size_t(y + s)];
  return lane[0];
}


std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> y;
  for (float v : x) y.push_back(__float2bfloat16_rn(v));
  return y;
}

template <typename T>
void check_column_sums(const std::vector<T>& in, int64_t rows, int64_t cols) {
  constexpr int L = kColLanes<T>;
  std::vector<float> sums = zt::test::normal_values(size_t(cols), 7);  // accumulated into
  const std::vector<float> before = sums;
  cuda_emulation::launch({column_blocks<T>(cols), 1, 1}, kColThreads, 0,
                         [&] { column_sums_kernel<T>(sums.data(), in.data(), rows, cols); });
  for (int64_t c = 0; c < cols; ++c) {
    const float want = before[size_t(c)] + ordered_sum(rows, L, [&](int64_t r) { return float(in[size_t(r * cols + c)]); });
    EXPECT_EQ(bits(sums[size_t(c)]), bits(want)) << "column " << c << ": " << sums[size_t(c)] << " vs " << want;
    double exact = before[size_t(c)];
    for (int64_t r = 0; r < rows; ++r) exact += float(in[size_t(r * cols + c)]);
    EXPECT_NEAR(sums[size_t(c)], exact, 1e-5 * (1.0 + std::sqrt(double(rows)))) << "column " << c;
  }
}

}  // namespace
}  // namespace column_sums_emulated

using namespace column_sums_emulated;

TEST(ColumnSumsEmulated, Fp32AndBf16WithTailsAndFewRows) {
  EXPECT_EQ(kColWidth<float>, 8);
  EXPECT_EQ(kColLanes<float>, 128);
  EXPECT_EQ(kColWidth<__nv_bfloat16>, 16);
  EXPECT_EQ(kColLanes<__nv_bfloat16>, 64);
  // 21 columns: blocks of 8, the last with 5; 300 rows: lanes with 2 or 3 rows each.
  check_column_sums(zt::test::normal_values(300 * 21, 1), 300, 21);
  // Fewer rows than lanes: most lanes add nothing.
  check_column_sums(zt::test::normal_values(5 * 9, 2), 5, 9);
  // bf16: blocks of 16 columns (37: 16 + 16 + 5).
  check_column_sums(to_bf16(zt::test::normal_values(150 * 37, 3)), 150, 37);
}

namespace column_sums_emulated {
namespace {

// LayerNorm's parameter gradients over N rows of C columns of T (dout, inp; mean and rstd fp32).
template <typename T>
void check_layernorm_params(int64_t N, int64_t C) {
  const std::vector<float> dout_f = zt::test::normal_values(size_t(N * C), 4), inp_f = zt::test::normal_values(size_t(N * C), 5);
  std::vector<T> dout, inp;
  for (size_t i = 0; i < dout_f.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      dout.push_back(dout_f[i]);
      inp.push_back(inp_f[i]);
    } else {
      dout.push_back(__float2bfloat16_rn(dout_f[i]));
      inp.push_back(__float2bfloat16_rn(inp_f[i]));
    }
  }
  std::vector<float> mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += float(inp[size_t(n * C + c)]);
    m /= double(C);
    for (int64_t c = 0; c < C; ++c) v += (float(inp[size_t(n * C + c)]) - m) * (float(inp[size_t(n * C + c)]) - m);
    mean[size_t(n)] = float(m);
    rstd[size_t(n)] = float(1.0 / std::sqrt(v / double(C) + 1e-5));
  }
  std::vector<float> dw = zt::test::normal_values(size_t(C), 6), db = zt::test::normal_values(size_t(C), 8);
  const std::vector<float> dw0 = dw, db0 = db;
  cuda_emulation::launch({column_blocks<T>(C), 1, 1}, kColThreads, 0, [&] {
    layernorm_backward_params_kernel<T>(dw.data(), db.data(), dout.data(), inp.data(), mean.data(), rstd.data(), N, C);
  });
  constexpr int L = kColLanes<T>;
  for (int64_t c = 0; c < C; ++c) {
    const auto at = [&](int64_t n) { return size_t(n * C + c); };
    const auto term = [&](int64_t n) {
      return (float(inp[at(n)]) - mean[size_t(n)]) * rstd[size_t(n)] * float(dout[at(n)]);
    };
    const float want_w = dw0[size_t(c)] + ordered_sum(N, L, term);
    const float want_b = db0[size_t(c)] + ordered_sum(N, L, [&](int64_t n) { return float(dout[at(n)]); });
    EXPECT_EQ(bits(dw[size_t(c)]), bits(want_w)) << "dw column " << c;
    EXPECT_EQ(bits(db[size_t(c)]), bits(want_b)) << "db column " << c;
    double exact_w = dw0[size_t(c)], exact_b = db0[size_t(c)];  // and near the sums in double
    for (int64_t n = 0; n < N; ++n) {
      exact_w += term(n);
      exact_b += float(dout[at(n)]);
    }
    EXPECT_NEAR(dw[size_t(c)], exact_w, 1e-5 * (1.0 + std::sqrt(double(N)))) << "dw column " << c;
    EXPECT_NEAR(db[size_t(c)], exact_b, 1e-5 * (1.0 + std::sqrt(double(N)))) << "db column " << c;
  }
}

}  // namespace
}  // namespace column_sums_emulated

TEST(ColumnSumsEmulated, LayerNormParameterGradients) {
  check_layernorm_params<float>(260, 19);
  check_layernorm_params<__nv_bfloat16>(90, 21);  // blocks of 16 columns, 64 lanes
}

// model::flash_attention_* (the tiled, bf16-multiplying attention that the CUDA kernels follow)
// against the fp32 reference attention of model/kernels.h, on shapes with one tile, several
// tiles and a last partial tile, for the head sizes the kernels take (16, 32, 64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/flash_attention.h"
#include "model/kernels.h"
#include "../../test_util.h"
#include "model_test_util.h"

namespace zt::model {
namespace {

using testing::max_diff;

struct Shape {
  int64_t B, T, C, H;
  std::string text() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) + " H=" + std::to_string(H);
  }
};

// About twice the largest errors measured on these shapes (forward 7.0e-3 of the tensor's scale,
// backward 1.5e-2, lse 0.017 absolute): bf16 inputs carry 8 bits, and the probabilities and
// score gradients are rounded to bf16 too before their products.
constexpr double kForwardTol = 1.5e-2;
constexpr double kBackwardTol = 3e-2;

class FlashAttention : public ::testing::TestWithParam<Shape> {};

TEST_P(FlashAttention, ForwardAndLogSumExpMatchTheReference) {
  const Shape s = GetParam();
  const int64_t N = s.B * s.T, hs = s.C / s.H;
  // sd 1.5: scores with a spread like a trained model's (|s * scale| up to ~5), so the softmax is
  // peaked in some rows and flat in others.
  std::vector<float> qkv = zt::test::normal_values(N * 3 * s.C, 7, 1.5f);
  std::vector<float> ref(size_t(N * s.C)), att(size_t(s.B * s.H * s.T * s.T));
  kernels::attention_forward(ref.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.H);
  std::vector<float> out(size_t(N * s.C), -1.0f), lse(size_t(s.B * s.H * s.T), -1.0f);
  flash_attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.H);
  const auto d = max_diff(out.data(), ref.data(), N * s.C);
  EXPECT_LE(d.rel, kForwardTol) << s.text() << ": worst element " << d.at << ", |diff| " << d.abs;

  // lse = log sum over t2 <= t of exp(q.k * scale), in double from the fp32 inputs.
  const float scale = 1.0f / std::sqrt(float(hs));
  double worst = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const float* q = qkv.data() + (b * s.T + t) * 3 * s.C + h * hs;
        double mx = -INFINITY;
        std::vector<double> sc(size_t(t + 1));
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv.data() + (b * s.T + t2) * 3 * s.C + s.C + h * hs;
          double dot = 0;
          for (int64_t i = 0; i < hs; ++i) dot += double(q[i]) * k[i];
          sc[size_t(t2)] = dot * scale;
          mx = std::max(mx, sc[size_t(t2)]);
        }
        double sum = 0;
        for (double x : sc) sum += std::exp(x - mx);
        worst = std::max(worst, std::fabs(lse[size_t((b * s.H + h) * s.T + t)] - (mx + std::log(sum))));
      }
  EXPECT_LE(worst, 0.05) << s.text() << ": the log-sum-exp of the scaled scores";
}

TEST_P(FlashAttention, BackwardMatchesTheReference) {
  const Shape s = GetParam();
  const int64_t N = s.B * s.T;
  std::vector<float> qkv = zt::test::normal_values(N * 3 * s.C, 11, 1.5f);
  std::vector<float> dout = zt::test::normal_values(N * s.C, 12, 1.0f);
  std::vector<float> y(size_t(N * s.C)), att(size_t(s.B * s.H * s.T * s.T)), scratch(size_t(s.B * s.H * s.T));
  std::vector<float> ref(size_t(N * 3 * s.C));
  kernels::attention_forward(y.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.H);
  kernels::attention_backward(ref.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.H);

  std::vector<float> out(size_t(N * s.C)), lse(size_t(s.B * s.H * s.T)), dsum(size_t(s.B * s.H * s.T));
  std::vector<float> dqkv(size_t(N * 3 * s.C), -1.0f);
  flash_attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.H);
  flash_attention_backward(dqkv.data(), dsum.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C,
                           s.H);
  // q, k and v separately: each has its own scale.
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got, want;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < s.C; ++c) {
        got.push_back(dqkv[size_t(n * 3 * s.C + part * s.C + c)]);
        want.push_back(ref[size_t(n * 3 * s.C + part * s.C + c)]);
      }
    const auto d = max_diff(got.data(), want.data(), int64_t(got.size()));
    EXPECT_LE(d.rel, kBackwardTol) << s.text() << ": d" << "qkv"[part] << ", worst element " << d.at << ", |diff| "
                                   << d.abs;
  }
}

// With one key the softmax is constant (P = 1, out = v), so the scores, and with them q and k, get
// no gradient: dsum must round dout as the product dP = dout V^T does, or dq and dk come out as
// dout's rounding error (1e-2 of dv's scale when dsum used fp32 dout).
TEST(FlashAttentionOneKey, QueriesAndKeysGetNoGradient) {
  const int64_t B = 2, T = 1, C = 64, H = 2;
  const std::vector<float> qkv = zt::test::normal_values(B * T * 3 * C, 41, 1.5f);
  const std::vector<float> dout = zt::test::normal_values(B * T * C, 42);
  std::vector<float> out(size_t(B * T * C)), lse(size_t(B * H * T)), dsum(size_t(B * H * T));
  std::vector<float> dqkv(size_t(B * T * 3 * C), 123.0f);
  flash_attention_forward(out.data(), lse.data(), qkv.data(), B, T, C, H);
  flash_attention_backward(dqkv.data(), dsum.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, H);
  double dv_scale = 0, dqk_worst = 0;
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = 0; c < C; ++c) {
      dqk_worst = std::max({dqk_worst, double(std::fabs(dqkv[size_t(n * 3 * C + c)])),
                            double(std::fabs(dqkv[size_t(n * 3 * C + C + c)]))});
      dv_scale = std::max(dv_scale, double(std::fabs(dqkv[size_t(n * 3 * C + 2 * C + c)])));
    }
  EXPECT_GT(dv_scale, 0.5);  // dv = dout: the values do get a gradient
  EXPECT_LE(dqk_worst, 1e-6 * dv_scale) << "dq/dk with a single key";
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttention,
                         ::testing::Values(Shape{2, 100, 128, 2},  // head size 64, a full and a partial tile
                                           Shape{1, 64, 32, 2},    // head size 16, exactly one tile
                                           Shape{2, 130, 64, 2},   // head size 32, three tiles
                                           Shape{1, 1, 64, 1},     // one token
                                           Shape{1, 200, 192, 3}));  // head size 64, four tiles, three heads

}  // namespace
}  // namespace zt::model

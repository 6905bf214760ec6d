// Finite-difference check of the analytic gradient of EVERY parameter tensor of the GPT-2
// reference, with and without activation checkpointing.
//
// Method: fp32 forward, central differences with a 4-point (Richardson) stencil
//   g ~ (8 (f(p+h) - f(p-h)) - (f(p+2h) - f(p-2h))) / (12 h),  h = 1e-2,
// whose truncation error is O(h^4), so what is left is the fp32 rounding noise of the loss
// (~1e-7 relative) divided by h. Tolerance per sampled element:
//   |fd - analytic| <= 5e-5 + 2e-3 * |analytic|
// Measured: worst |fd - analytic| = 2.1e-5, worst error / tolerance = 0.34 (printed by the test).
// A real bug (a missing term, a wrong factor, a transposed index) is >= 10% of the gradient.
// Each tensor is sampled at its first and last elements and 6 random ones.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "model_test_util.h"

namespace zt::model {
namespace {

using testing::random_params;
using testing::random_tokens;
using testing::small_config;

constexpr int kB = 2, kT = 5;

struct FdResult {
  double worst_abs = 0;     // max |fd - analytic|
  double worst_excess = 0;  // max |fd - analytic| / tolerance (must stay <= 1)
  int checked = 0;
};

void check_gradients(bool checkpoint) {
  const Config config = small_config();
  std::vector<float> params = random_params(config, 7);
  const std::vector<int32_t> tokens = random_tokens(config, kB * kT, 11);
  const std::vector<int32_t> targets = random_tokens(config, kB * kT, 12);
  Workspace ws(config, kB, kT, checkpoint);
  std::vector<float> grads(params.size(), 0.0f);
  forward_backward(ws, params.data(), tokens.data(), targets.data(), grads.data());

  auto loss_at = [&](int64_t i, float value) {
    const float saved = params[(size_t)i];
    params[(size_t)i] = value;
    const float loss = forward(ws, params.data(), tokens.data(), targets.data());
    params[(size_t)i] = saved;
    return (double)loss;
  };

  const float h = 1e-2f;
  std::mt19937_64 rng(3);
  FdResult total;
  for (const ParamSpec& p : param_table(config)) {
    std::set<int64_t> sample = {0, p.numel - 1};
    while ((int64_t)sample.size() < std::min<int64_t>(8, p.numel)) sample.insert((int64_t)(rng() % (uint64_t)p.numel));
    FdResult r;
    for (int64_t e : sample) {
      const int64_t i = p.offset + e;
      const float x = params[(size_t)i];
      // The step actually representable in fp32 around x (differs from h by ~1e-6 relative).
      const float xp1 = x + h, xm1 = x - h, xp2 = x + 2 * h, xm2 = x - 2 * h;
      const double d1 = loss_at(i, xp1) - loss_at(i, xm1);
      const double d2 = loss_at(i, xp2) - loss_at(i, xm2);
      const double step = ((double)xp1 - (double)xm1) / 2.0;
      const double fd = (8 * d1 - d2) / (12.0 * step);
      const double analytic = grads[(size_t)i];
      const double err = std::fabs(fd - analytic);
      const double tol = 5e-5 + 2e-3 * std::fabs(analytic);
      EXPECT_LE(err, tol) << p.name << "[" << e << "]: finite difference " << fd << " vs analytic "
                          << analytic << (checkpoint ? " (checkpointing)" : "");
      r.worst_abs = std::max(r.worst_abs, err);
      r.worst_excess = std::max(r.worst_excess, err / tol);
      r.checked++;
    }
    total.worst_abs = std::max(total.worst_abs, r.worst_abs);
    total.worst_excess = std::max(total.worst_excess, r.worst_excess);
    total.checked += r.checked;
  }
  std::printf("finite differences%s: %d elements in %zu tensors, worst |fd - analytic| = %.3g, "
              "worst error / tolerance = %.3f\n",
              checkpoint ? " (checkpointing)" : "", total.checked, param_table(config).size(),
              total.worst_abs, total.worst_excess);
}

TEST(GradientCheck, EveryTensorMatchesFiniteDifferences) { check_gradients(false); }

TEST(GradientCheck, EveryTensorMatchesFiniteDifferencesWithCheckpointing) { check_gradients(true); }

TEST(GradientCheck, CheckpointingGivesBitIdenticalGradients) {
  const Config config = small_config();
  const std::vector<float> params = random_params(config, 21);
  const std::vector<int32_t> tokens = random_tokens(config, kB * kT, 22);
  const std::vector<int32_t> targets = random_tokens(config, kB * kT, 23);
  Workspace plain(config, kB, kT, false), ckpt(config, kB, kT, true);
  std::vector<float> g_plain(params.size(), 0.0f), g_ckpt(params.size(), 0.0f);
  const float l_plain = forward_backward(plain, params.data(), tokens.data(), targets.data(), g_plain.data());
  const float l_ckpt = forward_backward(ckpt, params.data(), tokens.data(), targets.data(), g_ckpt.data());
  EXPECT_EQ(l_plain, l_ckpt);
  EXPECT_TRUE(testing::bit_identical(g_plain, g_ckpt));
  EXPECT_LT(ckpt.bytes_kept(), plain.bytes_kept());
}

TEST(GradientCheck, RepeatedRunsAreBitIdentical) {
  const Config config = small_config();
  const std::vector<float> params = random_params(config, 31);
  const std::vector<int32_t> tokens = random_tokens(config, kB * kT, 32);
  const std::vector<int32_t> targets = random_tokens(config, kB * kT, 33);
  Workspace ws(config, kB, kT, false);
  std::vector<float> first(params.size(), 0.0f), second(params.size(), 0.0f);
  const float l1 = forward_backward(ws, params.data(), tokens.data(), targets.data(), first.data());
  const float l2 = forward_backward(ws, params.data(), tokens.data(), targets.data(), second.data());
  EXPECT_EQ(l1, l2);
  EXPECT_TRUE(testing::bit_identical(first, second));
}

}  // namespace
}  // namespace zt::model

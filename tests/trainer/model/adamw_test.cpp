// The reference AdamW against values derived by hand from torch.optim.AdamW's update rule
// (adamw.h). Its agreement with PyTorch itself over 5 steps is checked in torch_parity_test.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/adamw.h"

namespace zt::model {
namespace {

TEST(AdamW, FirstStepMovesByLrTimesTheSignAfterDecay) {
  // Step 1 with zero moments: m_hat = g and v_hat = g^2, so the update is lr * g / (|g| + eps).
  const double lr = 1e-3, wd = 0.1, eps = 1e-8;
  std::vector<float> p = {0.5f, -0.25f, 1.0f, 0.0f}, g = {0.3f, -2.0f, 1e-3f, 0.0f};
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  adamw_step(p.data(), g.data(), m.data(), v.data(), 4, lr, 0.9, 0.999, eps, wd, 1);
  const double decay = 1.0 - 1e-3 * 0.1;
  EXPECT_NEAR(p[0], 0.5 * decay - 1e-3, 1e-7);
  EXPECT_NEAR(p[1], -0.25 * decay + 1e-3, 1e-7);
  EXPECT_NEAR(p[2], 1.0 * decay - 1e-3 * (1e-3 / (1e-3 + 1e-8)), 1e-7);
  EXPECT_EQ(p[3], 0.0f);  // zero gradient: no update, and decay of zero is zero
  EXPECT_NEAR(m[1], -0.2f, 1e-7);
  EXPECT_NEAR(v[1], 0.004f, 1e-9);
}

TEST(AdamW, SecondStepUsesBiasCorrectedMoments) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.0;
  std::vector<float> p = {1.0f}, m = {0.0f}, v = {0.0f};
  const float g1 = 0.5f, g2 = -1.5f;
  adamw_step(p.data(), &g1, m.data(), v.data(), 1, lr, b1, b2, eps, wd, 1);
  adamw_step(p.data(), &g2, m.data(), v.data(), 1, lr, b1, b2, eps, wd, 2);
  // By hand, in double.
  double pd = 1.0 - 1e-2;  // first step: lr * sign(g1)
  const double md = 0.9 * (0.1 * 0.5) + 0.1 * -1.5;
  const double vd = 0.95 * (0.05 * 0.25) + 0.05 * 2.25;
  pd -= 1e-2 / (1 - 0.81) * md / (std::sqrt(vd) / std::sqrt(1 - 0.9025) + 1e-8);
  EXPECT_NEAR(m[0], md, 1e-7);
  EXPECT_NEAR(v[0], vd, 1e-7);
  EXPECT_NEAR(p[0], pd, 1e-6);
}

TEST(AdamW, WeightDecayIsDecoupledFromTheGradient) {
  // With zero gradients only the decay acts: p *= (1 - lr * wd) per step, unlike L2-in-gradient
  // Adam, where the decay would be normalized into a full lr-sized step.
  std::vector<float> p = {2.0f}, g = {0.0f}, m = {0.0f}, v = {0.0f};
  for (int step = 1; step <= 10; step++) adamw_step(p.data(), g.data(), m.data(), v.data(), 1, 0.1, 0.9, 0.999, 1e-8, 0.5, step);
  EXPECT_NEAR(p[0], 2.0 * std::pow(1.0 - 0.05, 10), 1e-6);
}

}  // namespace
}  // namespace zt::model

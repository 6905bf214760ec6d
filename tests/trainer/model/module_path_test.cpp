// The per-module entry points (what the ZeRO-3 engine calls, one module's parameters at a time)
// against the whole-model functions; gradient accumulation; the workspace's accounting and checks.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "model_test_util.h"

namespace zt::model {
namespace {

using testing::random_params;
using testing::random_tokens;
using testing::small_config;

constexpr int kB = 2, kT = 6;

// Runs one micro-step the way the ZeRO-3 engine will: each module's parameters copied into a
// buffer of their own (as if fetched), its gradients into a buffer of its own, distinct dx buffers
// (the whole-model path runs its backward in place), then the gradient buffers scattered back.
float per_module_step(Workspace& ws, const std::vector<float>& params, const int32_t* tokens,
                      const int32_t* targets, std::vector<float>& grads) {
  const Config& config = ws.config();
  const std::vector<ModuleSpec> modules = module_table(config);
  const int L = (int)config.layers;
  std::vector<std::vector<float>> p(modules.size()), g(modules.size());
  for (size_t m = 0; m < modules.size(); m++) {
    p[m].assign(params.begin() + modules[m].offset, params.begin() + modules[m].offset + modules[m].numel);
    g[m].assign(grads.begin() + modules[m].offset, grads.begin() + modules[m].offset + modules[m].numel);
  }
  const size_t act = (size_t)ws.B() * ws.T() * config.width;
  std::vector<std::vector<float>> x((size_t)L + 1, std::vector<float>(act));
  const float* wte = p[0].data() + embedding_offsets(config).wte;
  float* dwte = g[0].data() + embedding_offsets(config).wte;
  embed_forward(ws, p[0].data(), tokens, x[0].data());
  for (int l = 0; l < L; l++) block_forward(ws, l, p[(size_t)l + 1].data(), x[(size_t)l].data(), x[(size_t)l + 1].data());
  std::vector<float> dx_a(act), dx_b(act);
  const float loss = head_forward_backward(ws, p.back().data(), wte, x.back().data(), targets, dx_a.data(),
                                           g.back().data(), dwte);
  for (int l = L - 1; l >= 0; l--) {
    block_backward(ws, l, p[(size_t)l + 1].data(), x[(size_t)l].data(), dx_a.data(), dx_b.data(), g[(size_t)l + 1].data());
    std::swap(dx_a, dx_b);
  }
  embed_backward(ws, tokens, dx_a.data(), g[0].data());
  for (size_t m = 0; m < modules.size(); m++) std::copy(g[m].begin(), g[m].end(), grads.begin() + modules[m].offset);
  return loss;
}

class ModulePath : public ::testing::TestWithParam<bool> {};

TEST_P(ModulePath, PerModuleEqualsWholeModelBitForBit) {
  const bool checkpoint = GetParam();
  const Config config = small_config();
  const std::vector<float> params = random_params(config, 41);
  const std::vector<int32_t> tokens = random_tokens(config, kB * kT, 42);
  const std::vector<int32_t> targets = random_tokens(config, kB * kT, 43);
  Workspace ws(config, kB, kT, checkpoint);
  std::vector<float> whole(params.size(), 0.0f), modular(params.size(), 0.0f);
  const float l_whole = forward_backward(ws, params.data(), tokens.data(), targets.data(), whole.data());
  const float l_mod = per_module_step(ws, params, tokens.data(), targets.data(), modular);
  EXPECT_EQ(l_whole, l_mod);
  EXPECT_TRUE(testing::bit_identical(whole, modular));
  // Not vacuous: every tensor got a non-zero gradient.
  for (const ParamSpec& p : param_table(config)) {
    double norm = 0;
    for (int64_t i = 0; i < p.numel; i++) norm += std::fabs(whole[(size_t)(p.offset + i)]);
    EXPECT_GT(norm, 0.0) << p.name;
  }
}

TEST_P(ModulePath, TwoMicroStepsAccumulateToTheSum) {
  const bool checkpoint = GetParam();
  const Config config = small_config();
  const std::vector<float> params = random_params(config, 51);
  const std::vector<int32_t> tok1 = random_tokens(config, kB * kT, 52), tgt1 = random_tokens(config, kB * kT, 53);
  const std::vector<int32_t> tok2 = random_tokens(config, kB * kT, 54), tgt2 = random_tokens(config, kB * kT, 55);
  Workspace ws(config, kB, kT, checkpoint);
  std::vector<float> g1(params.size(), 0.0f), g2(params.size(), 0.0f), acc(params.size(), 0.0f);
  forward_backward(ws, params.data(), tok1.data(), tgt1.data(), g1.data());
  forward_backward(ws, params.data(), tok2.data(), tgt2.data(), g2.data());
  forward_backward(ws, params.data(), tok1.data(), tgt1.data(), acc.data());
  per_module_step(ws, params, tok2.data(), tgt2.data(), acc);  // the per-module path accumulates too
  std::vector<float> sum(params.size());
  for (size_t i = 0; i < sum.size(); i++) sum[i] = g1[i] + g2[i];
  // Not bit-exact by design: sgemm adds a product into the existing gradient in K-blocks, so the
  // rounding differs from adding two finished gradients; 1e-6 of the tensor's scale bounds it.
  for (const ParamSpec& p : param_table(config)) {
    const testing::MaxDiff d = testing::max_diff(acc.data() + p.offset, sum.data() + p.offset, p.numel);
    EXPECT_LE(d.rel, 1e-6) << p.name;
    const testing::MaxDiff single = testing::max_diff(acc.data() + p.offset, g1.data() + p.offset, p.numel);
    EXPECT_GT(single.rel, 1e-3) << p.name << ": the second micro-step added nothing";
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpointing, ModulePath, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "On" : "Off"; });

TEST(ModulePathScale, GradScaleOfAPowerOfTwoScalesEveryGradientExactly) {
  const Config config = small_config();
  const std::vector<float> params = random_params(config, 61);
  const std::vector<int32_t> tokens = random_tokens(config, kB * kT, 62), targets = random_tokens(config, kB * kT, 63);
  Workspace ws(config, kB, kT, false);
  std::vector<float> g(params.size(), 0.0f), half(params.size(), 0.0f);
  const float l1 = forward_backward(ws, params.data(), tokens.data(), targets.data(), g.data());
  const float l2 = forward_backward(ws, params.data(), tokens.data(), targets.data(), half.data(), 0.5f);
  EXPECT_EQ(l1, l2);  // the loss is reported unscaled
  for (float& x : g) x *= 0.5f;
  EXPECT_TRUE(testing::bit_identical(g, half));
}

TEST(ModulePathHead, LogitsLossAndChunkingAgree) {
  const Config config = small_config();
  const std::vector<float> params = random_params(config, 71);
  const std::vector<int32_t> tokens = random_tokens(config, kB * kT, 72), targets = random_tokens(config, kB * kT, 73);
  Workspace ws(config, kB, kT, false);
  std::vector<float> logits((size_t)kB * kT * config.vocab);
  const float loss = forward(ws, params.data(), tokens.data(), targets.data(), logits.data());
  // The loss is the mean cross-entropy of the returned logits.
  double expected = 0;
  for (int n = 0; n < kB * kT; n++) {
    const float* row = logits.data() + (size_t)n * config.vocab;
    double s = 0;
    for (int64_t i = 0; i < config.vocab; i++) s += std::exp((double)row[i]);
    expected += std::log(s) - row[targets[(size_t)n]];
  }
  EXPECT_NEAR(loss, expected / (kB * kT), 1e-6);
  EXPECT_TRUE(std::isnan(forward(ws, params.data(), tokens.data(), nullptr)));

  // The LM head in chunks of 5 rows (12 rows: chunks 5, 5, 2) gives the same loss and gradients.
  Workspace chunked(config, kB, kT, false, 5);
  std::vector<float> g(params.size(), 0.0f), gc(params.size(), 0.0f);
  const float l = forward_backward(ws, params.data(), tokens.data(), targets.data(), g.data());
  const float lc = forward_backward(chunked, params.data(), tokens.data(), targets.data(), gc.data());
  EXPECT_NEAR(l, lc, 1e-6);
  const testing::MaxDiff d = testing::max_diff(gc.data(), g.data(), (int64_t)g.size());
  EXPECT_LE(d.rel, 1e-6);
}

TEST(ModuleWorkspace, AccountsForWhatItKeeps) {
  const Config config = small_config();
  const int64_t N = kB * kT, C = config.width, L = config.layers;
  // Per block cache: ln1, atty, res2, ln2 [N, C]; qkv [N, 3C]; fch, fch_gelu [N, 4C]; 4 row stats
  // [N]; att [B, H, T, T]. Plus L + 1 residual streams [N, C]. Buffers round up to 16 floats.
  const int64_t per_block_floats = 15 * N * C + 4 * N + (int64_t)kB * config.heads * kT * kT;
  const int64_t residual_floats = (L + 1) * N * C;
  Workspace plain(config, kB, kT, false), ckpt(config, kB, kT, true);
  const int64_t slack = 16 * 4 * 20 * (L + 2);  // rounding of at most ~20 buffers per block
  EXPECT_GE((int64_t)plain.bytes_kept(), 4 * (L * per_block_floats + residual_floats));
  EXPECT_LE((int64_t)plain.bytes_kept(), 4 * (L * per_block_floats + residual_floats) + slack);
  EXPECT_GE((int64_t)ckpt.bytes_kept(), 4 * (per_block_floats + residual_floats));
  EXPECT_LE((int64_t)ckpt.bytes_kept(), 4 * (per_block_floats + residual_floats) + slack);
  EXPECT_EQ(plain.bytes(), plain.bytes_kept() + plain.bytes_scratch());
  EXPECT_EQ(plain.bytes_scratch(), ckpt.bytes_scratch());
}

TEST(ModuleWorkspace, RefusesImpossibleShapesWithAReason) {
  const Config config = small_config();
  EXPECT_TRUE(Workspace::check(config, 2, 8).ok());
  Status s = Workspace::check(config, 2, 9);
  EXPECT_NE(s.message().find("T = 9 is outside 1..8"), std::string::npos) << s.message();
  s = Workspace::check(config, 0, 4);
  EXPECT_NE(s.message().find("B = 0"), std::string::npos) << s.message();
  Config bad = config;
  bad.heads = 3;
  s = Workspace::check(bad, 2, 4);
  EXPECT_NE(s.message().find("not divisible by heads 3"), std::string::npos) << s.message();
  EXPECT_THROW(Workspace(config, 2, 9, false), std::invalid_argument);
}

TEST(ModuleTokens, OutOfRangeIdsAreNamed) {
  const Config config = small_config();
  const std::vector<int32_t> good = {0, 5, 31};
  EXPECT_TRUE(check_tokens(config, good.data(), 3, "tokens").ok());
  const std::vector<int32_t> bad = {0, 32, 1};
  const Status s = check_tokens(config, bad.data(), 3, "targets");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("targets[1] = 32 is outside the vocabulary 0..31"), std::string::npos) << s.message();
  const std::vector<int32_t> negative = {-1};
  EXPECT_FALSE(check_tokens(config, negative.data(), 1, "tokens").ok());
}

}  // namespace
}  // namespace zt::model

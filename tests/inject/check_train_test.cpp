// zt check on real training runs: eleven clean, seeded runs of the tiny model over several epochs
// (stages 0-3, optimizer and parameter offload, a partial one, 1 and 2 ranks, fp32/bf16/fp16) must pass every
// default check: no leak found where there is none, nothing misplaced, every planned step run.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "../trainer/traced_run.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "zt/check/check.h"
#include "zt/probe/recorder.h"

using namespace zt;

namespace {

struct Variant {
  const char* name;
  uint64_t seed;
  int world;
  int stage;
  bool offload_optimizer, offload_param;
  const char* precision;
  int grad_accum;
  int epochs;
  bool activation_checkpointing = false;
  bool save_checkpoints = false;
  double offload_ratio = 1.0;  // a partial optimizer offload: the first modules' states on the GPU
};

const Variant kVariants[] = {
    {"z0_w1_fp32", 1, 1, 0, false, false, "fp32", 1, 3},
    {"z2_offopt_w1_bf16", 2, 1, 2, true, false, "bf16", 1, 3},
    {"z3_offboth_w2_bf16", 3, 2, 3, true, true, "bf16", 1, 3},
    {"z3_offboth_w2_accum2_ckpt", 4, 2, 3, true, true, "fp32", 2, 3, false, true},
    {"z1_w2_fp16", 5, 2, 1, false, false, "fp16", 1, 3},
    {"z3_w1_actckpt", 6, 1, 3, false, false, "fp32", 1, 3, true},
    {"z3_offopt_w2_4epochs", 7, 2, 3, true, false, "fp32", 1, 4},
    {"z2_offopt_w2_bf16_2epochs", 8, 2, 2, true, false, "bf16", 1, 2},
    {"z3_offparam_w1", 9, 1, 3, false, true, "bf16", 1, 3},
    {"z3_offboth_w2_noreuse_actckpt", 10, 2, 3, true, true, "bf16", 1, 3, true},
    {"z3_offboth_ratio05_w2_bf16", 11, 2, 3, true, true, "bf16", 1, 2, false, false, 0.5},
};

class CleanRun : public ::testing::TestWithParam<Variant> {};

}  // namespace

TEST_P(CleanRun, PassesEveryDefaultCheck) {
  const Variant& v = GetParam();
  test::TempDir dir;
  trainer::TrainConfig c = test::tiny_run(0);  // GPT-2 tiny, 2 sequences of 32 tokens; epochs below
  c.synthetic_bytes = 800;  // a few steps per epoch: 24 samples of 33 tokens
  c.seed = v.seed;
  c.world_size = v.world;
  c.zero.stage = v.stage;
  c.zero.offload_optimizer = v.offload_optimizer;
  c.zero.offload_param = v.offload_param;
  c.zero.offload_ratio = v.offload_ratio;
  c.zero.param_persistence_threshold = 0;  // shard every module of the tiny model, so shards are staged
  if (std::string(v.name).find("noreuse") != std::string::npos) c.zero.max_reuse_distance = 0;
  c.precision = v.precision;
  c.grad_accum = v.grad_accum;
  c.epochs = v.epochs;
  c.activation_checkpointing = v.activation_checkpointing;
  if (v.save_checkpoints) {
    c.checkpoint_dir = dir.file("ckpt");
    c.save_every = 2;
  }
  c.quiet = true;

  const std::string path = dir.file("run.db");
  test::TracedRun run = test::train_traced(c, path);  // with the config, as zt train writes it
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  const trainer::TrainSummary& summary = run.summary;
  ASSERT_GE(summary.plan.steps_per_epoch, 2);
  ASSERT_LE(summary.plan.steps_per_epoch, 16);  // keeps the test small
  ASSERT_EQ(summary.epochs_started, v.epochs);

  check::Report r;
  Status s = check::run_checks(path, check::Options{}, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  const std::string text = check::format_text(r);
  ASSERT_EQ(r.checks.size(), 4u) << text;
  for (auto& k : r.checks) {
    EXPECT_EQ(k.outcome, check::Outcome::Pass) << k.name << " on " << v.name << ":\n" << text;  // not skipped either
    EXPECT_TRUE(k.findings.empty()) << text;
  }
  EXPECT_NE(text.find("over " + std::to_string(v.epochs) + " epochs"), std::string::npos) << text;

  // The budget on the same real trace: generous passes, tight fails naming the rank 0 GPU.
  check::Options b;
  b.budget = check::Budget{int64_t(80) << 30, int64_t(900) << 30};
  ASSERT_TRUE(check::run_checks(path, b, &r).ok());
  EXPECT_FALSE(r.failed()) << check::format_text(r);
  b.budget = check::Budget{int64_t(64) << 10, std::nullopt};
  ASSERT_TRUE(check::run_checks(path, b, &r).ok());
  ASSERT_TRUE(r.failed());
  EXPECT_EQ(r.checks.at(0).findings.size(), size_t(v.world)) << check::format_text(r);
  EXPECT_EQ(r.checks.at(0).findings.at(0).rfind("rank 0 cuda:0: peak allocated ", 0), 0u) << check::format_text(r);
}

INSTANTIATE_TEST_SUITE_P(Seeded, CleanRun, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& i) { return std::string(i.param.name); });

// The host.epoch_leak fault on the tiny model keeps about 320 KiB of pinned buffers per epoch and
// rank: under the absolute 512 KiB it passed, though it is a quarter of the rank's pinned memory.
// The default threshold is 1% of a memory smaller than 50 MiB (64 KiB at least): it is caught; an
// explicit --leak-threshold of 512 KiB still lets it pass.
TEST(LeakingRun, TheTinyEpochLeakIsCaughtByTheDefaultThreshold) {
  test::TempDir dir;
  trainer::TrainConfig c = test::tiny_run(0);
  c.synthetic_bytes = 800;
  c.world_size = 2;
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.zero.offload_param = true;
  c.zero.param_persistence_threshold = 0;
  c.precision = "bf16";
  c.epochs = 3;
  c.faults = {"host.epoch_leak=return(pinned)"};
  c.quiet = true;
  const std::string path = dir.file("leak.db");
  test::TracedRun run = test::train_traced(c, path);
  ASSERT_TRUE(run.status.ok()) << run.status.message();

  check::Options leaks;
  leaks.leaks = true;
  check::Report r;
  ASSERT_TRUE(check::run_checks(path, leaks, &r).ok());
  const std::string text = check::format_text(r);
  ASSERT_TRUE(r.failed()) << text;
  EXPECT_NE(text.find("pinned host memory: live bytes at epoch "), std::string::npos) << text;
  EXPECT_NE(text.find("this memory's threshold: "), std::string::npos) << text;

  leaks.leak_threshold = check::kLeakThresholdMax;
  ASSERT_TRUE(check::run_checks(path, leaks, &r).ok());
  EXPECT_FALSE(r.failed()) << check::format_text(r);
}

// A partial offload whose run died while placing its model states (virtual 124M, ratio 0.5, a GPU of
// 900 MiB: out of memory in setup) left only the first modules' states in the trace: --placement
// counts the modules from the run's config (zero_optimization.sub_groups: 14), so the 7 the ratio
// keeps on the accelerator are allowed there, not judged against the few the trace happens to name.
TEST(PartialOffloadRun, PlacementCountsTheModulesFromTheConfig) {
  test::TempDir dir;
  trainer::TrainConfig c = test::tiny_run(2);
  c.model = "124M";
  c.virtual_mode = true;
  c.data_samples = 1000;
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.zero.offload_ratio = 0.5;
  c.device_memory = uint64_t(900) << 20;
  c.quiet = true;
  const std::string path = dir.file("died.db");
  test::TracedRun run = test::train_traced(c, path);
  ASSERT_FALSE(run.status.ok());
  EXPECT_NE(run.status.message().find("CUDA out of memory"), std::string::npos) << run.status.message();
  ASSERT_NE(run.reader, nullptr);
  EXPECT_GT(test::query_int(*run.reader, "SELECT count(*) FROM allocation_v WHERE name = 'adam.m[block0]' AND device = "
                                         "'cuda:0'"),
            0);
  EXPECT_EQ(test::query_int(*run.reader, "SELECT json_extract(config_json, '$.zero_optimization.sub_groups') FROM run"),
            14);
  check::Options o;
  o.placement = true;
  check::Report r;
  ASSERT_TRUE(check::run_checks(path, o, &r).ok());
  ASSERT_EQ(r.checks.size(), 1u);
  EXPECT_EQ(r.checks[0].outcome, check::Outcome::Pass) << check::format_text(r);
}

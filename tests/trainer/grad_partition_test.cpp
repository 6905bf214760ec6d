// grad_partition_dtype compute (train/train_config.h): under offload_optimizer at ZeRO stage 2-3 the
// host gradient partitions stay in the compute dtype as they land from the device, and CPU AdamW
// widens them (and applies the unscale-and-clip factor) in its own pass. Checked: the losses are the
// fp32 partitions' bit for bit (stages, ranks, bf16/fp16 with loss scaling and skipped steps,
// clipping, accumulation, offload_param, the delayed and the overlapped update); the trace holds
// the bf16 partitions at half the fp32 ones' bytes and no staging buffers, and less pinned memory;
// bad settings are refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../test_util.h"
#include "traced_run.h"
#include "train/trainer.h"
#include "zt/db/trace_reader.h"

using namespace zt::trainer;

using zt::test::query_int;

TEST(GradPartitionDtype, LossesAreTheFp32PartitionsBitForBit) {
  struct Case {
    int stage, world;
    const char* precision;
    bool off_param = false;
    int64_t delayed = -1;
    bool overlap = false;
  };
  for (const Case& k : {Case{2, 1, "bf16"}, Case{2, 2, "fp16"}, Case{3, 2, "bf16", true}, Case{3, 1, "fp16", true},
                        Case{3, 2, "bf16", false, 1}, Case{3, 1, "bf16", true, -1, true}, Case{2, 2, "fp16", false, -1, true},
                        Case{3, 4, "bf16"}}) {
    SCOPED_TRACE("stage " + std::to_string(k.stage) + ", " + std::to_string(k.world) + " ranks, " + k.precision +
                 (k.off_param ? ", offload_param" : "") +
                 (k.delayed >= 0 ? ", delayed_update " + std::to_string(k.delayed) : "") +
                 (k.overlap ? ", overlap_update" : ""));
    TrainConfig c = zt::test::tiny_run(8);
    c.zero.stage = k.stage;
    c.world_size = k.world;
    c.precision = k.precision;
    c.zero.offload_optimizer = true;
    c.zero.offload_param = k.off_param;
    c.delayed_update = k.delayed;
    c.overlap_update = k.overlap;
    c.grad_accum = 2;
    c.grad_clip = 0.5;  // active on tiny: AdamW applies the clip factor to the bf16/fp16 partitions
    if (std::string(k.precision) == "fp16") {
      c.zero.initial_scale_power = 20;  // overflows first (skipped steps), then the unscale factor
      c.zero.hysteresis = 1;
      c.zero.loss_scale_window = 1;
    }
    const std::vector<double> want = zt::test::train_losses(c);
    c.grad_partition_dtype = "compute";
    const std::vector<double> got = zt::test::train_losses(c);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;
  }
}

// The clip factor really reaches AdamW: with clipping the losses differ from those without (so the
// test above compares runs that scale their gradients), in both dtypes alike.
TEST(GradPartitionDtype, TheClipFactorChangesTheRun) {
  TrainConfig c = zt::test::tiny_run(4);
  c.zero.stage = 3;
  c.precision = "bf16";
  c.zero.offload_optimizer = true;
  c.grad_partition_dtype = "compute";
  const std::vector<double> unclipped = zt::test::train_losses(c);
  c.grad_clip = 0.05;
  const std::vector<double> clipped = zt::test::train_losses(c);
  ASSERT_EQ(clipped.size(), 4u);
  EXPECT_EQ(clipped[0], unclipped[0]);  // the first loss comes before any update
  EXPECT_NE(clipped[3], unclipped[3]);
  c.grad_partition_dtype = "fp32";
  EXPECT_EQ(zt::test::train_losses(c), clipped);
}

// In the trace: each module's partition is FLAT.grad.bf16, 2 bytes a parameter of the shard, pinned
// on the host; there are no fp32 partitions and no staging buffers (grad.from_device[...]) beside
// them, and the run pins less host memory than with fp32 partitions.
TEST(GradPartitionDtype, TheTraceHoldsBf16PartitionsAndNoStaging) {
  zt::test::TempDir dir;
  TrainConfig c = zt::test::tiny_run(3);
  c.zero.stage = 3;
  c.world_size = 2;
  c.precision = "bf16";
  c.zero.offload_optimizer = true;
  c.zero.param_persistence_threshold = 0;
  // Pinned host memory the run took (segments: memory kind 2, level 1).
  auto pinned = [](zt::db::TraceReader& r) {
    return query_int(r, "SELECT sum(bytes) FROM allocation WHERE rank = 0 AND memory_kind = 2 AND level = 1");
  };
  zt::test::TracedRun fp32 = zt::test::train_traced(c, dir.file("fp32.db"));
  ASSERT_TRUE(fp32.status.ok()) << fp32.status.message();
  c.grad_partition_dtype = "compute";
  zt::test::TracedRun low = zt::test::train_traced(c, dir.file("bf16.db"));
  ASSERT_TRUE(low.status.ok()) << low.status.message();
  EXPECT_EQ(low.summary.losses, fp32.summary.losses);
  zt::db::TraceReader& r = *low.reader;
  const std::string blocks = "FROM allocation_v WHERE rank = 0 AND level = 'block' AND ";
  const int64_t n_fp32 = query_int(*fp32.reader, "SELECT count(*) " + blocks + "name LIKE 'fp32_partitioned_groups_flat[%].grad'");
  EXPECT_GT(n_fp32, 0);
  EXPECT_EQ(query_int(r, "SELECT count(*) " + blocks + "name LIKE 'fp32_partitioned_groups_flat[%].grad.bf16'"), n_fp32);
  EXPECT_EQ(query_int(r, "SELECT count(*) " + blocks + "name LIKE 'fp32_partitioned_groups_flat[%].grad'"), 0);
  EXPECT_EQ(query_int(r, "SELECT count(*) " + blocks + "name LIKE 'grad.from_device[%'"), 0);
  EXPECT_GT(query_int(*fp32.reader, "SELECT count(*) " + blocks + "name LIKE 'grad.from_device[%'"), 0);
  // Half the bytes of the fp32 partitions, on the host.
  EXPECT_EQ(2 * query_int(r, "SELECT sum(requested_bytes) " + blocks + "name LIKE '%.grad.bf16'"),
            query_int(*fp32.reader, "SELECT sum(requested_bytes) " + blocks + "name LIKE 'fp32_partitioned_groups_flat[%].grad'"));
  EXPECT_EQ(query_int(r, "SELECT count(*) " + blocks + "name LIKE '%.grad.bf16' AND device NOT LIKE 'cpu%'"), 0);
  const int64_t pinned_fp32 = pinned(*fp32.reader), pinned_low = pinned(r);
  EXPECT_GT(pinned_fp32, 0);
  EXPECT_LT(pinned_low, pinned_fp32);
}

TEST(GradPartitionDtype, BadSettingsAreRefused) {
  auto refused = [](TrainConfig c, const std::string& want) {
    zt::Status st = validate(c);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
  };
  TrainConfig c = zt::test::tiny_run(1);
  c.zero.stage = 3;
  c.precision = "bf16";
  c.zero.offload_optimizer = true;
  c.grad_partition_dtype = "compute";
  EXPECT_TRUE(validate(c).ok()) << validate(c).message();
  TrainConfig bad = c;
  bad.grad_partition_dtype = "bf16";
  refused(bad, "grad_partition_dtype 'bf16': use fp32");
  bad = c;
  bad.precision = "fp32";
  refused(bad, "precision bf16 or fp16");
  bad = c;
  bad.zero.stage = 1;
  refused(bad, "ZeRO stage 2 or 3");
  bad = c;
  bad.zero.offload_optimizer = false;
  refused(bad, "needs offload_optimizer");
}

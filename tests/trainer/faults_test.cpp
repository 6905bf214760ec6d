// The fault mechanisms in the trainer (issue 9): each one really happens, through the same
// guards and allocators a clean run uses, and does not happen where the real bug would not.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "../test_util.h"
#include "traced_run.h"

namespace zt {
namespace {

using test::TempDir;
using test::tiny_run;
using test::train_traced;

// ZeRO-3 with both offloads on 2 ranks, bf16: the setting of R2 and R5.
trainer::TrainConfig offload_run(int64_t steps) {
  trainer::TrainConfig c = tiny_run(steps);
  c.world_size = 2;
  c.precision = "bf16";
  c.zero.stage = 3;
  c.zero.offload_optimizer = true;
  c.zero.offload_param = true;
  return c;
}

std::vector<db::ErrorRow> errors(const test::TracedRun& r) {
  std::vector<db::ErrorRow> out;
  if (r.reader) {
    EXPECT_TRUE(r.reader->read(&out).ok());
  }
  return out;
}

std::vector<db::FaultRow> faults(const test::TracedRun& r) {
  std::vector<db::FaultRow> out;
  if (r.reader) {
    EXPECT_TRUE(r.reader->read(&out).ok());
  }
  return out;
}

TEST(NormOnDevice, ClippingActiveMeetsTheGuardInUnscaleAndClip) {
  TempDir dir;
  auto c = offload_run(3);
  c.grad_clip = 0.01;  // the tiny model's first norms are ~1: clipping is active
  c.faults = {"zero.norm_on_device=return"};
  auto r = train_traced(c, dir.file("t.db"));
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("Expected all tensors to be on the same device, but found at least two devices, "
                                    "cuda:0 and cpu!"),
            std::string::npos)
      << r.status.message();
  auto e = errors(r);
  ASSERT_FALSE(e.empty());
  EXPECT_EQ(e[0].kind, "device_mismatch");
  EXPECT_EQ(e[0].site, "unscale_and_clip_grads");
  EXPECT_NE(e[0].tensors.find("combined_scale@cuda:"), std::string::npos);
  EXPECT_NE(e[0].tensors.find("fp32_partitioned_groups_flat["), std::string::npos);
  EXPECT_EQ(*e[0].step, 0);
  auto f = faults(r);
  ASSERT_FALSE(f.empty());
  EXPECT_EQ(f[0].name, "zero.norm_on_device");
}

TEST(NormOnDevice, HarmlessWithoutClippingUnderTheThresholdOrWithoutOffload) {
  TempDir dir;
  auto off = offload_run(3);
  off.faults = {"zero.norm_on_device=return"};
  auto a = train_traced(off, dir.file("a.db"));  // clipping off
  EXPECT_TRUE(a.status.ok()) << a.status.message();
  EXPECT_FALSE(faults(a).empty());  // the norm did stay on the device: recorded
  EXPECT_TRUE(errors(a).empty());
  auto under = off;
  under.grad_clip = 1e6;  // clipping on, never active
  auto b = train_traced(under, dir.file("b.db"));
  EXPECT_TRUE(b.status.ok()) << b.status.message();
  auto no_offload = off;
  no_offload.grad_clip = 0.01;
  no_offload.zero.offload_optimizer = no_offload.zero.offload_param = false;
  auto c = train_traced(no_offload, dir.file("c.db"));
  EXPECT_TRUE(c.status.ok()) << c.status.message();
  // And the same losses as without the fault: the norm's device changes nothing else.
  auto clean = offload_run(3);
  auto d = train_traced(clean, dir.file("d.db"));
  ASSERT_TRUE(d.status.ok());
  EXPECT_EQ(a.summary.losses, d.summary.losses);
}

TEST(GradPartitionStaysOnDevice, OneDevicePartitionAmongHostOnesFails) {
  TempDir dir;
  auto c = offload_run(3);
  c.grad_accum = 2;
  c.faults = {"zero.grad_partition_stays_on_device=return(1)"};
  auto r = train_traced(c, dir.file("t.db"));
  ASSERT_FALSE(r.status.ok());
  auto e = errors(r);
  ASSERT_FALSE(e.empty());
  EXPECT_EQ(e[0].kind, "device_mismatch");
  EXPECT_EQ(e[0].site, "adamw_step");
  EXPECT_NE(e[0].tensors.find("fp32_partitioned_groups_flat[1].grad@cuda:"), std::string::npos) << e[0].tensors;
  // Clipping does not catch it earlier: the clip's combined_scale is a 0-dim host tensor, which
  // PyTorch lets meet a CUDA tensor (a CPU scalar), so the in-place unscale runs and CPU AdamW,
  // handed the device partition, is where it fails.
  c.grad_clip = 0.01;
  auto r2 = train_traced(c, dir.file("t2.db"));
  ASSERT_FALSE(r2.status.ok());
  EXPECT_EQ(errors(r2)[0].site, "adamw_step");
  // Without optimizer offload nothing is offloaded, so nothing can stay behind.
  c.zero.offload_optimizer = c.zero.offload_param = false;
  EXPECT_TRUE(train_traced(c, dir.file("t3.db")).status.ok());
}

TEST(DeviceOnlyKernels, FirstStepOnOffloadedPartitionsFails) {
  TempDir dir;
  auto c = offload_run(3);
  c.faults = {"optim.device_only_kernels=return"};
  auto r = train_traced(c, dir.file("t.db"));
  ASSERT_FALSE(r.status.ok());
  auto e = errors(r);
  ASSERT_FALSE(e.empty());
  EXPECT_EQ(e[0].message, "Expected a cuda device, but got: cpu");
  EXPECT_EQ(e[0].site, "optimizer.step");
  EXPECT_EQ(*e[0].step, 0);
  c.zero.offload_optimizer = c.zero.offload_param = false;  // the cure: no optimizer offload
  auto ok = train_traced(c, dir.file("ok.db"));
  EXPECT_TRUE(ok.status.ok()) << ok.status.message();
}

// A small text corpus: a few steps per epoch.
std::string small_corpus(const TempDir& dir) {
  std::ofstream f(dir.file("small.txt"));
  for (int d = 0; d < 40; ++d) {
    for (int w = 0; w < 60; ++w) f << (w % 7 ? "word " : "the cat ");
    f << "\n\n";
  }
  return dir.file("small.txt");
}

trainer::TrainConfig epoch_run(const TempDir& dir) {
  auto c = offload_run(0);
  c.steps = 0;
  c.epochs = 3;
  c.grad_accum = 4;
  c.data = small_corpus(dir);
  return c;
}

TEST(EpochLeak, HostOomAtTheFirstBoundaryAfterTheEpochEnds) {
  TempDir dir;
  auto clean = epoch_run(dir);
  clean.host_memory = 1536 << 10;  // 1.5 MiB per rank: the clean run's pinned buffers fit
  auto ok = train_traced(clean, dir.file("clean.db"));
  ASSERT_TRUE(ok.status.ok()) << ok.status.message();
  const int64_t per_epoch = ok.summary.plan.steps_per_epoch;
  ASSERT_GE(per_epoch, 2);
  auto bug = clean;
  bug.faults = {"host.epoch_leak=return"};
  auto r = train_traced(bug, dir.file("bug.db"));
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("Host out of memory (pinned)"), std::string::npos) << r.status.message();
  EXPECT_NE(r.status.message().find("step " + std::to_string(per_epoch) + ":"), std::string::npos) << r.status.message();
  auto e = errors(r);
  ASSERT_FALSE(e.empty());
  EXPECT_EQ(e[0].kind, "host_oom");
  // In the last micro-step of the epoch's first step (accumulation - 1), as in R1.
  db::QueryResult q;
  ASSERT_TRUE(r.reader
                  ->query("SELECT m.micro_step FROM marker m JOIN error e ON m.rank = e.rank AND m.kind = 1 AND "
                          "m.t_start <= e.t AND (m.t_end IS NULL OR m.t_end >= e.t) LIMIT 1",
                          &q)
                  .ok());
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0][0], std::to_string(bug.grad_accum - 1));
  // Without a cap it runs, and the pinned memory held grows epoch by epoch.
  bug.host_memory = 0;
  auto grows = train_traced(bug, dir.file("grows.db"));
  ASSERT_TRUE(grows.status.ok()) << grows.status.message();
  EXPECT_EQ(faults(grows).size(), 4u);  // 2 ranks x 2 epoch boundaries
}

TEST(EpochLeak, Pow2AndForkVariantsGrowTheHostToo) {
  TempDir dir;
  for (const char* v : {"pow2", "fork"}) {
    auto c = epoch_run(dir);
    c.host_memory = 1536 << 10;
    c.faults = {std::string("host.epoch_leak=return(") + v + ")"};
    auto r = train_traced(c, dir.file(std::string(v) + ".db"));
    ASSERT_FALSE(r.status.ok()) << v;
    EXPECT_NE(r.status.message().find(std::string(v) == "pow2" ? "(pinned)" : "(pageable)"), std::string::npos)
        << r.status.message();
  }
  // Without the cap the flat buffer is made, and so is its own fault row (it went nowhere before:
  // recorded without the recorder).
  auto roomy = epoch_run(dir);
  roomy.host_memory = 0;
  roomy.faults = {"host.epoch_leak=return(pow2)"};
  auto ok = train_traced(roomy, dir.file("roomy.db"));
  ASSERT_TRUE(ok.status.ok()) << ok.status.message();
  int flat = 0;
  for (const auto& f : faults(ok)) flat += f.details.find("re-created one flat pinned buffer of") != std::string::npos;
  EXPECT_GT(flat, 0);
  auto bad = epoch_run(dir);
  bad.faults = {"host.epoch_leak=return(sideways)"};
  auto r = train_traced(bad, dir.file("bad.db"));
  EXPECT_NE(r.status.message().find("variant 'sideways'"), std::string::npos) << r.status.message();
}

TEST(DataFaults, ParallelDropAndMaxItersCutTheSteps) {
  TempDir dir;
  auto c = epoch_run(dir);
  c.epochs = 1;
  c.zero = {};
  c.world_size = 1;
  c.precision = "fp32";
  auto full = train_traced(c, dir.file("full.db"));
  ASSERT_TRUE(full.status.ok());
  c.faults = {"data.parallel_drop=return(50)"};
  auto dropped = train_traced(c, dir.file("drop.db"));
  ASSERT_TRUE(dropped.status.ok());
  EXPECT_LE(dropped.summary.steps * 2, full.summary.steps + 1);
  EXPECT_EQ(dropped.summary.corpus_accounting.dropped_documents, 0);  // silently
  EXPECT_FALSE(faults(dropped).empty());
  c.faults = {"config.max_iters=return(2)"};
  c.epochs = 3;
  auto iters = train_traced(c, dir.file("iters.db"));
  ASSERT_TRUE(iters.status.ok());
  EXPECT_EQ(iters.summary.steps, 2);
}

TEST(CommFaults, HangAndExitEndInTheWatchdogLine) {
  TempDir dir;
  for (const char* f : {"comm.hang[rank=1,step=1]=return", "comm.rank_exit[rank=1,step=1]=return"}) {
    auto c = offload_run(4);
    c.comm_timeout_ms = 300;
    c.faults = {f};
    const auto t0 = std::chrono::steady_clock::now();
    auto r = train_traced(c, dir.file("comm.db"));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(r.status.ok()) << f;
    EXPECT_LT(s, 10.0);
    EXPECT_NE(r.status.message().find("Watchdog caught collective operation timeout: WorkNCCL(SeqNum="),
              std::string::npos)
        << r.status.message();
    EXPECT_NE(r.status.message().find("Timeout(ms)=300) ran for"), std::string::npos) << r.status.message();
    auto e = errors(r);
    ASSERT_FALSE(e.empty());
    EXPECT_EQ(e[0].kind, "watchdog_timeout");
    EXPECT_EQ(r.summary.steps, 1);
    std::filesystem::remove(dir.file("comm.db"));
  }
}

TEST(FaultSeeds, TheSameSeedRepeatsTheSameFirings) {
  TempDir dir;
  auto firings = [&](uint64_t seed, const std::string& name) {
    auto c = offload_run(12);
    c.faults = {"zero.norm_on_device=40%print(drawn)"};
    c.fault_seed = seed;
    auto r = train_traced(c, dir.file(name));
    EXPECT_TRUE(r.status.ok());
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const auto& f : faults(r)) out.push_back({f.rank, f.step.value_or(-1)});
    std::sort(out.begin(), out.end());
    return out;
  };
  const auto a = firings(5, "a.db"), b = firings(5, "b.db"), c = firings(6, "c.db");
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Faults, BadSpecsAreRefusedBeforeTraining) {
  TempDir dir;
  auto c = tiny_run(2);
  c.faults = {"zero.norm_on_devic=return"};
  trainer::TrainSummary s;
  Status st = trainer::train(c, nullptr, nullptr, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("unknown fault 'zero.norm_on_devic'"), std::string::npos) << st.message();
  EXPECT_EQ(s.steps, 0);
}

// ---- virtual mode

trainer::TrainConfig yi34b(int64_t world) {
  trainer::TrainConfig c;
  c.virtual_mode = true;
  c.model = "custom";
  c.shape.name = "Yi-34B";
  c.shape.width = 7168;
  c.shape.layers = 60;
  c.shape.heads = 56;
  c.shape.kv_heads = 8;
  c.shape.ffn = 20480;
  c.shape.gated_ffn = true;
  c.shape.vocab = 64000;
  c.shape.context = 4096;
  c.shape.tied_embeddings = false;
  c.world_size = world;
  c.ranks_per_node = 8;
  c.micro_batch = 1;
  c.grad_accum = 4;
  c.seq_len = 4096;
  c.precision = "bf16";
  c.activation_checkpointing = true;
  c.data_samples = 2 * 4 * world;  // two steps per epoch
  c.epochs = 2;
  c.zero.stage = 3;
  c.zero.offload_optimizer = c.zero.offload_param = true;
  c.device_memory = uint64_t(79.32 * double(1ull << 30));
  c.host_memory = 0;
  return c;
}

TEST(VirtualMode, Yi34BOnEightRanksReplaysSizesOnly) {
  TempDir dir;
  auto c = yi34b(8);
  auto r = train_traced(c, dir.file("yi.db"));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.summary.steps, 4);
  // Model states of one rank by the ZeRO-3 + offload rule: bf16 params and grads 2P/W each,
  // fp32 master, m, v 12P/W and the fp32 gradient partition 4P/W (padding aside).
  const double P = 34.39e9, W = 8;
  EXPECT_NEAR(double(r.summary.model_state_bytes), 20 * P / W, 0.01 * 20 * P / W);
  std::vector<db::RankRow> ranks;
  ASSERT_TRUE(r.reader->read(&ranks).ok());
  ASSERT_EQ(ranks.size(), 1u);  // one representative rank
  EXPECT_EQ(ranks[0].world_size, 8);
  db::QueryResult q;
  ASSERT_TRUE(r.reader->query("SELECT value FROM counter_v WHERE name = 'virtual.ranks_represented'", &q).ok());
  ASSERT_EQ(q.rows.size(), 1u);
  EXPECT_EQ(q.rows[0][0], "8");
}

TEST(VirtualMode, TheEpochLeakKillsAFullSizeRunAtTheBoundary) {
  TempDir dir;
  auto c = yi34b(8);
  c.host_memory = 1024ull << 30;  // 1 TiB per node of 8 ranks: 109 GiB of states a rank fit, the kept buffers do not
  auto clean = train_traced(c, dir.file("clean.db"));
  ASSERT_TRUE(clean.status.ok()) << clean.status.message();
  c.faults = {"host.epoch_leak=return"};
  auto bug = train_traced(c, dir.file("bug.db"));
  ASSERT_FALSE(bug.status.ok());
  EXPECT_NE(bug.status.message().find("step 2: rank 0: Host out of memory (pinned)"), std::string::npos) << bug.status.message();
}

TEST(VirtualMode, RefusesShapesItCannotBuild) {
  auto c = yi34b(8);
  c.virtual_mode = false;
  trainer::TrainSummary s;
  Status st = trainer::train(c, nullptr, nullptr, &s);
  EXPECT_NE(st.message().find("virtual mode only"), std::string::npos) << st.message();
  c = yi34b(8);
  c.shape.heads = 55;
  st = trainer::train(c, nullptr, nullptr, &s);
  EXPECT_NE(st.message().find("heads (55) must divide width (7168)"), std::string::npos) << st.message();
  c = yi34b(8);
  c.data_samples = 0;
  st = trainer::train(c, nullptr, nullptr, &s);
  EXPECT_NE(st.message().find("data_samples"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace zt

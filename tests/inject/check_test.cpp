// zt check's rules on hand-built traces: each case writes exactly the rows it needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>

#include "../test_util.h"
#include "../hand_trace.h"
#include "check_traces.h"
#include "zt/check/check.h"
#include "zt/common/units.h"
#include "zt/db/export.h"
#include "zt/db/trace_reader.h"
#include "zt/probe/recorder.h"
#include "zt/probe/synthetic.h"

using namespace zt;
using namespace zt::check;
using zt::test::kGiB;
using zt::test::kMiB;
using zt::test::RunShape;
using zt::test::TraceBuilder;

namespace {

std::string make(const test::TempDir& dir, const std::string& name, const RunShape& shape,
                 const std::function<void(TraceBuilder&)>& extra = nullptr) {
  std::string path = dir.file(name);
  TraceBuilder b(path);
  test::build_run(b, shape);
  if (extra) extra(b);
  b.finish();
  return path;
}

const CheckResult& only(const Report& r, const std::string& name) {
  for (auto& c : r.checks)
    if (c.name == name) return c;
  static CheckResult none;
  ADD_FAILURE() << "no check " << name << " in the report:\n" << format_text(r);
  return none;
}

Report run(const std::string& path, const Options& o) {
  Report r;
  Status s = run_checks(path, o, &r);
  EXPECT_TRUE(s.ok()) << s.message();
  return r;
}

Options leaks_only(int64_t threshold = 512 << 10) {
  Options o;
  o.leaks = true;
  o.leak_threshold = threshold;
  return o;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(CheckLeaks, OneMiBPerEpochOfPinnedHostMemoryIsCaught) {
  test::TempDir dir;
  RunShape s;
  s.ranks = 2;
  s.epochs = 4;
  s.leak_per_epoch = kMiB;
  Report r = run(make(dir, "leak.db", s), leaks_only());
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 2u) << format_text(r);  // one per rank: only their pinned host memory grows
  for (int rank = 0; rank < 2; ++rank) {
    const std::string& f = c.findings[size_t(rank)];
    EXPECT_TRUE(has(f, "rank " + std::to_string(rank) + " cpu pinned host memory")) << f;
    EXPECT_TRUE(has(f, "grew 1.00 MiB per epoch")) << f;
    EXPECT_TRUE(has(f, "epoch 2: +1.00 MiB, epoch 3: +1.00 MiB")) << f;
    // The evidence: what is alive at the later epoch and was not at the earlier, by tensor name.
    EXPECT_TRUE(has(f, "offload.buffer[epoch *] +2.00 MiB in 2 allocations")) << f;
  }
  EXPECT_TRUE(r.failed());
}

TEST(CheckLeaks, TwoEpochsAreEnoughToCatchIt) {
  test::TempDir dir;
  RunShape s;
  s.epochs = 2;
  s.leak_per_epoch = kMiB;
  Report r = run(make(dir, "leak2.db", s), leaks_only());
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  EXPECT_TRUE(has(c.findings.at(0), "offload.buffer[epoch *] +1.00 MiB in 1 allocation")) << c.findings[0];
}

// A probed Python program's host allocations have no tensor names: the growing site is named by the
// Python line that allocated (its innermost Python frame), however deep in C the allocation was.
TEST(CheckLeaks, AProbedPythonLeakNamesItsLine) {
  test::TempDir dir;
  const std::string path = dir.file("pyleak.db");
  ASSERT_TRUE(test::write_python_leak_trace(path));
  Options o;
  o.leaks = true;
  Report r = run(path, o);
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 1u) << format_text(r);
  const std::string& f = c.findings[0];
  EXPECT_TRUE(has(f, "rank 0 cpu pageable host memory")) << f;
  EXPECT_TRUE(has(f, "grew 4.00 MiB per epoch")) << f;
  EXPECT_TRUE(has(f, ": grow (/w/leak.py:12) +8.00 MiB in 2 allocations")) << f;
  EXPECT_FALSE(has(f, "make_table")) << f;  // flat: not part of the growth
}

namespace {
// A probed program's sampled host allocations (the probe's byte sampler, allocation.weight_bytes):
// 4 epochs of 100 ns on rank 0's cpu. Each row is 64 KiB standing for what the sampler's default
// interval (512 KiB) makes of it: 64 KiB / (1 - exp(-1/8)) bytes. `rows_at(e)` rows are made in
// epoch e: kept to the end (`kept`), or alive only across epoch e's start (made 5 ns before it).
constexpr int64_t kSmall = 64 << 10;
const int64_t kWeight = std::llround(double(kSmall) / -std::expm1(-1.0 / 8.0));

std::string sampled_trace(const test::TempDir& dir, const std::string& name, const std::vector<int>& rows_at, bool kept) {
  const std::string path = dir.file(name);
  auto w = test::hand_written_trace(path, "python3 /w/job.py");
  w->insert(db::DeviceRow{1, 0, db::DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
  w->insert(db::StringRow{1, "epoch"});
  w->insert(db::FrameRow{1, 0x7f0000001000, "/lib/x86_64-linux-gnu/libc.so.6", 0x1000, "malloc", std::nullopt});
  w->insert(db::FrameRow{2, 0, "/w/job.py", std::nullopt, "step", 7});
  w->insert(db::StackRow{1, 0, 2});
  w->insert(db::StackRow{2, 1, 1});
  int64_t id = 0;
  for (int e = 0; e < 4; ++e) {
    const int64_t t0 = 100 + 100 * e;
    db::MarkerRow m;
    m.id = e + 1, m.rank = 0, m.kind = db::MarkerKind::Epoch, m.name_id = 1, m.t_start = t0, m.t_end = t0 + 90;
    m.epoch = e;
    w->insert(m);
    for (int i = 0; i < rows_at[size_t(e)]; ++i) {
      db::AllocationRow a;
      a.id = ++id, a.rank = 0, a.device_id = 1, a.memory_kind = db::MemoryKind::PageableHost;
      a.level = db::AllocLevel::Segment, a.address = 0x10000000 + uint64_t(id) * 0x100000;
      a.bytes = a.requested_bytes = kSmall, a.stack_id = 2, a.source = db::Source::HostHook;
      a.weight_bytes = kWeight;
      a.t_alloc = kept ? t0 + 10 : t0 - 5;
      if (!kept) a.t_free = t0 + 5;
      w->insert(a);
    }
  }
  w->set_run_end(1, 600, db::RunStatus::Ok, 0, "");
  w->commit();
  EXPECT_TRUE(w->finish().ok());
  return path;
}
}  // namespace

// Sampled rows count for their weight, and a leak must stand out of the estimate's sampling error.
TEST(CheckLeaks, SampledAllocationsCountForTheirWeightAndALeakMustExceedTheirError) {
  test::TempDir dir;
  Options o;
  o.leaks = true;
  // 20 sampled rows kept each epoch: ~10.6 MiB an epoch, 6.7 standard errors over epochs 1-3.
  Report r = run(sampled_trace(dir, "leak.db", {20, 20, 20, 20}, true), o);
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 1u);
  const std::string& f = c.findings[0];
  EXPECT_TRUE(has(f, "grew ~" + format_bytes(double(20 * kWeight)) + " per epoch")) << f;
  EXPECT_TRUE(has(f, "(estimated from 40 sampled allocations: ±")) << f;
  EXPECT_TRUE(has(f, "step (/w/job.py:7) +~" + format_bytes(double(40 * kWeight)) + " in 40 allocations (40 sampled)"))
      << f;

  // 1, 1, 2 and 3 rows alive across the epochs' starts, each a different allocation: 0.53 MiB more an
  // epoch, past the 512 KiB threshold, but 1.1 standard errors of its estimate: not a leak, and said.
  r = run(sampled_trace(dir, "noise.db", {1, 1, 2, 3}, false), o);
  const CheckResult& n = only(r, "leaks");
  EXPECT_EQ(n.outcome, Outcome::Pass) << format_text(r);
  EXPECT_TRUE(has(n.summary, "rank 0 cpu pageable host memory grew ~" + format_bytes(double(kWeight)) +
                                 " per epoch at epoch start, within 3 standard errors of its sampled estimate"))
      << n.summary;
}

TEST(CheckLeaks, AFlatRunPasses) {
  // The GPU's caching allocator reserves a second segment during epoch 0 and keeps it: the
  // tensor-level rows (blocks) are flat, and they are what counts.
  test::TempDir dir;
  RunShape s;
  s.ranks = 2;
  Report r = run(make(dir, "flat.db", s), leaks_only());
  const CheckResult& c = only(r, "leaks");
  EXPECT_EQ(c.outcome, Outcome::Pass) << format_text(r);
  EXPECT_TRUE(c.findings.empty());
  EXPECT_TRUE(has(c.summary, "over 3 epochs")) << c.summary;
  EXPECT_FALSE(r.failed());
}

TEST(CheckLeaks, StateCreatedOnceInTheFirstEpochIsWarmUp) {
  test::TempDir dir;
  RunShape s;
  s.lazy_state_bytes = 64 * kMiB;
  EXPECT_EQ(only(run(make(dir, "lazy.db", s), leaks_only()), "leaks").outcome, Outcome::Pass);
}

TEST(CheckLeaks, ThresholdDecides) {
  test::TempDir dir;
  RunShape s;
  s.leak_per_epoch = 256 << 10;
  std::string path = make(dir, "small.db", s);
  EXPECT_EQ(only(run(path, leaks_only()), "leaks").outcome, Outcome::Pass);
  Report r = run(path, leaks_only(128 << 10));
  EXPECT_EQ(only(r, "leaks").outcome, Outcome::Fail) << format_text(r);
}

// One epoch of 4 steps: no two epochs to compare, so windows of steps are (it used to be a skip,
// and a skip passed).
TEST(CheckLeaks, OneEpochComparesWindowsOfSteps) {
  test::TempDir dir;
  RunShape s;
  s.epochs = 1;
  Report r = run(make(dir, "one.db", s), leaks_only());
  const CheckResult& c = only(r, "leaks");
  EXPECT_EQ(c.outcome, Outcome::Pass) << format_text(r);
  EXPECT_TRUE(has(c.summary, "live bytes at window start and end do not grow")) << c.summary;
  EXPECT_TRUE(has(c.summary, "over 4 windows of 1 step (the trace has 1 epoch: windows of its 4 steps)")) << c.summary;
}

TEST(CheckLeaks, SyntheticWorkloadWithHostSegmentsOnly) {
  // zt synth records host memory as segments only (no blocks): those are what count there.
  test::TempDir dir;
  for (int64_t leak : {int64_t(0), kMiB}) {
    std::string path = dir.file("synth" + std::to_string(leak) + ".db");
    probe::RecorderOptions ro;
    ro.path = path;
    ro.crash_handlers = false;
    std::unique_ptr<probe::Recorder> rec;
    ASSERT_TRUE(probe::Recorder::open(ro, &rec).ok());
    probe::SyntheticOptions so;
    so.epochs = 3;
    so.layer_bytes = 4 * kMiB;
    so.activation_bytes = 2 * kMiB;
    so.leak_bytes_per_epoch = leak;
    probe::record_synthetic(*rec, so);
    ASSERT_TRUE(rec->close(db::RunStatus::Ok, 0).ok());
    Report r = run(path, leaks_only());
    EXPECT_EQ(only(r, "leaks").outcome, leak ? Outcome::Fail : Outcome::Pass) << format_text(r);
    if (leak) {
      EXPECT_TRUE(has(format_text(r), "offload.buffer[epoch *] +1.00 MiB")) << format_text(r);
    }
  }
}

TEST(CheckPlacement, OffloadedStatesOnTheHostAndStagedShardsPass) {
  test::TempDir dir;
  RunShape s;
  s.ranks = 2;
  Options o;
  o.placement = true;
  Report r = run(make(dir, "ok.db", s), o);
  const CheckResult& c = only(r, "placement");
  EXPECT_EQ(c.outcome, Outcome::Pass) << format_text(r);
  EXPECT_TRUE(has(c.summary, "offload_optimizer, offload_param")) << c.summary;
}

TEST(CheckPlacement, DeviceMismatchErrorIsAFinding) {
  test::TempDir dir;
  RunShape s;
  s.ranks = 2;
  std::string path = make(dir, "mismatch.db", s, [](TraceBuilder& b) {
    db::ErrorRow e;
    e.rank = 1;
    e.t = test::step_t0(3) + 50;
    e.step = 3;
    e.kind = "device_mismatch";
    e.site = "unscale_and_clip_grads";
    e.message = "Expected all tensors to be on the same device, but found at least two devices, cpu and cuda:1!";
    e.tensors = R"(["fp32_partitioned_groups_flat[0].grad@cpu","fp32_partitioned_groups_flat[1].grad@cuda:1"])";
    e.device_id = 4;
    b.error(e);
  });
  Options o;
  o.placement = true;
  Report r = run(path, o);
  const CheckResult& c = only(r, "placement");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 1u) << format_text(r);
  const std::string& f = c.findings[0];
  EXPECT_TRUE(has(f, "rank 1 step 3 in unscale_and_clip_grads: device_mismatch: Expected all tensors to be on the "
                     "same device, but found at least two devices, cpu and cuda:1!"))
      << f;
  EXPECT_TRUE(has(f, "fp32_partitioned_groups_flat[0].grad@cpu, fp32_partitioned_groups_flat[1].grad@cuda:1")) << f;
  EXPECT_TRUE(has(f, "[device cuda:1]")) << f;
  EXPECT_TRUE(has(c.summary, "1 device_mismatch error")) << c.summary;
}

TEST(CheckPlacement, GradientPartitionLeftOnTheGpuUnderOptimizerOffload) {
  test::TempDir dir;
  RunShape s;
  std::string path = make(dir, "misplaced.db", s, [](TraceBuilder& b) {
    // The R2 mechanism: a gradient partition made on the GPU at step 5 (device 2 is cuda:0).
    int64_t a = b.alloc(0, 2, db::MemoryKind::Device, "fp32_partitioned_groups_flat[2].grad", 4 * kMiB,
                        test::step_t0(5) + 30, test::step_t0(5) + 40);
    b.placement(0, test::step_t0(5) + 30, "fp32_partitioned_groups_flat[2].grad", 2, db::PlacementWhy::Created,
                4 * kMiB, a);
  });
  Options o;
  o.placement = true;
  Report r = run(path, o);
  const CheckResult& c = only(r, "placement");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 1u) << format_text(r);
  const std::string& f = c.findings[0];
  EXPECT_TRUE(has(f, "rank 0: fp32_partitioned_groups_flat[*].grad on cuda:0, expected on the host "
                     "(zero_optimization.offload_optimizer): 1 tensor (fp32_partitioned_groups_flat[2].grad), 4.00 MiB, "
                     "first at step 5"))
      << f;
}

// A partial offload (DeepSpeed's offload_optimizer.ratio 0.5 over 6 modules: embeddings, block0-3,
// final_ln) keeps the first int(0.5 * 6) = 3 modules' optimizer states on the accelerator: those are
// allowed there, by their partition's index or their moments' module name; block2's (module 3) is not.
TEST(CheckPlacement, APartialOffloadAllowsItsFirstModulesOnTheGpu) {
  test::TempDir dir;
  RunShape s;
  s.offload_ratio = 0.5;
  auto on_gpu = [](std::vector<std::string> names) {
    return [names](TraceBuilder& b) {
      for (const std::string& n : names) b.alloc(0, 2, db::MemoryKind::Device, n, kMiB, 95, std::nullopt);
    };
  };
  Options o;
  o.placement = true;
  Report ok = run(make(dir, "kept.db", s,
                       on_gpu({"adam.m[embeddings]", "adam.v[block0]", "adam.m[block1]", "fp32_partitioned_groups_flat[0]",
                               "fp32_partitioned_groups_flat[2].grad"})),
                  o);
  const CheckResult& c = only(ok, "placement");
  EXPECT_EQ(c.outcome, Outcome::Pass) << format_text(ok);
  EXPECT_TRUE(has(c.summary, "offload_ratio keeps on the accelerator")) << c.summary;

  Report bad = run(make(dir, "beyond.db", s, on_gpu({"adam.m[block1]", "adam.v[block2]", "fp32_partitioned_groups_flat[3]"})),
                   o);
  const CheckResult& f = only(bad, "placement");
  ASSERT_EQ(f.outcome, Outcome::Fail) << format_text(bad);
  const std::string text = format_text(bad);
  EXPECT_TRUE(has(text, "adam.v[block2]")) << text;
  EXPECT_TRUE(has(text, "fp32_partitioned_groups_flat[3]")) << text;
  EXPECT_FALSE(has(text, "adam.m[block1]")) << text;

  s.offload_ratio.reset();  // every module offloaded: block1's moments on the GPU are a finding again
  Report full = run(make(dir, "full.db", s, on_gpu({"adam.m[block1]"})), o);
  EXPECT_EQ(only(full, "placement").outcome, Outcome::Fail) << format_text(full);
}

TEST(CheckPlacement, ResidentParameterShardOnTheGpuUnderParamOffload) {
  test::TempDir dir;
  RunShape s;
  std::string path = make(dir, "shard.db", s, [](TraceBuilder& b) {
    // Made before the first step and kept: the shard's home copy, not a staged one.
    b.alloc(0, 2, db::MemoryKind::Device, "block3.shard", kMiB, 90, std::nullopt);
  });
  Options o;
  o.placement = true;
  Report r = run(path, o);
  const CheckResult& c = only(r, "placement");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 1u) << format_text(r);
  EXPECT_TRUE(has(c.findings[0], "block3.shard on cuda:0, expected on the host (zero_optimization.offload_param)"))
      << c.findings[0];
  EXPECT_TRUE(has(c.findings[0], "first before any step")) << c.findings[0];
}

// Under offload_param a shard's copy on the accelerator is allowed when it is freed before the next
// step begins: the checkpoint's gather between steps (save.blockN.shard), and a caching allocator's
// segment named after its first block is not a tensor (R2's --virtual fix trace failed on one).
TEST(CheckPlacement, StagedShardCopiesAndSegmentsAreNotResident) {
  test::TempDir dir;
  RunShape s;
  std::string path = make(dir, "staged.db", s, [](TraceBuilder& b) {
    // Between steps 3 and 4: the save's gather, freed before step 4 begins, and the H2D copy into it.
    int64_t a = b.alloc(0, 2, db::MemoryKind::Device, "save.block3.shard", kMiB, test::step_t0(3) + 95, test::step_t0(4) - 1);
    b.placement(0, test::step_t0(3) + 95, "save.block3.shard", 2, db::PlacementWhy::Created, kMiB, a);
    b.placement(0, test::step_t0(3) + 96, "save.block3.shard", 2, db::PlacementWhy::Moved, kMiB);
    // A segment named after its first block, kept for the whole run (the blocks are judged instead).
    b.alloc(0, 2, db::MemoryKind::Device, "embeddings.shard", 64 * kMiB, 95, std::nullopt, db::AllocLevel::Segment);
  });
  Options o;
  o.placement = true;
  Report r = run(path, o);
  EXPECT_EQ(only(r, "placement").outcome, Outcome::Pass) << format_text(r);

  // The same save copy kept into step 4 is resident.
  std::string kept = make(dir, "kept.db", s, [](TraceBuilder& b) {
    b.alloc(0, 2, db::MemoryKind::Device, "save.block3.shard", kMiB, test::step_t0(3) + 95, test::step_t0(4) + 10);
  });
  Report k = run(kept, o);
  ASSERT_EQ(only(k, "placement").outcome, Outcome::Fail) << format_text(k);
  EXPECT_TRUE(has(only(k, "placement").findings.at(0), "save.block3.shard on cuda:0")) << format_text(k);
}

TEST(CheckPlacement, NoOffloadNoRule) {
  test::TempDir dir;
  RunShape s;
  s.offload = false;  // optimizer states on the GPU, as the config says
  Options o;
  o.placement = true;
  Report r = run(make(dir, "z0.db", s), o);
  const CheckResult& c = only(r, "placement");
  EXPECT_EQ(c.outcome, Outcome::Pass);
  EXPECT_TRUE(has(c.summary, "offloads nothing")) << c.summary;
}

TEST(CheckBudget, ParsesAndRefusesWithTheBadItemNamed) {
  Budget b;
  ASSERT_TRUE(parse_budget("cuda=70GiB,host=900GiB", &b).ok());
  EXPECT_EQ(*b.cuda, 70 * kGiB);
  EXPECT_EQ(*b.host, 900 * kGiB);
  ASSERT_TRUE(parse_budget(" host = 1.5TiB ", &b).ok());
  EXPECT_FALSE(b.cuda);
  EXPECT_EQ(*b.host, int64_t(1.5 * 1024) * kGiB);
  struct Bad {
    const char* text;
    const char* says;
  };
  for (Bad x : {Bad{"cuda=70XB", "--budget: 'cuda=70XB': '70XB' is not a size"},
                Bad{"cuda70GiB", "--budget: 'cuda70GiB': not KEY=SIZE"},
                Bad{"cuda=1GiB,tpu=2GiB", "--budget: 'tpu=2GiB': unknown key 'tpu'"},
                Bad{"cuda=1GiB,cuda=2GiB", "--budget: 'cuda=2GiB': 'cuda' given twice"},
                Bad{"cuda=1GiB,", "--budget: '': empty item"}, Bad{"cuda=", "--budget: 'cuda=': '' is not a size"},
                Bad{"", "--budget: empty"},
                Bad{"host=8388608TiB", "--budget: 'host=8388608TiB': '8388608TiB' is not a size: too large (at most 8 EiB)"}}) {
    Status s = parse_budget(x.text, &b);
    ASSERT_FALSE(s.ok()) << x.text;
    EXPECT_TRUE(has(s.message(), x.says)) << x.text << " -> " << s.message();
  }
}

TEST(CheckBudget, PeakOverTheBudgetNamesDeviceStepAndTensors) {
  test::TempDir dir;
  RunShape s;
  std::string path = make(dir, "budget.db", s, [](TraceBuilder& b) {
    // A checkpoint-time gather of 3 GiB on cuda:0 (device 2), between steps 7 and 8.
    b.alloc(0, 2, db::MemoryKind::Device, "checkpoint.gather", 3 * kGiB, test::step_t0(7) + 10, test::step_t0(7) + 20);
  });
  Options o;
  Budget bud;
  ASSERT_TRUE(parse_budget("cuda=2GiB,host=1GiB", &bud).ok());
  o.budget = bud;
  Report r = run(path, o);
  ASSERT_EQ(r.checks.size(), 1u);
  const CheckResult& c = only(r, "budget");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 1u) << format_text(r);
  const std::string& f = c.findings[0];
  EXPECT_TRUE(has(f, "rank 0 cuda:0: peak allocated 3.02 GiB over the budget of 2.00 GiB by 1.02 GiB, at step 7")) << f;
  EXPECT_TRUE(has(f, "capacity 80.00 GiB")) << f;
  EXPECT_TRUE(has(f, "alive at the peak: checkpoint.gather 3.00 GiB in 1 allocation, activations 8.00 MiB")) << f;

  // Within budget: the host holds 4 x 16 MiB of optimizer state + shards; the GPU 3 GiB.
  ASSERT_TRUE(parse_budget("cuda=4GiB,host=100MiB", &bud).ok());
  o.budget = bud;
  Report ok = run(path, o);
  EXPECT_EQ(only(ok, "budget").outcome, Outcome::Pass) << format_text(ok);
  ASSERT_TRUE(parse_budget("host=64MiB", &bud).ok());
  o.budget = bud;
  Report host = run(path, o);
  ASSERT_EQ(only(host, "budget").outcome, Outcome::Fail) << format_text(host);
  EXPECT_TRUE(has(only(host, "budget").findings.at(0), "host testhost: peak allocated host memory 68.00 MiB over the budget of 64.00 MiB"))
      << format_text(host);
}

// A counter is any number in a trace: an 'allocated' counter that is not a size (fuzz_trace found
// 2.6e301 converted to int64) is left out of the peak, and the report says so.
TEST(CheckBudget, AnAllocatedCounterThatIsNotASizeIsLeftOutAndSaid) {
  test::TempDir dir;
  const std::string path = dir.file("counter.db");
  {
    TraceBuilder b(path);  // a GPU with segments and the allocator's counter, no block rows
    b.run("{}");
    b.rank(0, 1);
    const int64_t gpu = b.device(0, db::DeviceKind::Cuda, "cuda:0", 80 * kGiB);
    b.alloc(0, gpu, db::MemoryKind::Device, "segment", 20 * kMiB, 10, std::nullopt, db::AllocLevel::Segment);
    b.counter(0, gpu, "allocated", 20, 2.6e301);
    b.counter(0, gpu, "allocated", 30, -1.0);
    b.counter(0, gpu, "allocated", 40, double(3 * kMiB));
    b.finish();
  }
  Options o;
  Budget bud;
  ASSERT_TRUE(parse_budget("cuda=4GiB", &bud).ok());
  o.budget = bud;
  Report r = run(path, o);
  const CheckResult& c = only(r, "budget");
  EXPECT_EQ(c.outcome, Outcome::Pass) << format_text(r);
  EXPECT_TRUE(has(c.summary, "highest 3.00 MiB")) << format_text(r);
  ASSERT_EQ(c.context.size(), 1u) << format_text(r);
  EXPECT_TRUE(has(c.context[0], "the 'allocated' counter of rank 0 cuda:0 holds 2.6e+301, not a size")) << c.context[0];
}

// A merged trace of processes run one after another on one host (zt probe of a parent that runs two
// children in turn): memory a process never freed goes with it when its run ends, so the host's peak
// is the parent's 2 MiB and the larger child's 5 MiB, not every child's together (10 MiB).
TEST(CheckBudget, MemoryOfAProcessThatEndedCountsNoLonger) {
  test::TempDir dir;
  const std::string path = dir.file("children.db");
  {
    std::unique_ptr<db::TraceWriter> w;
    ASSERT_TRUE(db::TraceWriter::create(path, &w).ok());
    w->begin();
    w->insert(db::StringRow{1, "malloc"});
    const int64_t mib = 1 << 20;
    // run id, its span, its allocation (never freed), and its size
    const int64_t runs[3][4] = {{1, 0, 1000, 2}, {2, 100, 200, 3}, {3, 300, 400, 5}};
    for (const auto& [id, t0, t1, size] : runs) {
      db::RunRow run;
      run.id = id, run.command_line = "child", run.hostname = "testhost", run.t_start = t0, run.t_end = t1;
      run.exit_code = 0;
      w->insert(run);
      const int64_t rank = id - 1;
      db::RankRow rk;
      rk.rank = rank, rk.run_id = id, rk.hostname = "testhost";
      w->insert(rk);
      db::DeviceRow d;
      d.id = id, d.rank = rank, d.kind = db::DeviceKind::Cpu, d.label = "cpu", d.name = "host memory";
      w->insert(d);
      db::AllocationRow a;
      a.id = id, a.rank = rank, a.device_id = id, a.memory_kind = db::MemoryKind::PageableHost;
      a.address = 0x1000 * uint64_t(id), a.bytes = a.requested_bytes = size * mib, a.t_alloc = t0 + 10, a.name_id = 1;
      w->insert(a);
    }
    w->commit();
    ASSERT_TRUE(w->finish().ok());
  }
  Options o;
  Budget bud;
  ASSERT_TRUE(parse_budget("host=7.5MiB", &bud).ok());
  o.budget = bud;
  Report pass = run(path, o);
  EXPECT_EQ(only(pass, "budget").outcome, Outcome::Pass) << format_text(pass);
  EXPECT_TRUE(has(only(pass, "budget").summary, "host: highest 7.00 MiB")) << format_text(pass);
  ASSERT_TRUE(parse_budget("host=6.5MiB", &bud).ok());
  o.budget = bud;
  Report fail = run(path, o);
  EXPECT_EQ(only(fail, "budget").outcome, Outcome::Fail) << format_text(fail);
}

TEST(CheckSteps, AgainstThePlanAndAgainstN) {
  test::TempDir dir;
  RunShape s;
  std::string path = make(dir, "steps.db", s);
  Options o;
  o.steps = true;
  Report r = run(path, o);
  EXPECT_EQ(only(r, "steps").outcome, Outcome::Pass) << format_text(r);
  EXPECT_TRUE(has(only(r, "steps").summary, "12 of 12 planned steps run (data.steps_planned)")) << format_text(r);
  o.expected_steps = 12;
  EXPECT_EQ(only(run(path, o), "steps").outcome, Outcome::Pass);
  o.expected_steps = 20;
  Report more = run(path, o);
  ASSERT_EQ(only(more, "steps").outcome, Outcome::Fail);
  EXPECT_TRUE(has(only(more, "steps").findings.at(0), "rank 0: 12 of 20 expected steps run (--steps), 8 short"))
      << format_text(more);
}

// A probed job's launcher and helpers (rank.role) are no ranks: they run no steps, and an error
// row of theirs is named by role and pid (they failed the check as 'rank 1: 0 of 12 planned steps').
TEST(CheckSteps, TheLauncherAndHelpersRunNoStepsOfTheJob) {
  test::TempDir dir;
  RunShape s;
  const std::string path = make(dir, "job.db", s, [](TraceBuilder& b) {
    b.process(1, db::RankRole::Launcher, 4240);
    b.process(2, db::RankRole::Helper, 4250, 0);
    b.marker(2, db::MarkerKind::Step, "step 0", 10, 20, 0, 0);  // a helper's own marker is not a step of the job
  });
  Options o;
  o.steps = true;
  Report r = run(path, o);
  EXPECT_EQ(only(r, "steps").outcome, Outcome::Pass) << format_text(r);
  EXPECT_TRUE(has(only(r, "steps").summary, "12 of 12 planned steps run")) << format_text(r);
}

TEST(CheckSteps, ShortRunReportsTheDataAccounting) {
  test::TempDir dir;
  RunShape s;
  s.steps_run = 8;
  Options o;
  o.steps = true;
  Report r = run(make(dir, "short.db", s), o);
  const CheckResult& c = only(r, "steps");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  EXPECT_TRUE(has(c.findings.at(0), "rank 0: 8 of 12 planned steps run (data.steps_planned), 4 short; step 8 began "
                                    "and never ended"))
      << format_text(r);
  std::string text = format_text(r);
  EXPECT_TRUE(has(text, "run 1 ended with status failed, exit code 1: step 8: CUDA out of memory")) << text;
  EXPECT_TRUE(has(text, "data accounting: documents=12 documents_dropped=3 documents_truncated=1 samples_per_epoch=8 "
                        "steps_per_epoch=4 steps_planned=12 samples_used by each epoch's end (rank 0, running total)=8,16"))
      << text;
}

// --steps named on a trace without a plan cannot run: not a pass. In the default set it is a skip.
TEST(CheckSteps, NoPlanCannotRunWhenNamedAndIsSkippedInTheDefaultSet) {
  test::TempDir dir;
  RunShape s;
  s.write_plan = false;
  const std::string path = make(dir, "noplan.db", s);
  Options o;
  o.steps = true;
  Report r = run(path, o);
  const CheckResult& c = only(r, "steps");
  EXPECT_EQ(c.outcome, Outcome::CannotRun);
  EXPECT_TRUE(has(c.summary, "give --steps N")) << c.summary;
  EXPECT_TRUE(r.failed());
  const std::string text = format_text(r);
  EXPECT_TRUE(has(text, "CANNOT RUN steps: the trace records no plan")) << text;
  EXPECT_TRUE(has(text, "zt check: FAILED (steps could not run, 0 passed)")) << text;
  const std::string x = junit_xml(r);
  EXPECT_TRUE(has(x, "tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\"")) << x;
  EXPECT_TRUE(has(x, "<error message=\"the trace records no plan (no data.steps_planned counter); give --steps N\" "
                     "type=\"cannot run\">"))
      << x;

  Report all = run(path, Options{});
  EXPECT_EQ(only(all, "steps").outcome, Outcome::Skip);
  EXPECT_FALSE(all.failed()) << format_text(all);
  EXPECT_TRUE(has(format_text(all), "zt check: ok (3 passed, 1 skipped)")) << format_text(all);
}

// A counter is any number in a trace: a plan that is not a whole count of steps is said, not cast.
TEST(CheckSteps, APlanThatIsNotACountIsSkippedAndSaid) {
  for (double planned : {1e300, -4.0, 2.5, std::nan("")}) {
    test::TempDir dir;
    RunShape s;
    s.write_plan = false;
    Options o;
    o.steps = true;
    Report r = run(make(dir, "plan.db", s, [&](TraceBuilder& b) { b.counter(0, 0, "data.steps_planned", 5, planned); }), o);
    const CheckResult& c = only(r, "steps");
    EXPECT_EQ(c.outcome, Outcome::CannotRun) << planned << ": " << format_text(r);
    EXPECT_TRUE(has(c.summary, "not a count of steps; give --steps N")) << c.summary;
  }
}

TEST(Check, DefaultSetIsRunLeaksPlacementSteps) {
  test::TempDir dir;
  Report r = run(make(dir, "d.db", RunShape{}), Options{});
  ASSERT_EQ(r.checks.size(), 4u);
  EXPECT_EQ(r.checks[0].name, "run");
  EXPECT_EQ(r.checks[1].name, "leaks");
  EXPECT_EQ(r.checks[2].name, "placement");
  EXPECT_EQ(r.checks[3].name, "steps");
  EXPECT_FALSE(r.failed()) << format_text(r);
  std::string text = format_text(r);
  EXPECT_TRUE(has(text, "PASS run: the run ended ok")) << text;
  EXPECT_TRUE(has(text, "zt check: ok (4 passed)")) << text;
}

Options run_only() {
  Options o;
  o.run = true;
  return o;
}

void oom_error(TraceBuilder& b) {
  db::ErrorRow e;
  e.rank = 0;
  e.t = 1500;
  e.step = 8;
  e.kind = "device_oom";
  e.site = "forward block0";
  e.message = "CUDA out of memory. Tried to allocate 2.00 MiB.";
  b.error(e);
}

// The default threshold: 1% of a small memory (64 KiB at least) over three epochs or more, so the
// first epoch is left out as warm-up; over two, 512 KiB (lazily created state could be a "leak").
TEST(CheckLeaks, TheDefaultThresholdFollowsTheMemoryOverThreeEpochs) {
  test::TempDir dir;
  RunShape s;
  s.offload = false;               // the host's pinned memory holds only what leaks
  s.leak_per_epoch = 100 << 10;    // 100 KiB per epoch
  Options o;
  o.leaks = true;                  // leak_threshold 0: the default
  s.epochs = 3;
  Report three = run(make(dir, "three.db", s), o);
  ASSERT_EQ(only(three, "leaks").outcome, Outcome::Fail) << format_text(three);
  EXPECT_TRUE(has(only(three, "leaks").findings.at(0), "this memory's threshold: 64.00 KiB per epoch")) << format_text(three);
  s.epochs = 2;
  Report two = run(make(dir, "two.db", s), o);
  EXPECT_EQ(only(two, "leaks").outcome, Outcome::Pass) << format_text(two);
}

// A run cut short fails the run check even where every memory check passes: a crash before the
// first epoch ends leaves nothing for --leaks to compare, and no plan for --steps to miss.
TEST(CheckRun, AFailedRunFailsWithHowItEndedAndItsErrors) {
  test::TempDir dir;
  RunShape s;
  s.steps_run = 8;
  s.write_plan = false;
  Report all = run(make(dir, "failed.db", s, oom_error), Options{});
  const CheckResult& c = only(all, "run");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(all);
  EXPECT_EQ(c.summary, "the run did not end ok");
  ASSERT_EQ(c.findings.size(), 1u);
  EXPECT_EQ(c.findings[0], "run 1 ended with status failed, exit code 1: step 8: CUDA out of memory");
  ASSERT_EQ(c.context.size(), 1u);
  EXPECT_EQ(c.context[0],
            "error on rank 0 at step 8 in forward block0: device_oom: CUDA out of memory. Tried to allocate 2.00 MiB.");
  EXPECT_EQ(only(all, "steps").outcome, Outcome::Skip);  // no plan: only the run check sees the crash
  EXPECT_TRUE(all.failed());
  EXPECT_TRUE(has(format_text(all), "zt check: FAILED (run failed")) << format_text(all);

  Report alone = run(dir.file("failed.db"), run_only());
  ASSERT_EQ(alone.checks.size(), 1u);
  EXPECT_EQ(alone.checks[0].name, "run");

  // An allocator's error row has no step of its own: the step under way on its rank is named.
  Report from_allocator = run(make(dir, "allocator.db", s, [](TraceBuilder& b) {
                                db::ErrorRow e;
                                e.rank = 0;
                                e.t = test::step_t0(5) + 10;
                                e.kind = "oom";
                                e.message = "CUDA out of memory.";
                                b.error(e);
                              }),
                              run_only());
  ASSERT_EQ(only(from_allocator, "run").context.size(), 1u) << format_text(from_allocator);
  EXPECT_EQ(only(from_allocator, "run").context[0], "error on rank 0 during step 5: oom: CUDA out of memory.");

  // An error of a probed job's launcher (rank.role): named by role and pid, not as a rank.
  Report from_launcher = run(make(dir, "launcher.db", s, [](TraceBuilder& b) {
                               b.process(1, db::RankRole::Launcher, 4240);
                               db::ErrorRow e;
                               e.rank = 1;
                               e.t = 10;
                               e.kind = "uncaught_exception";
                               e.message = "ChildFailedError";
                               b.error(e);
                             }),
                             run_only());
  ASSERT_EQ(only(from_launcher, "run").context.size(), 1u) << format_text(from_launcher);
  EXPECT_EQ(only(from_launcher, "run").context[0], "error on launcher process 4240: uncaught_exception: ChildFailedError");
}

TEST(CheckRun, ATraceNeverClosedFailsAndACleanOnePasses) {
  test::TempDir dir;
  RunShape s;
  s.status = db::RunStatus::Running;
  const Report killed = run(make(dir, "killed.db", s), run_only());
  ASSERT_EQ(only(killed, "run").outcome, Outcome::Fail);
  EXPECT_EQ(only(killed, "run").findings.at(0), "run 1 ended without closing the trace (killed, or still running)");
  s.status = db::RunStatus::Signal;
  const Report signal = run(make(dir, "signal.db", s), run_only());
  ASSERT_EQ(only(signal, "run").outcome, Outcome::Fail);
  EXPECT_EQ(only(signal, "run").findings.at(0), "run 1 ended with status signal, exit code 1");
  const Report clean = run(make(dir, "clean.db", RunShape{}), run_only());
  EXPECT_EQ(only(clean, "run").outcome, Outcome::Pass);
  EXPECT_EQ(only(clean, "run").summary, "the run ended ok");
}

TEST(Check, BadInputIsAStatusNamingTheFile) {
  test::TempDir dir;
  Report r;
  Status s = run_checks(dir.file("missing.db"), Options{}, &r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind(dir.file("missing.db") + ": ", 0), 0u) << s.message();
  std::ofstream(dir.file("junk.db")) << "not a trace at all";
  s = run_checks(dir.file("junk.db"), Options{}, &r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind(dir.file("junk.db") + ": ", 0), 0u) << s.message();
}

TEST(Check, JUnitHasATestcasePerCheckAndEscapes) {
  Report r;
  r.trace = "a&b.db";
  CheckResult pass{"leaks", Outcome::Pass, "flat", {}, {}, 0.01};
  CheckResult fail{"placement", Outcome::Fail, "1 misplaced <tensor> group", {"rank 0: x \"y\" on cuda:0"}, {"ctx"}, 0};
  CheckResult skip{"steps", Outcome::Skip, "no plan", {}, {}, 0};
  CheckResult cannot{"budget", Outcome::CannotRun, "cannot look: host: no host allocations", {}, {}, 0};
  r.checks = {pass, fail, skip, cannot};
  std::string x = junit_xml(r);
  EXPECT_TRUE(has(x, "<testsuite name=\"zt check\" tests=\"4\" failures=\"1\" errors=\"1\" skipped=\"1\"")) << x;
  EXPECT_TRUE(has(x, "<error message=\"cannot look: host: no host allocations\" type=\"cannot run\"></error>")) << x;
  EXPECT_TRUE(has(x, "<property name=\"trace\" value=\"a&amp;b.db\"/>")) << x;
  EXPECT_TRUE(has(x, "<testcase classname=\"zt check\" name=\"leaks\" time=\"0.010\">")) << x;
  EXPECT_TRUE(has(x, "<failure message=\"1 misplaced &lt;tensor&gt; group\" type=\"placement\">rank 0: x \"y\" on "
                     "cuda:0\n  ctx\n</failure>"))
      << x;
  EXPECT_TRUE(has(x, "<skipped message=\"no plan\"/>")) << x;
  std::string e = junit_xml_error("t.db", "t.db: empty file");
  EXPECT_TRUE(has(e, "errors=\"1\"")) << e;
  EXPECT_TRUE(has(e, "<error message=\"t.db: empty file\"")) << e;
}

TEST(Check, WriteFileAtomicReplacesAndLeavesNoTemporary) {
  test::TempDir dir;
  std::string p = dir.file("out.xml");
  ASSERT_TRUE(write_file_atomic(p, "one").ok());
  ASSERT_TRUE(write_file_atomic(p, "two").ok());
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), "two");
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  Status s = write_file_atomic(dir.file("no/such/dir/out.xml"), "x");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(has(s.message(), dir.file("no/such/dir/out.xml") + ": cannot write")) << s.message();
}

// ---- issue 40: no silent pass; windows without epochs; steps derived here; RSS as a witness ----

namespace {

constexpr const char* kProbedConfig = R"({"probe":"libzt_probe.so","host_threshold":1048576,"rss_interval_ms":100})";

// A probed program's host memory on rank 0's cpu device (id 1): a 2 MiB table made before the loop
// and kept, and per step an 8 MiB temporary freed within it; `kept_per_step` more kept each step.
// Steps run from 1000 + 100 s to 1000 + 100 s + 90 (s = 0 .. steps-1); the run ends at 1000 + 100 steps + 500.
struct LoopShape {
  int steps = 20;
  int64_t kept_per_step = 0;
  bool step_markers = true;
  int steps_per_epoch = 0;   // > 0: epoch markers too, every that many steps
  bool as_ranges = false;    // the markers as the zerotrace module's ranges, not derived (a killed zt probe)
  const char* config = kProbedConfig;
  std::function<void(TraceBuilder&)> extra;
  // Sampled rows (the probe's byte sampler): `sampled_per_step` rows of 64 KiB kept at every
  // `sampled_every`-th step, each standing for kWeight bytes (the default interval's weight).
  int sampled_per_step = 0;
  int sampled_every = 1;
  int64_t rank = 0;
};

std::string loop_trace(const test::TempDir& dir, const std::string& name, const LoopShape& l) {
  std::string path = dir.file(name);
  TraceBuilder b(path);
  b.run(l.config, db::RunStatus::Ok, test::step_t0(l.steps) + 500);
  b.rank(l.rank, 1);
  const int64_t cpu = b.device(l.rank, db::DeviceKind::Cpu, "cpu");
  const auto host = db::MemoryKind::PageableHost;
  const auto seg = db::AllocLevel::Segment;
  b.alloc(l.rank, cpu, host, "", 2 * kMiB, 500, std::nullopt, seg);
  for (int s = 0; s < l.steps; ++s) {
    const int64_t t0 = test::step_t0(s);
    if (l.step_markers) {
      const std::optional<int64_t> epoch = l.steps_per_epoch ? std::optional<int64_t>(s / l.steps_per_epoch) : std::nullopt;
      if (l.as_ranges) b.marker(l.rank, db::MarkerKind::Range, "zerotrace::step " + std::to_string(s), t0, t0 + 90, {}, {});
      else b.marker(l.rank, db::MarkerKind::Step, "step " + std::to_string(s), t0, t0 + 90, s, epoch);
    }
    b.alloc(l.rank, cpu, host, "", 8 * kMiB, t0 + 10, t0 + 60, seg);
    if (l.kept_per_step) b.alloc(l.rank, cpu, host, "", l.kept_per_step, t0 + 70, std::nullopt, seg);
    if (s % l.sampled_every == 0)
      for (int i = 0; i < l.sampled_per_step; ++i) b.alloc(l.rank, cpu, host, "", kSmall, t0 + 75, std::nullopt, seg, kWeight);
  }
  if (l.steps_per_epoch)
    for (int e = 0; e * l.steps_per_epoch < l.steps; ++e) {
      const int64_t t0 = test::step_t0(e * l.steps_per_epoch) - 5;
      const int64_t t1 = test::step_t0(std::min(l.steps, (e + 1) * l.steps_per_epoch)) - 8;
      if (l.as_ranges) b.marker(l.rank, db::MarkerKind::Range, "zerotrace::epoch " + std::to_string(e), t0, t1, {}, {});
      else b.marker(l.rank, db::MarkerKind::Epoch, "epoch " + std::to_string(e), t0, t1, {}, e);
    }
  if (l.extra) l.extra(b);
  b.finish();
  return path;
}

// RSS samples every 10 ns from t = 0: `base`, and `per_step` more as each step begins.
void rss_samples(TraceBuilder& b, int steps, int64_t base, int64_t per_step) {
  for (int64_t t = 0; t <= test::step_t0(steps) + 400; t += 10) {
    const int64_t done = t < 1000 ? 0 : std::min<int64_t>((t - 1000) / 100 + 1, steps);  // steps begun
    b.counter(0, 1, "host_rss", t, double(base + done * per_step));
  }
}

}  // namespace

// Without epochs, equal windows of steps: 256 KiB kept each step is 1.25 MiB per window of 5 steps.
// (It was a skip, and the run ended "ok".)
TEST(CheckLeaks, WithoutEpochsWindowsOfStepsAreCompared) {
  test::TempDir dir;
  LoopShape l;
  l.config = "{}";
  l.kept_per_step = 256 << 10;
  Report r = run(loop_trace(dir, "steps.db", l), leaks_only());
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 1u) << format_text(r);
  const std::string& f = c.findings[0];
  EXPECT_TRUE(has(f, "rank 0 cpu pageable host memory: live bytes at window start grew 1.25 MiB per window")) << f;
  EXPECT_TRUE(has(f, "window 0 (steps 0-4): 2.00 MiB, window 1 (steps 5-9): +1.25 MiB")) << f;
  EXPECT_TRUE(has(f, "alive at window 3 start but not at window 1 start")) << f;
  EXPECT_TRUE(has(c.summary, "1 of 1 memories grow across windows")) << c.summary;
  EXPECT_TRUE(has(c.summary, "over 4 windows of 5 steps (the trace has no epochs: windows of its 20 steps)")) << c.summary;

  l.kept_per_step = 0;
  Report clean = run(loop_trace(dir, "clean.db", l), leaks_only());
  EXPECT_EQ(only(clean, "leaks").outcome, Outcome::Pass) << format_text(clean);
  EXPECT_TRUE(has(only(clean, "leaks").summary, "over 4 windows of 5 steps")) << format_text(clean);
}

// Without epochs or steps, equal windows of time between the run's first and last tenth, each by its
// lowest live bytes (the windows are not aligned with the loop: a temporary alive at one window's
// start and not at another's is not a leak).
TEST(CheckLeaks, WithoutStepsWindowsOfTimeAfterTheFirstTenth) {
  test::TempDir dir;
  LoopShape l;
  l.config = "{}";
  l.step_markers = false;
  l.steps = 40;
  l.kept_per_step = 256 << 10;
  Report r = run(loop_trace(dir, "time.db", l), leaks_only());
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  const std::string& f = c.findings.at(0);
  EXPECT_TRUE(has(f, "the lowest live bytes of each window grew")) << f;
  EXPECT_TRUE(has(f, "per window")) << f;
  EXPECT_TRUE(has(f, "alive at window 3's lowest point but not at window 0's lowest point")) << f;
  EXPECT_TRUE(has(c.summary, "over 4 windows of ")) << c.summary;
  EXPECT_TRUE(has(c.summary, " between the run's first and last tenth (the trace has no epochs or steps: windows of time)"))
      << c.summary;

  l.kept_per_step = 0;
  Report clean = run(loop_trace(dir, "clean.db", l), leaks_only());
  EXPECT_EQ(only(clean, "leaks").outcome, Outcome::Pass) << format_text(clean);
  EXPECT_TRUE(has(only(clean, "leaks").summary, "the lowest live bytes of each window do not grow")) << format_text(clean);
}

// Windows of time begin after the process's imports where they outlast the first tenth (a short real job
// imports torch for seconds; torchrun's agent did for half its life): allocations made while Python's import
// machinery runs are start-up, not growth (one in the last quarter of the run, at shutdown, is not). A steady
// leak after them is still found.
TEST(CheckLeaks, WindowsOfTimeBeginAfterTheImports) {
  test::TempDir dir;
  auto trace = [&](const std::string& name, bool leak) {
    const std::string path = dir.file(name);
    std::unique_ptr<db::TraceWriter> w;
    EXPECT_TRUE(db::TraceWriter::create(path, &w).ok());
    w->begin();
    db::RunRow run;
    run.id = 1, run.command_line = "python3 -m torch.distributed.run job.py", run.t_start = 0, run.t_end = 1000;
    run.status = db::RunStatus::Ok, run.exit_code = 0, run.config_json = "{}";
    w->insert(run);
    w->insert(db::RankRow{0, 1, 1, 0, "h", 1});
    w->insert(db::DeviceRow{1, 0, db::DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false});
    w->insert(db::FrameRow{1, 0x7f0000001000, "/lib/x86_64-linux-gnu/libc.so.6", 0x1000, "malloc", std::nullopt});
    w->insert(db::FrameRow{2, 0, "<frozen importlib._bootstrap>", std::nullopt, "_call_with_frames_removed", 241});
    w->insert(db::FrameRow{3, 0, "/w/job.py", std::nullopt, "<module>", 9});
    w->insert(db::StackRow{1, 0, 2});  // an import
    w->insert(db::StackRow{2, 1, 1});
    w->insert(db::StackRow{3, 0, 3});  // the job's own line
    w->insert(db::StackRow{4, 3, 1});
    int64_t id = 0;
    auto alloc = [&](int64_t t, int64_t bytes, int64_t stack, std::optional<int64_t> t_free = std::nullopt) {
      db::AllocationRow a;
      a.id = ++id, a.rank = 0, a.device_id = 1, a.memory_kind = db::MemoryKind::PageableHost;
      a.level = db::AllocLevel::Segment, a.address = 0x10000000 + uint64_t(id) * 0x100000;
      a.bytes = a.requested_bytes = bytes, a.stack_id = stack, a.source = db::Source::HostHook, a.t_alloc = t;
      a.t_free = t_free;
      w->insert(a);
    };
    for (int64_t t : {150, 250, 350}) alloc(t, 4 << 20, 2);  // importing until 350 ns of 1000
    alloc(850, 1 << 20, 2, 860);  // a module imported at shutdown: not start-up
    if (leak)
      for (int64_t t = 400; t < 900; t += 20) alloc(t, 1 << 20, 4);
    EXPECT_TRUE(w->finish().ok());
    return path;
  };
  Report clean = run(trace("imports.db", false), leaks_only());
  const CheckResult& c = only(clean, "leaks");
  EXPECT_EQ(c.outcome, Outcome::Pass) << format_text(clean);  // the 12 MiB imported were a leak before
  EXPECT_TRUE(has(c.summary, "4 windows of 137 ns between the end of its imports (350 ns) and the run's last tenth"))
      << c.summary;
  Report leak = run(trace("leak.db", true), leaks_only());
  const CheckResult& l = only(leak, "leaks");
  ASSERT_EQ(l.outcome, Outcome::Fail) << format_text(leak);
  EXPECT_TRUE(has(l.findings.at(0), "<module> (/w/job.py:9) +")) << l.findings.at(0);
  EXPECT_FALSE(has(l.findings.at(0), "importlib")) << l.findings.at(0);
}

// A trace with nothing to compare: --leaks named cannot run (exit 1, says what it needs); in the
// default set it is a skip.
TEST(CheckLeaks, NothingToCompareCannotRunWhenNamed) {
  test::TempDir dir;
  const std::string path = dir.file("empty.db");
  {
    TraceBuilder b(path);
    b.run("{}");
    b.rank(0, 1);
    b.finish();
  }
  Report r = run(path, leaks_only());
  const CheckResult& c = only(r, "leaks");
  EXPECT_EQ(c.outcome, Outcome::CannotRun) << format_text(r);
  EXPECT_TRUE(has(c.summary, "the trace records no allocations and no RSS; record the program with zt probe")) << c.summary;
  EXPECT_TRUE(r.failed());
  Report all = run(path, Options{});
  EXPECT_EQ(only(all, "leaks").outcome, Outcome::Skip) << format_text(all);
}

// zt probe killed together with its job never derived the steps and epochs from the ranges: zt
// check derives them itself, in memory, says so, and leaves the trace as it was.
TEST(CheckLeaks, StepsAndEpochsAreDerivedFromTheRangesWhenTheProbeCouldNot) {
  test::TempDir dir;
  LoopShape l;
  l.as_ranges = true;
  l.steps = 16;
  l.steps_per_epoch = 4;
  l.kept_per_step = 256 << 10;  // 1 MiB per epoch
  const std::string path = loop_trace(dir, "killed.db", l);
  Report r = run(path, leaks_only());
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  EXPECT_TRUE(has(c.findings.at(0), "live bytes at epoch start grew 1.00 MiB per epoch")) << format_text(r);
  ASSERT_FALSE(c.context.empty()) << format_text(r);
  EXPECT_TRUE(has(c.context.back(), "zt check derived 16 steps (from the zerotrace module), 4 epochs (from the "
                                    "zerotrace module) from its ranges, in memory; `zt db steps " + path))
      << c.context.back();
  Options steps;
  steps.expected_steps = 16;
  EXPECT_EQ(only(run(path, steps), "steps").outcome, Outcome::Pass);
  // Nothing written into the user's trace.
  std::unique_ptr<db::TraceReader> reader;
  ASSERT_TRUE(db::TraceReader::open(path, &reader).ok());
  db::QueryResult q;
  ASSERT_TRUE(reader->query("SELECT count(*) FROM marker WHERE kind IN (0, 2)", &q).ok());
  EXPECT_EQ(q.rows.at(0).at(0), "0");
}

// RSS as a witness on a probed trace: it grows 8 MiB an epoch while the recorded allocations stay
// flat (a leak of allocations under the probe's threshold): a finding with how much. Flat RSS, or
// RSS that the recorded allocations explain, passes; a trace zt probe did not record is not asked.
TEST(CheckLeaks, RssGrowthTheRecordedAllocationsDoNotExplainIsALeak) {
  test::TempDir dir;
  LoopShape l;
  l.steps = 16;
  l.steps_per_epoch = 4;
  l.extra = [](TraceBuilder& b) { rss_samples(b, 16, 300 * kMiB, 2 * kMiB); };
  const std::string leaking = loop_trace(dir, "rss.db", l);
  Report r = run(leaking, leaks_only());
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 1u) << format_text(r);
  const std::string& f = c.findings[0];
  EXPECT_TRUE(has(f, "rank 0 host RSS: RSS at epoch start grew 8.00 MiB per epoch, 8.00 MiB per epoch more than its "
                     "recorded host allocations explain (they grew 0 B per epoch; RSS epoch 0: 300.00 MiB, epoch 1: "
                     "+8.00 MiB"))
      << f;
  EXPECT_TRUE(has(f, "threshold 4.00 MiB per epoch, --rss-threshold")) << f;
  EXPECT_TRUE(has(f, "allocations under zt probe's --host-threshold (1.00 MiB)")) << f;
  EXPECT_TRUE(has(c.summary, "0 of 1 memories grow across epochs")) << c.summary;
  EXPECT_TRUE(has(c.summary, "the RSS of 1 of 1 process grows more than its recorded allocations explain")) << c.summary;
  // A higher threshold lets it pass.
  Options high = leaks_only();
  high.rss_threshold = 16 * kMiB;
  EXPECT_EQ(only(run(leaking, high), "leaks").outcome, Outcome::Pass);

  // The clean twin: RSS drifts 512 KiB an epoch.
  l.extra = [](TraceBuilder& b) { rss_samples(b, 16, 300 * kMiB, 128 << 10); };
  Report clean = run(loop_trace(dir, "clean.db", l), leaks_only());
  EXPECT_EQ(only(clean, "leaks").outcome, Outcome::Pass) << format_text(clean);
  EXPECT_TRUE(has(only(clean, "leaks").summary,
                  "RSS growth the recorded allocations do not explain stays under 4.00 MiB per epoch on 1 process"))
      << format_text(clean);

  // RSS growth that the recorded allocations explain is their finding, not the RSS's.
  l.kept_per_step = 2 * kMiB;
  l.extra = [](TraceBuilder& b) { rss_samples(b, 16, 300 * kMiB, 2 * kMiB); };
  Report recorded = run(loop_trace(dir, "recorded.db", l), leaks_only());
  ASSERT_EQ(only(recorded, "leaks").outcome, Outcome::Fail) << format_text(recorded);
  ASSERT_EQ(only(recorded, "leaks").findings.size(), 1u) << format_text(recorded);
  EXPECT_TRUE(has(only(recorded, "leaks").findings[0], "pageable host memory: live bytes at epoch start grew 8.00 MiB"))
      << format_text(recorded);

  // Sampled less often than the epochs come: one sample for every epoch start, and the report says
  // the RSS was not seen to grow (not that it did not).
  l.kept_per_step = 0;
  l.extra = [](TraceBuilder& b) {
    b.counter(0, 1, "host_rss", 0, double(300 * kMiB));
    b.counter(0, 1, "host_rss", 5000, double(400 * kMiB));
  };
  Report coarse = run(loop_trace(dir, "coarse.db", l), leaks_only());
  EXPECT_EQ(only(coarse, "leaks").outcome, Outcome::Pass) << format_text(coarse);
  EXPECT_FALSE(has(only(coarse, "leaks").summary, "RSS")) << format_text(coarse);
  EXPECT_TRUE(has(format_text(coarse), "rank 0: one RSS sample stands for every compared epoch start")) << format_text(coarse);

  // Not a probed trace (zt train records every buffer it makes): RSS is not compared.
  l.kept_per_step = 0;
  l.config = "{}";
  Report trained = run(loop_trace(dir, "trained.db", l), leaks_only());
  EXPECT_EQ(only(trained, "leaks").outcome, Outcome::Pass) << format_text(trained);
  EXPECT_FALSE(has(only(trained, "leaks").summary, "RSS")) << format_text(trained);
}

// Sampled rows in windows of steps and of time (no epochs): they count for their weight there too,
// and a leak must stand out of their sampling error there too.
TEST(CheckLeaks, SampledRowsFollowTheErrorRuleInWindowsOfStepsAndOfTime) {
  test::TempDir dir;
  LoopShape l;
  l.config = "{}";
  // 2 sampled rows kept each step: 10 a window of 5 steps, ~5.20 MiB; 20 rows between windows 1 and 3.
  l.sampled_per_step = 2;
  Report r = run(loop_trace(dir, "steps.db", l), leaks_only());
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 1u) << format_text(r);
  EXPECT_TRUE(has(c.findings[0], "rank 0 cpu pageable host memory: live bytes at window start grew ~" +
                                     format_bytes(double(10 * kWeight)) + " per window"))
      << c.findings[0];
  EXPECT_TRUE(has(c.findings[0], "(estimated from 20 sampled allocations: ±")) << c.findings[0];
  EXPECT_TRUE(has(c.findings[0], " per window)")) << c.findings[0];

  // One sampled row kept every 5 steps: 2 rows between windows 1 and 3, ~0.52 MiB a window, past
  // the threshold but within 3 standard errors: a pass, and said.
  l.sampled_per_step = 1;
  l.sampled_every = 5;
  Report noise = run(loop_trace(dir, "noise.db", l), leaks_only());
  const CheckResult& n = only(noise, "leaks");
  EXPECT_EQ(n.outcome, Outcome::Pass) << format_text(noise);
  EXPECT_TRUE(has(n.summary, "rank 0 cpu pageable host memory grew ~" + format_bytes(double(kWeight)) +
                                 " per window at window start, within 3 standard errors of its sampled estimate"))
      << n.summary;

  // Windows of time, by their lowest live bytes.
  l.step_markers = false;
  l.steps = 40;
  l.sampled_per_step = 2;
  l.sampled_every = 1;
  Report time = run(loop_trace(dir, "time.db", l), leaks_only());
  const CheckResult& t = only(time, "leaks");
  ASSERT_EQ(t.outcome, Outcome::Fail) << format_text(time);
  EXPECT_TRUE(has(t.findings.at(0), "the lowest live bytes of each window grew ~")) << t.findings.at(0);
  EXPECT_TRUE(has(t.findings.at(0), "sampled allocations: ±")) << t.findings.at(0);
}

// RSS as a witness beside the byte sampler: the sampled rows' estimate explains RSS growth as the
// rows recorded one by one do, and a finding says what it can be when the run sampled.
TEST(CheckLeaks, TheRssWitnessCountsSampledRowsByTheirWeight) {
  test::TempDir dir;
  constexpr const char* kSampledConfig =
      R"({"probe":"libzt_probe.so","host_threshold":1048576,"sample_interval":524288,"rss_interval_ms":100})";
  LoopShape l;
  l.config = kSampledConfig;
  l.steps = 16;
  l.steps_per_epoch = 4;
  // RSS grows 2 MiB a step; 4 sampled rows kept a step stand for ~2.08 MiB: the RSS is explained,
  // and the leak is the sampled rows' finding.
  l.sampled_per_step = 4;
  l.extra = [](TraceBuilder& b) { rss_samples(b, 16, 300 * kMiB, 2 * kMiB); };
  Report r = run(loop_trace(dir, "sampled.db", l), leaks_only());
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  ASSERT_EQ(c.findings.size(), 1u) << format_text(r);
  EXPECT_TRUE(has(c.findings[0], "pageable host memory: live bytes at epoch start grew ~")) << c.findings[0];
  EXPECT_FALSE(has(c.summary, "the RSS of")) << c.summary;

  // Nothing sampled grows, the RSS does: what it can be, when the small allocations were sampled.
  l.sampled_per_step = 0;
  Report rss = run(loop_trace(dir, "rss.db", l), leaks_only());
  const CheckResult& s = only(rss, "leaks");
  ASSERT_EQ(s.outcome, Outcome::Fail) << format_text(rss);
  ASSERT_EQ(s.findings.size(), 1u) << format_text(rss);
  EXPECT_TRUE(has(s.findings[0], "memory a library maps itself, or fragmentation (allocations under zt probe's "
                                 "--host-threshold (1.00 MiB) are counted by their sampled estimate)"))
      << s.findings[0];
}

// A budget on memory the trace does not record was never looked at: named, it cannot run; with a
// finding on the other memory it fails, and says what it could not check.
TEST(CheckBudget, AMemoryTheTraceDoesNotRecordCannotRun) {
  test::TempDir dir;
  const std::string path = dir.file("cpu.db");
  ASSERT_TRUE(test::write_python_leak_trace(path));  // host allocations only
  auto budget = [&](const std::string& text) {
    Options o;
    Budget b;
    EXPECT_TRUE(parse_budget(text, &b).ok());
    o.budget = b;
    return run(path, o);
  };
  Report cuda = budget("cuda=1GiB");
  const CheckResult& c = only(cuda, "budget");
  EXPECT_EQ(c.outcome, Outcome::CannotRun) << format_text(cuda);
  EXPECT_TRUE(has(c.summary, "cannot look: cuda: the trace records no accelerator device")) << c.summary;
  EXPECT_TRUE(has(c.summary, "on a CPU job leave cuda= out")) << c.summary;
  EXPECT_TRUE(cuda.failed());
  Report both = budget("cuda=1GiB,host=1GiB");
  EXPECT_EQ(only(both, "budget").outcome, Outcome::CannotRun) << format_text(both);
  EXPECT_TRUE(has(only(both, "budget").summary, "; within the budget: host: highest")) << format_text(both);
  Report over = budget("cuda=1GiB,host=4MiB");
  EXPECT_EQ(only(over, "budget").outcome, Outcome::Fail) << format_text(over);
  EXPECT_TRUE(has(format_text(over), "not checked: cuda: the trace records no accelerator device")) << format_text(over);
  EXPECT_EQ(only(budget("host=1GiB"), "budget").outcome, Outcome::Pass);
}

// zt probe of a job with forked DataLoader workers leaves the root's trace and one per worker beside it
// ("job.pidPID.db", the same run_id in each run row). `zt check --leaks job.db` compared the root's
// process only and passed (exit 0) while every worker leaked (found 2026-11-29 on the PyTorch tutorial's
// loop with num_workers=2): the pass did not speak for them. It cannot run, and says how to merge them.
TEST(CheckLeaks, ATraceWithItsRunsOtherProcessesBesideItDoesNotPassForThem) {
  test::TempDir dir;
  LoopShape root;
  root.config = R"({"probe":"libzt_probe.so","host_threshold":1048576,"run_id":"4242-abc"})";
  const std::string path = loop_trace(dir, "job.db", root);
  Report alone = run(path, leaks_only());
  ASSERT_EQ(only(alone, "leaks").outcome, Outcome::Pass) << format_text(alone);

  LoopShape worker = root;
  worker.config = R"({"probe":"libzt_probe.so","host_threshold":1048576,"run_id":"4242-abc","forked_from":4242})";
  worker.kept_per_step = 256 << 10;
  loop_trace(dir, "job.pid4251.db", worker);
  LoopShape stranger = root;  // another run's file at a name of this stem: not this run's
  stranger.config = R"({"probe":"libzt_probe.so","run_id":"999-old"})";
  loop_trace(dir, "job.pid17.db", stranger);
  loop_trace(dir, "jobs.pid18.db", worker);  // another stem
  Report named = run(path, leaks_only());
  const CheckResult& c = only(named, "leaks");
  EXPECT_EQ(c.outcome, Outcome::CannotRun) << format_text(named);
  EXPECT_TRUE(named.failed());
  EXPECT_TRUE(has(c.summary, "only this trace's own process was compared: 1 more trace of this run lies beside this one"))
      << c.summary;
  EXPECT_TRUE(has(c.summary, "merge them and check the merged trace: zt db merge " + dir.file("job.merged.db") + " " +
                                 path + " " + dir.file("job.pid4251.db")))
      << c.summary;
  EXPECT_FALSE(has(c.summary, "job.pid17.db")) << c.summary;
  EXPECT_FALSE(has(c.summary, "jobs.pid18.db")) << c.summary;
  ASSERT_FALSE(c.context.empty());
  EXPECT_TRUE(has(c.context[0], "in this trace's own process: live bytes at window start and end do not grow")) << c.context[0];
  // In the default set it is a skip, and says the same.
  Report all = run(path, Options{});
  EXPECT_EQ(only(all, "leaks").outcome, Outcome::Skip) << format_text(all);

  // The worker's own trace, or a merged one, has no other traces of its stem: checked as before.
  Report own = run(dir.file("job.pid4251.db"), leaks_only());
  EXPECT_EQ(only(own, "leaks").outcome, Outcome::Fail) << format_text(own);
  // A root that fails keeps its failure, and says what was not compared.
  LoopShape leaky = root;
  leaky.kept_per_step = 256 << 10;
  const std::string leaky_path = loop_trace(dir, "leaky.db", leaky);
  loop_trace(dir, "leaky.pid4251.db", worker);
  Report failed = run(leaky_path, leaks_only());
  const CheckResult& f = only(failed, "leaks");
  EXPECT_EQ(f.outcome, Outcome::Fail) << format_text(failed);
  ASSERT_FALSE(f.context.empty());
  EXPECT_TRUE(has(f.context.back(), "1 more trace of this run lies beside this one")) << f.context.back();
}

// Windows of time are cut from each process's own life: the summary said "4 windows of 36.76 ms between
// the run's first and last tenth (...)" once per process, eleven times over a DataLoader's workers (found
// 2026-11-29). Said once, with how many processes and the range of the windows' lengths.
TEST(CheckLeaks, WindowsOfTimeOfManyProcessesAreSaidOnce) {
  test::TempDir dir;
  std::vector<std::string> inputs;
  for (int steps : {40, 60, 80}) {
    LoopShape l;
    l.config = "{}";
    l.step_markers = false;
    l.steps = steps;
    l.kept_per_step = steps == 80 ? 256 << 10 : 0;
    l.rank = steps / 20 - 2;  // ranks 0, 1, 2
    inputs.push_back(loop_trace(dir, "p" + std::to_string(steps) + ".db", l));
  }
  const std::string merged = dir.file("merged.db");
  Status m = db::merge_traces(merged, inputs, false);
  ASSERT_TRUE(m.ok()) << m.message();
  Report r = run(merged, leaks_only());
  const CheckResult& c = only(r, "leaks");
  ASSERT_EQ(c.outcome, Outcome::Fail) << format_text(r);
  EXPECT_EQ(c.findings.size(), 1u) << format_text(r);
  EXPECT_TRUE(has(c.summary, "over 4 windows of time in each of 3 processes (")) << c.summary;
  EXPECT_TRUE(has(c.summary, " each), between the first tenth of its run, or the end of its imports, and its last tenth"))
      << c.summary;
  EXPECT_FALSE(has(c.summary, "between the run's first and last tenth")) << c.summary;
}
